"""axolotl's multimodal (vision-language) top-level keys: what `finetune validate` says of each (keys.py adds them to
its KEYS table). Their conversion, read where each key stands in a recipe, is finetune/port/axolotl_vision.py."""

from __future__ import annotations

HINTS = {
    "processor_type": "not needed: finetune loads the model's processor (AutoProcessor) whenever base_model is a "
                      "vision-language model",
    "processor_kwargs": "the processor's pixel bounds are finetune's `image_min_pixels` / `image_max_pixels`; other "
                        "processor settings are the model's own (its saved processor config)",
    "skip_prepare_dataset": "not needed: finetune tokenizes image records with the processor once, caches them, "
                            "and loads each batch's images when it is made",
    "remove_unused_columns": "not needed: finetune's rows keep the images their collator reads",
    "image_size": "finetune keeps each image's aspect and bounds its pixels: `image_max_pixels` (and "
                  "`image_min_pixels`) = width x height",
    "image_resize_algorithm": "finetune scales images with bicubic (PIL) before the processor sees them",
    "freeze_mm_modules": "write `freeze_vision_tower: true` and `freeze_multi_modal_projector: true`",
    "role_boundaries": "finetune finds each turn from the chat template itself (the rendered conversation, the "
                       "image tokens left unsupervised); it takes no boundary strings",
}
BLOCKING = ("role_boundaries",)  # set, always kept for a decision
