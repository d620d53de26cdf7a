"""Batches for a vision-language model: the text batch (finetune/data/collate.py) plus the pixels of its rows' images.

Each row's images are loaded again with the pixel budget they were encoded with, so the processor gives each
image exactly the tokens its row holds (finetune/data/vision/encode.py counted them with the same
processor). Rows without images add none; a batch without any adds no pixel inputs at all. The per-token
modality ids some families read are made from the padded ids: Gemma 3's `token_type_ids` (image tokens attend to
each other both ways), Qwen2-VL's `mm_token_type_ids` (its 3-D rotary positions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from finetune.data.collate import Collator
from finetune.data.vision.images import ImageRejected, load_image
from finetune.errors import DataError

MODALITY_INPUTS = ("token_type_ids", "mm_token_type_ids")  # 1 on an image token, 0 elsewhere


@dataclass
class Pixels:
    """A batch's pixel inputs, made by the processor from each row's image parts (loaded with the pixel budget they
    were encoded with), and the modality ids made from the batch's padded ids."""

    processor: object
    max_pixels: int | None = None
    min_pixels: int | None = None

    def images(self, parts: list[dict]) -> list:
        try:
            return [load_image(part, max_pixels=self.max_pixels, min_pixels=self.min_pixels) for part in parts]
        except ImageRejected as exc:  # it loaded when the rows were made: it changed on disk since
            raise DataError(f"{exc.detail}: the image changed on disk after the data was tokenized (during this run?); "
                            "put it back, or run again: images edited or removed before a run are tokenized again") from None

    def inputs(self, input_ids, rows: list[list[dict]]) -> dict:
        """The model inputs beside the text: `rows` holds each token row's image parts, in the order its image
        tokens come (rows without images add none; a batch without any adds no pixel inputs at all)."""
        import torch

        out = {}
        wanted = set(getattr(self.processor, "model_input_names", ())) & set(MODALITY_INPUTS)
        if wanted:
            types = torch.tensor(self.processor.create_mm_token_type_ids(input_ids.tolist()))
            out.update({name: types for name in wanted})
        images = [self.images(parts) for parts in rows if parts]
        if images:  # through the processor, with its own image settings (Idefics3's tiles, Gemma 3's crops);
            # `padding`: Gemma 3's processor writes a text of its own per row (dropped here), ragged when rows hold
            # different numbers of images
            pixels = self.processor(images=images, return_tensors="pt", padding=True)
            text = {"input_ids", "attention_mask", *MODALITY_INPUTS, *self.processor.tokenizer.model_input_names}
            out.update({k: v for k, v in pixels.items() if k in self.processor.model_input_names and k not in text})
        return out


@dataclass
class VisionCollator:
    text: Collator
    processor: object
    max_pixels: int | None = None
    min_pixels: int | None = None

    def __call__(self, features: list[dict]) -> dict:
        batch = self.text(features)
        rows = [json.loads(feature.get("images") or "[]") for feature in features]
        batch.update(Pixels(self.processor, self.max_pixels, self.min_pixels).inputs(batch["input_ids"], rows))
        return batch
