"""The recipe's training keys: batch sizes, length, learning rate and schedule, optimizer, precision, and
scale-out (DeepSpeed, the collective timeout)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, field_validator

from finetune.recipe.tags import LENGTH, TOKENS, TRAIN, Strict, affects

OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adafactor",
    "sgd",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
)


class TrainingKeys(Strict):
    """One optimizer step and how many of them: batch, schedule, optimizer, precision, processes."""

    micro_batch_size: int = Field(
        1, gt=0, description="Examples per device per forward pass.", json_schema_extra=affects(TRAIN),
    )

    gradient_accumulation_steps: int = Field(
        1, gt=0, description="Micro batches per optimizer step (per process).", json_schema_extra=affects(TRAIN),
    )

    # affects nothing by itself: it derives gradient_accumulation_steps, which is in the fingerprint
    global_batch_size: int | None = Field(
        None,
        gt=0,
        description=(
            "Examples per optimizer step over all processes. If set, it must equal micro_batch_size x "
            "gradient_accumulation_steps x processes; when gradient_accumulation_steps is not set it is derived."
        ),
        json_schema_extra=affects(),
    )

    num_epochs: float = Field(
        1.0, gt=0, description="Passes over the training data (ignored when max_steps is set).",
        json_schema_extra=affects(LENGTH),
    )

    max_steps: int | None = Field(
        None, gt=0, description="Stop after this many optimizer steps.", json_schema_extra=affects(LENGTH),
    )

    learning_rate: Union[float, Literal["auto"]] = Field(
        2e-4,
        description=(
            "Peak learning rate, or `auto`: lr_base x sqrt(supervised tokens per step / lr_pretrained_batch_tokens), "
            "computed from the tokenized data (`finetune lr recipe.yml` shows the working) and recorded in run.json; "
            "with a preference method, the method's published default for a full fine-tune or for adapters "
            "(e.g. DPO 5e-7 / 5e-6; docs/planning.md has the table and sources)."
        ),
        json_schema_extra=affects(TRAIN),
    )

    lr_base: float | None = Field(
        None, gt=0,
        description="For `learning_rate: auto`: the base model's pretraining peak LR. Default: from the model family table.",
        json_schema_extra=affects(TRAIN),
    )

    lr_pretrained_batch_tokens: int | None = Field(
        None, gt=0,
        description="For `learning_rate: auto`: the pretraining global batch in tokens. Default: from the family table.",
        json_schema_extra=affects(TRAIN),
    )

    @field_validator("learning_rate", mode="plain", json_schema_input_type=Union[float, Literal["auto"]])
    @classmethod
    def _positive_or_auto(cls, value):
        # one check with one message (a Union would report a failure per branch)
        if value == "auto":
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("expected a positive number (e.g. 2e-4) or `auto`") from None
        if isinstance(value, bool) or not number > 0:
            raise ValueError("expected a positive number (e.g. 2e-4) or `auto`")
        return number

    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after warmup.", json_schema_extra=affects(TRAIN),
    )

    cosine_min_lr_ratio: float | None = Field(
        None, ge=0.0, lt=1.0, description="Cosine floor as a fraction of learning_rate (e.g. 0.1).",
        json_schema_extra=affects(TRAIN),
    )

    warmup_steps: int | None = Field(
        None, ge=0, description="Linear warmup, in optimizer steps.", json_schema_extra=affects(TRAIN),
    )

    warmup_ratio: float | None = Field(
        None, ge=0.0, lt=1.0, description="Linear warmup, as a fraction of all steps.",
        json_schema_extra=affects(TRAIN),
    )

    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay.", json_schema_extra=affects(TRAIN))

    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam beta1.", json_schema_extra=affects(TRAIN))

    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Adam beta2.", json_schema_extra=affects(TRAIN))

    adam_epsilon: float = Field(1e-8, gt=0.0, description="Adam epsilon.", json_schema_extra=affects(TRAIN))

    max_grad_norm: float = Field(
        1.0, ge=0.0, description="Clip the gradient norm to this (0: no clipping).", json_schema_extra=affects(TRAIN),
    )

    optimizer: Literal[OPTIMIZERS] = Field(  # type: ignore[valid-type]
        "adamw_torch", description="Optimizer.", json_schema_extra=affects(TRAIN)
    )

    seed: int = Field(
        42, description="Seed for weights init, data order, dropout and the val split.",
        json_schema_extra=affects(TRAIN, TOKENS),
    )

    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description=("Training precision. `auto`: bf16 on GPUs with bf16 tensor cores (compute capability "
                             "8.0+), fp16 on older GPUs (T4, V100), fp32 on CPU."),
        json_schema_extra=affects(TRAIN),
    )

    # train: the ZeRO stage decides the checkpoint's layout (a ZeRO-2 checkpoint does not load without it)
    deepspeed: str | None = Field(
        None,
        description=(
            "DeepSpeed ZeRO config: a shipped one by name (`zero1`, `zero2`, `zero3`, `zero2_offload`, "
            "`zero3_offload`) or a path to a JSON file (relative to the recipe). Checked against the recipe when "
            "it is loaded: write \"auto\" for batch sizes, accumulation, clipping, lr and precision."
        ),
        json_schema_extra=affects(TRAIN),
    )

    ddp_timeout: int = Field(
        7200, gt=0,
        description=(
            "Seconds a process waits at a collective (e.g. for the main process to tokenize the data) before the "
            "run fails. Raise it for very large datasets, or run `finetune preprocess` first."
        ),
        json_schema_extra=affects(),
    )
