"""The recipe's vision keys: which of a vision-language model's three parts train, and the pixel budget of an image.

Names and meanings are LLaMA-Factory's, so its recipes read the same here. A vision-language base model (one
transformers loads with AutoModelForImageTextToText: LLaVA, Idefics3 / SmolVLM, Gemma 3, Qwen2-VL...) is three
parts: the vision tower (pixels -> patch features), the multi-modal projector (patch features -> the language
model's embedding width) and the language model. These keys are read only when base_model is such a model.
"""

from __future__ import annotations

from pydantic import Field

from finetune.recipe.tags import TOKENS, TRAIN, Strict, affects


class VisionKeys(Strict):
    """Vision-language models: what trains, and how many pixels (so how many image tokens) an image becomes."""

    freeze_vision_tower: bool = Field(
        True,
        description=("Keep the vision tower's weights as they are (full fine-tune: no gradients; LoRA: no adapters "
                     "on it). `false` trains it too: its linear layers join `all-linear`."),
        json_schema_extra=affects(TRAIN),
    )

    freeze_multi_modal_projector: bool = Field(
        False,
        description=("Keep the projector (vision features -> the language model's embeddings) as it is. Default: it "
                     "trains (full fine-tune: its weights; LoRA: adapters on its linear layers)."),
        json_schema_extra=affects(TRAIN),
    )

    freeze_language_model: bool = Field(
        False,
        description="Keep the language model as it is and train only the unfrozen vision parts.",
        json_schema_extra=affects(TRAIN),
    )

    # tokens: the pixels an image keeps decide how many image tokens it becomes (families with dynamic resolution)
    image_max_pixels: int = Field(
        768 * 768, gt=0,
        description=("Largest image, in pixels (width x height): a bigger one is scaled down keeping its aspect "
                     "before the processor sees it. Bounds the image tokens of dynamic-resolution families (Qwen2-VL: "
                     "one token per 28x28 pixels, so 768*768 is at most ~750 tokens an image)."),
        json_schema_extra=affects(TOKENS, TRAIN),
    )

    image_min_pixels: int | None = Field(
        None, gt=0,
        description="Smallest image, in pixels: a smaller one is scaled up keeping its aspect. Default: as it is.",
        json_schema_extra=affects(TOKENS, TRAIN),
    )
