"""A preference pair's prompt with images, tokenized through the model's processor: the pair renderer's
tokenization (finetune/data/preference/pairs.py) for a vision-language model.

A pair's images are its prompt's (ingestion refuses an image in an answer: finetune/ingest/preference.py). The
prompt alone (with the generation prompt) and the prompt followed by each response are expanded by the processor
in one call, each text with the prompt's images, so each image becomes the family's image tokens exactly as the
model will see it; the renderer then checks, as for text, that the prompt's tokens are the first tokens of each
whole, and the response is everything after them. An image token is therefore only ever in a prompt, where no
label is: every supervised token of a pair is text. What the processor cannot expand (placeholders that differ
in number from the images, a response holding an image placeholder or image token) is an ImageRejected with a
counted-reject reason, never a crash mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from finetune.data.vision.encode import vision_labels
from finetune.data.vision.images import ImageRejected, load_image


@dataclass
class PairImages:
    """Tokenizes a prompt and its wholes with the processor and the recipe's pixel budget."""

    processor: object
    max_pixels: int | None = None
    min_pixels: int | None = None

    def __call__(self, texts: list[str], parts: list[dict]) -> tuple[list[list[int]], int]:
        """(token ids of each text, image tokens of the first: the prompt). Every text holds the prompt, so each is
        given its images. Raises ImageRejected."""
        images = [load_image(p, max_pixels=self.max_pixels, min_pixels=self.min_pixels) for p in parts]
        try:
            enc = self.processor(text=texts, images=[images] * len(texts) if images else None,
                                 add_special_tokens=False, return_offsets_mapping=True,
                                 return_text_replacement_offsets=True)
        except ValueError as exc:  # placeholders that differ in number from the images (one may be in an answer)
            raise ImageRejected("image_placeholder_mismatch", str(exc).splitlines()[0][:300]) from None
        ids = [list(row) for row in enc["input_ids"]]
        starts = np.fromiter((s for s, _ in enc["offset_mapping"][0]), dtype=np.int64, count=len(ids[0]))
        replacements = (enc.get("text_replacement_offsets") or [[]])[0]
        _, image_tokens = vision_labels(ids[0], starts, [], replacements, self.processor.image_token_ids, True)
        image_ids = {i for i in self.processor.image_token_ids if i is not None}
        for whole in ids[1:]:
            if image_ids.intersection(whole[len(ids[0]):]):
                raise ImageRejected("image_token_in_answer", "a response holds the model's image token: an answer is "
                                    "text, and an image token there would have no image to stand for")
        return ids, image_tokens
