"""The recipe's adapter keys: a full fine-tune, LoRA, or QLoRA (LoRA on a 4-bit base), and the quantized base."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field

from finetune.recipe.tags import TRAIN, Strict, affects


class AdapterKeys(Strict):
    """What is trained: every weight, or low-rank adapters on a frozen (optionally quantized) base."""

    adapter: Literal["none", "lora", "qlora"] = Field(
        "none",
        description="`none`: full fine-tune. `lora`: train low-rank adapters. `qlora`: LoRA on a 4-bit base.",
        json_schema_extra=affects(TRAIN),
    )

    load_in_8bit: bool = Field(
        False, description="Load the frozen base in 8-bit (bitsandbytes); needs an adapter.",
        json_schema_extra=affects(TRAIN),
    )

    load_in_4bit: bool = Field(
        False, description="Load the frozen base in 4-bit NF4 (bitsandbytes); `adapter: qlora` implies it.",
        json_schema_extra=affects(TRAIN),
    )

    lora_r: int = Field(
        8, gt=0, description="LoRA rank: the inner dimension of each adapter.", json_schema_extra=affects(TRAIN),
    )

    lora_alpha: int = Field(
        16, gt=0, description="LoRA scaling numerator: the update is scaled by alpha / r.",
        json_schema_extra=affects(TRAIN),
    )

    lora_dropout: float = Field(
        0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input.", json_schema_extra=affects(TRAIN),
    )

    lora_target_modules: Union[Literal["all-linear"], list[str]] = Field(
        "all-linear",
        description="Module names (or suffixes) to adapt, e.g. [q_proj, v_proj], or `all-linear`.",
        json_schema_extra=affects(TRAIN),
    )

    lora_modules_to_save: list[str] | None = Field(
        None, description="Modules trained in full and saved with the adapter, e.g. [embed_tokens, lm_head].",
        json_schema_extra=affects(TRAIN),
    )
