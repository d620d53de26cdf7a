"""Chat records with images -> Examples, through the model's processor: the one encoder's rule, with image tokens.

The conversation is rendered by the chat template and its assistant spans are located exactly as for text
(finetune/data/formats.py: assistant_spans). The processor then expands each image placeholder into the family's
image tokens (N copies of the image token, and the boundaries around them: Idefics3's <fake_token_around_image>,
Qwen2-VL's <|vision_start|>, Gemma 3's <start_of_image>) and tokenizes the expanded text once, with offsets;
transformers says where each placeholder went (return_text_replacement_offsets). Each assistant span is moved by
the characters the expansions before it added, and a token is supervised when its first character lies inside a
moved span and outside every expansion: image tokens, their boundaries and padding never carry a loss, for every
family and template. The image tokens of a row are counted here, before training (finetune/data/vision/lengths.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from finetune.contract import IGNORE_INDEX
from finetune.data.formats import Example, assistant_spans
from finetune.data.vision.images import ImageRejected, image_parts, load_image


class Rejected(NamedTuple):
    """A record the encoder could not turn into an Example: `reason` is the counted-reject key."""

    reason: str
    detail: str


def parts_messages(messages: list[dict]) -> list[dict]:
    """Every message's content as a list of typed parts: the shape every vision-language chat template reads
    (some iterate the content and would render a plain string character by character)."""
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
            for m in messages]


def _moved(position: int, replacements: list[dict]) -> int:
    """A character position of the rendered text, in the expanded text."""
    return position + sum((r["new_span"][1] - r["new_span"][0]) - (r["span"][1] - r["span"][0])
                          for r in replacements if r["span"][1] <= position)


def vision_labels(ids: list[int], starts: np.ndarray, spans: list[tuple[int, int]], replacements: list[dict],
                  image_ids: list[int], train_on_inputs: bool) -> tuple[list[int], int]:
    """(labels, image tokens): supervised inside the moved assistant spans (everything with train_on_inputs),
    never inside an image's expansion nor on an image token id."""
    ids_array = np.asarray(ids, dtype=np.int64)
    keep = np.ones(len(ids), dtype=bool)
    if not train_on_inputs:
        keep[:] = False
        for lo, hi in spans:
            lo, hi = _moved(lo, replacements), _moved(hi, replacements)
            keep |= (starts >= lo) & (starts < hi)
    image = np.isin(ids_array, [i for i in image_ids if i is not None])
    for r in replacements:
        image |= (starts >= r["new_span"][0]) & (starts < r["new_span"][1])
    return np.where(keep & ~image, ids_array, IGNORE_INDEX).tolist(), int(image.sum())


@dataclass
class ImageEncoder:
    """Encodes chat records for a vision-language model: the processor and the recipe's pixel budget."""

    processor: object
    max_pixels: int | None = None
    min_pixels: int | None = None
    roles: tuple[str, ...] = ("assistant",)  # the turns supervised (the recipe's roles_to_train)

    def images(self, parts: list[dict]) -> list:
        return [load_image(p, max_pixels=self.max_pixels, min_pixels=self.min_pixels) for p in parts]

    def encode(self, record: dict, train_on_inputs: bool) -> Example | Rejected:
        parts = image_parts(record)
        try:
            images = self.images(parts)
        except ImageRejected as exc:
            return Rejected(exc.reason, exc.detail)
        text, spans = assistant_spans(self.processor.tokenizer, parts_messages(record["messages"]), self.roles)
        try:
            enc = self.processor(text=[text], images=images or None, add_special_tokens=False,
                                 return_offsets_mapping=True, return_text_replacement_offsets=True)
        except ValueError as exc:  # e.g. placeholders in the rendered text that differ in number from the images
            return Rejected("image_placeholder_mismatch", str(exc).splitlines()[0][:300])
        ids = list(enc["input_ids"][0])
        starts = np.fromiter((s for s, _ in enc["offset_mapping"][0]), dtype=np.int64, count=len(ids))
        replacements = (enc.get("text_replacement_offsets") or [[]])[0]
        labels, image_tokens = vision_labels(ids, starts, spans, replacements, self.processor.image_token_ids,
                                             train_on_inputs)
        return Example(ids, labels, images=parts, image_tokens=image_tokens)

    def __call__(self, tokenizer, records: list[dict], train_on_inputs: bool) -> list[Example | Rejected]:
        """encode_chats' signature; the processor holds the tokenizer."""
        return [self.encode(r, train_on_inputs) for r in records]
