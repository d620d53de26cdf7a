"""Images in the data stage: a chat record's image parts become image tokens in its row (encode.py), pixels in its
batch (collate.py); images.py decodes one image (ingestion checked it at read time: finetune/ingest/images.py).
What the data stage asks of them is here: which encoder a recipe's chats take, the counted rejects, the cache
key's share, the method a vision-language model does not train (GRPO). A preference pair's images are its prompt's
(pairs.py: the prompt and its responses expanded by the processor).

A vision-language model's rows carry an `images` column (each row's image parts, JSON); its stats count image
tokens apart from supervised ones, and `dropped_images` counts the records left out, by reason.
"""

from __future__ import annotations

from collections import Counter

from finetune.errors import DataError

IMAGE_REJECT = "image:"  # the outcome key of a record left out because of its images: IMAGE_REJECT + reason


def chat_encoder(recipe, processor):
    """What encodes the recipe's chats, supervising the turns of roles_to_train: the tokenizer (encode_chats), or a
    vision-language model's processor (an ImageEncoder)."""
    roles = tuple(recipe.roles_to_train)
    if processor is None:
        import functools

        from finetune.data.encode import encode_chats

        return functools.partial(encode_chats, roles=roles)
    from finetune.data.vision.encode import ImageEncoder

    return ImageEncoder(processor, recipe.image_max_pixels, recipe.image_min_pixels, roles)


def image_rejects(outcome: Counter) -> dict:
    return {key[len(IMAGE_REJECT):]: n for key, n in sorted(outcome.items()) if key.startswith(IMAGE_REJECT)}


def rejects_line(outcome: Counter) -> str:
    """', 3 left out for their images (missing_image: 2, too_long_with_images: 1)', or '' when none were."""
    rejects = image_rejects(outcome)
    if not rejects:
        return ""
    why = ", ".join(f"{reason}: {n}" for reason, n in rejects.items())
    return f", {sum(rejects.values())} left out for their images ({why})"


def image_stats(outcome: Counter, vision: bool) -> dict:
    """The stats' `dropped_images`: records left out because of their images, by reason (when there are any, or
    the model sees images)."""
    rejects = image_rejects(outcome)
    return {"dropped_images": rejects} if rejects or vision else {}


def processor_fingerprint(processor) -> str:
    """What of a processor changes the rows: its image settings and image token (''  for a text model)."""
    if processor is None:
        return ""
    import hashlib

    image_processor = getattr(processor, "image_processor", None)
    settings = image_processor.to_json_string() if image_processor is not None else ""
    blob = f"{type(processor).__name__}:{getattr(processor, 'image_token', None)}:{settings}"
    return hashlib.sha256(blob.encode()).hexdigest()


def image_files(dataset_dict) -> dict:
    """{"image_files": the stamp of every image file its rows name} for the cache's stats, or {} without images."""
    from finetune.data.vision.images import image_files_stamp

    splits = [split for split in dataset_dict.values() if "images" in split.column_names]
    return {"image_files": image_files_stamp(row for split in splits for row in split["images"])} if splits else {}


def images_changed(dataset_dict, stats: dict) -> bool:
    """Whether an image file cached rows were tokenized from was edited or removed since (their image tokens may no
    longer be the image's): the rows are tokenized again, as are rows with images cached without the stamp."""
    return image_files(dataset_dict).get("image_files") != stats.get("image_files")


def check_vision_method(recipe, processor) -> None:
    """What a vision-language model does not train yet, refused before any tokenizing."""
    if processor is not None and recipe.method == "reward":
        raise DataError("`method: reward` with a vision-language base model is not supported: a reward model is the "
                        "base's sequence-classification class, which finetune builds for text models only; train the "
                        "reward model on a text base (its pairs without images)")
    if processor is not None and recipe.method == "grpo":
        raise DataError("`method: grpo` with a vision-language base model is not supported: its rollouts would "
                        "generate from image prompts, and the generation and scoring rows carry no pixels. A "
                        "vision-language model trains with `method: sft` on chat records, and with `method: dpo` "
                        "(or ipo, orpo, simpo, kto) on preference records whose prompts hold the images "
                        "(docs/vision.md)")
