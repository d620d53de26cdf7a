"""A vision-language model's prompt: a conversation with image parts -> the model's inputs, as training encoded it.

The chat template renders the conversation (each image part as the processor's placeholder: the same rendering
the data stage supervises, finetune/data/vision/encode.py), each image is loaded with the run's pixel budget
(image_max_pixels / image_min_pixels), and the processor expands the placeholders into the family's image tokens
and makes the pixels. `finetune chat` / `generate --image` and `finetune eval`'s generations go through here.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.errors import FinetuneError


def is_processor(obj) -> bool:
    """Whether `obj` is a vision-language processor (it holds an image processor and a tokenizer)."""
    return getattr(obj, "image_processor", None) is not None and getattr(obj, "tokenizer", None) is not None


def pixel_budget(recipe) -> tuple[int | None, int | None]:
    """(image_max_pixels, image_min_pixels) the run trained with: the Recipe's, or the dict run.json records."""
    if recipe is None:
        from finetune.recipe.vision import VisionKeys

        recipe = VisionKeys()
    get = recipe.get if isinstance(recipe, dict) else lambda key: getattr(recipe, key, None)
    return get("image_max_pixels"), get("image_min_pixels")


def run_pixel_budget(trained) -> tuple[int | None, int | None]:
    """The pixel budget of a trained run (finetune/model/trained.py: Trained): its recipe's, else its run.json's."""
    if trained.recipe is not None:
        return pixel_budget(trained.recipe)
    try:
        recorded = json.loads((Path(trained.folder) / "run.json").read_text(encoding="utf-8")).get("recipe")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return pixel_budget(recorded if isinstance(recorded, dict) else None)


def image_part(path: str) -> dict:
    """A canonical image part for an image file given on the command line; FinetuneError when it is not one."""
    from finetune.ingest.images import ImageRejected, check_image

    part = {"type": "image", "path": str(Path(path).expanduser().resolve())}
    try:
        check_image(part)
    except ImageRejected as exc:
        raise FinetuneError(f"--image `{path}`: {exc.reason.replace('_', ' ')} ({exc.detail})") from None
    return part


def with_images(text: str, images: list[dict]) -> str | list[dict]:
    """A user message's content: the text, after the images (as the records put them) when there are any."""
    return [*images, {"type": "text", "text": text}] if images else text


def prompt_inputs(processor, messages: list[dict], max_pixels: int | None = None,
                  min_pixels: int | None = None) -> tuple[list[int], dict]:
    """(the prompt's token ids, the other model inputs: pixels and the family's extras), ending where the
    assistant's reply starts."""
    from finetune.data.vision.encode import parts_messages
    from finetune.data.vision.images import ImageRejected, load_image

    parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p.get("type") == "image"]
    try:
        images = [load_image(p, max_pixels=max_pixels, min_pixels=min_pixels) for p in parts]
    except ImageRejected as exc:
        raise FinetuneError(f"an image of the prompt cannot be used: {exc.reason.replace('_', ' ')} "
                            f"({exc.detail})") from None
    text = processor.tokenizer.apply_chat_template(parts_messages(messages), tokenize=False,
                                                   add_generation_prompt=True)
    encoded = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    return ids, {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask")}
