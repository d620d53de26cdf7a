"""axolotl keys and values with their finetune equivalent, or why none is needed (pure data + small functions).

Checked against axolotl's schema (src/axolotl/utils/schemas/*.py) and its examples/ at commit 067b021
(2026-07). Keys whose name and meaning are the same in both (base_model, adapter, lora_r, sequence_len,
micro_batch_size, learning_rate, special_tokens...) are not listed: they port as they are.

Used twice: `finetune validate` names the equivalent of an axolotl key it does not know (hints.py, read by
recipe/load.py), and `finetune port` converts a whole axolotl recipe (finetune/port/convert.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from finetune.recipe.axolotl.preference import known as known_preference_type
from finetune.recipe.axolotl.unhonoured import UNHONOURED
from finetune.recipe.axolotl.vision import BLOCKING as VISION_BLOCKING, HINTS as VISION_HINTS

Settings = dict[str, Any]


@dataclass(frozen=True)
class AxolotlKey:
    """One axolotl key. `hint`: what to write in finetune, or "not needed: why" / "not in finetune: what instead".
    `convert(value, config)`: the finetune settings it becomes ({} when dropped); None: always dropped."""

    hint: str
    convert: Callable[[Any, dict], Settings] | None = field(default=None, compare=False)
    # set, it changes what is trained and finetune cannot honour it: `finetune port` keeps it as written for the
    # user to decide (the recipe does not load until then) and exits 1
    blocks: bool = False


def _precision_bf16(value, config) -> Settings:
    if value == "auto":
        return {"precision": "auto"}
    if value is True:
        return {"precision": "bf16"}
    return {} if config.get("fp16") or config.get("float16") else {"precision": "fp32"}


def _when_true(settings: Settings) -> Callable[[Any, dict], Settings]:
    return lambda value, config: dict(settings) if value is True else {}


def _resume(value, config) -> Settings:
    return {"resume": value} if value else {}


_NO_TYPES = "not needed: transformers' Auto classes read the model's config.json and tokenizer_config.json"
_FSDP = ("write FSDP2's settings under `fsdp:` (offload_params, reshard_after_forward, state_dict_type, "
         "transformer_layer_cls_to_wrap; docs/distributed.md); `finetune port` converts axolotl's FSDP1 and FSDP2 keys")
_KERNEL = ("not needed: axolotl's fused Triton LoRA kernels are a speed option with the same math; finetune uses "
           "peft's LoRA layers")
_WANDB_ENV = "not in finetune: wandb reads it from the environment (WANDB_ENTITY, WANDB_NAME, WANDB_WATCH, " \
             "WANDB_LOG_MODEL, WANDB_RUN_ID, WANDB_MODE)"
_NO_HUB = ("not in finetune: it never uploads; push output_dir yourself (`hf upload REPO output_dir`)")
_ATTN = "write `attn_implementation: {}`"
_MOE_KERNEL = ("not needed: a faster kernel for the mixture-of-experts layers, same math; finetune runs transformers' "
               "own experts implementation (grouped matmuls on a GPU)")

KEYS: dict[str, AxolotlKey] = {
    # --- precision ---
    "bf16": AxolotlKey("write `precision: bf16` (`bf16: auto` is `precision: auto`: bf16 where the GPU has it, "
                       "fp16 on older GPUs, fp32 on CPU)", _precision_bf16),
    "fp16": AxolotlKey("write `precision: fp16`", _when_true({"precision": "fp16"})),
    "bfloat16": AxolotlKey("write `precision: bf16`", _when_true({"precision": "bf16"})),
    "float16": AxolotlKey("write `precision: fp16`", _when_true({"precision": "fp16"})),
    "float32": AxolotlKey("write `precision: fp32`", _when_true({"precision": "fp32"})),
    "tf32": AxolotlKey("not in finetune: TF32 matmuls stay at PyTorch's default (off); it only speeds up fp32 "
                       "math on Ampere and newer, and with `precision: bf16`/`auto` the matmuls run in 16 bits anyway"),
    # --- attention (axolotl's legacy boolean flags; `attn_implementation` is the same key in both) ---
    "flash_attention": AxolotlKey(_ATTN.format("flash_attention_2"), _when_true({"attn_implementation": "flash_attention_2"})),
    "sdp_attention": AxolotlKey(_ATTN.format("sdpa"), _when_true({"attn_implementation": "sdpa"})),
    "eager_attention": AxolotlKey(_ATTN.format("eager"), _when_true({"attn_implementation": "eager"})),
    "xformers_attention": AxolotlKey("not in finetune: xformers is not used; `attn_implementation: sdpa` (or "
                                     "`auto`) is the memory-efficient kernel"),
    "flex_attention": AxolotlKey(_ATTN.format("flex_attention") + " (CUDA only; `auto` already picks it for "
                                 "packed rows on a GPU without flash-attn)",
                                 _when_true({"attn_implementation": "flex_attention"})),
    "sage_attention": AxolotlKey("not in finetune: use `attn_implementation: sdpa` or `flash_attention_2`"),
    "flash_attn_cross_entropy": AxolotlKey(_KERNEL.replace("LoRA kernels", "cross-entropy kernel")),
    "flash_attn_rms_norm": AxolotlKey(_KERNEL.replace("LoRA kernels", "RMSNorm kernel")),
    "flash_attn_fuse_qkv": AxolotlKey("not needed: a fused-QKV speed patch; finetune does not patch models"),
    "flash_attn_fuse_mlp": AxolotlKey("not needed: a fused-MLP speed patch; finetune does not patch models"),
    # --- LoRA ---
    "lora_target_linear": AxolotlKey("write `lora_target_modules: all-linear` (every Linear but the output layer)",
                                     _when_true({"lora_target_modules": "all-linear"})),
    "lora_model_dir": AxolotlKey("not in finetune: it starts new adapters; to continue a finetune run use "
                                 "`resume:` (its output_dir or a checkpoint path)"),
    "lora_mlp_kernel": AxolotlKey(_KERNEL),
    "lora_qkv_kernel": AxolotlKey(_KERNEL),
    "lora_o_kernel": AxolotlKey(_KERNEL),
    "lora_fan_in_fan_out": AxolotlKey("not needed: peft detects Conv1D layers (GPT-2 style) itself"),
    # peft_use_dora, peft_use_rslora, peft_init_lora_weights, loraplus_lr_ratio, loraplus_lr_embedding: same name,
    # same meaning (recipe/adapter.py; docs/lora.md)
    "lora_on_cpu": AxolotlKey("not in finetune"),
    # --- mixture-of-experts (lora_target_parameters: same name, same meaning; docs/moe.md) ---
    "use_scattermoe": AxolotlKey(_MOE_KERNEL),
    "use_sonicmoe": AxolotlKey(_MOE_KERNEL),
    "experts_implementation": AxolotlKey(_MOE_KERNEL),
    "expert_parallel_size": AxolotlKey("not in finetune: expert parallelism; every process holds every expert "
                                       "(DeepSpeed ZeRO-3 shards them, each MoE block gathered whole)"),
    "quantize_moe_experts": AxolotlKey("not in finetune: under `adapter: qlora` the fused 3-D expert weights stay "
                                       "in bf16 (bitsandbytes quantizes Linear layers only)"),
    # --- model and tokenizer loading ---
    "model_type": AxolotlKey(_NO_TYPES),
    "tokenizer_type": AxolotlKey(_NO_TYPES),
    "base_model_config": AxolotlKey("not needed: the config is read from base_model"),
    "tokenizer_use_fast": AxolotlKey("not needed: the fast tokenizer is always used"),
    "tokenizer_legacy": AxolotlKey("not needed: the tokenizer's own setting is used"),
    "is_llama_derived_model": AxolotlKey("not needed: the architecture comes from config.json"),
    "is_mistral_derived_model": AxolotlKey("not needed: the architecture comes from config.json"),
    "is_qwen_derived_model": AxolotlKey("not needed: the architecture comes from config.json"),
    "is_falcon_derived_model": AxolotlKey("not needed: the architecture comes from config.json"),
    "gptq": AxolotlKey("not in finetune: GPTQ bases are not supported; use `adapter: qlora` (4-bit NF4)"),
    "strict": AxolotlKey("not needed: finetune is always strict: an unknown key is an error"),
    # --- precision of the run / memory ---
    "gradient_checkpointing_kwargs": AxolotlKey("not needed: finetune always checkpoints non-reentrantly "
                                                "(use_reentrant: false)"),
    "pad_to_sequence_len": AxolotlKey("not needed: batches are padded to their longest example, or packed "
                                      "(`sample_packing`)"),
    "sample_packing_eff_est": AxolotlKey("not needed: finetune counts packed rows exactly"),
    "total_num_tokens": AxolotlKey("not needed: finetune counts tokens from the data"),
    # --- schedule, evaluation, checkpoints ---
    "evals_per_epoch": AxolotlKey("not in finetune as such: it evaluates at the end of each epoch (the same as 1); "
                                  "for more, set `eval_steps` to steps per epoch / N (`finetune plan recipe.yml` "
                                  "prints steps per epoch)"),
    "saves_per_epoch": AxolotlKey("not in finetune as such: it checkpoints at the end of each epoch (the same as "
                                  "1); for more, set `checkpoint_interval` to steps per epoch / N"),
    "save_strategy": AxolotlKey("not needed: `checkpoint_interval` (steps) or the default (each epoch) decides"),
    "eval_strategy": AxolotlKey("not needed: `eval_steps` (steps) or the default (each epoch) decides"),
    "save_first_step": AxolotlKey("not in finetune"),
    "resume_from_checkpoint": AxolotlKey("write `resume: PATH` (finetune's default `resume: auto` already continues "
                                         "from the newest checkpoint in output_dir)", _resume),
    "auto_resume_from_checkpoints": AxolotlKey("not needed: `resume: auto` is finetune's default"),
    "early_stopping_patience": AxolotlKey("not in finetune's recipe: the library has "
                                          "finetune.train.callbacks.stages.EarlyStopOnEvalRise(patience)"),
    "loss_watchdog_threshold": AxolotlKey("not in finetune as such: `loss_spike_factor` warns when a logged loss "
                                          "jumps above N x the recent median, `on_nonfinite` stops on NaN/inf"),
    "loss_watchdog_patience": AxolotlKey("not in finetune as such: see `loss_spike_factor` and `on_nonfinite`"),
    "lr_quadratic_warmup": AxolotlKey("not in finetune: warmup is linear"),
    "eval_batch_size": AxolotlKey("not needed: evaluation uses micro_batch_size"),
    "eval_table_size": AxolotlKey("not in finetune: `finetune generate` samples from the trained model"),
    "eval_max_new_tokens": AxolotlKey("not in finetune: `finetune generate` samples from the trained model"),
    # --- scale out ---
    "fsdp_config": AxolotlKey(_FSDP),
    "fsdp_version": AxolotlKey(_FSDP),
    "fsdp_final_state_dict_type": AxolotlKey(_FSDP),
    "local_rank": AxolotlKey("not needed: accelerate sets the process rank"),
    # --- logging and upload ---
    "wandb_entity": AxolotlKey(_WANDB_ENV),
    "wandb_watch": AxolotlKey(_WANDB_ENV),
    "wandb_name": AxolotlKey(_WANDB_ENV),
    "wandb_run_id": AxolotlKey(_WANDB_ENV),
    "wandb_log_model": AxolotlKey(_WANDB_ENV),
    "wandb_mode": AxolotlKey(_WANDB_ENV),
    "use_tensorboard": AxolotlKey("not needed: `report_to: [tensorboard]` is finetune's default"),
    "hub_model_id": AxolotlKey(_NO_HUB),
    "hub_strategy": AxolotlKey(_NO_HUB),
    "push_dataset_to_hub": AxolotlKey(_NO_HUB),
    "hf_use_auth_token": AxolotlKey("not needed: huggingface_hub reads HF_TOKEN or the saved login"),
    "debug": AxolotlKey("not in finetune: `finetune preprocess` prints the counts, `finetune validate` the recipe"),
    "dataset_shard_num": AxolotlKey("not in finetune: shard the JSONL file yourself"),
    "dataset_shard_idx": AxolotlKey("not in finetune: shard the JSONL file yourself"),
    "shuffle_merged_datasets": AxolotlKey("not needed: the training split is shuffled each epoch by `seed`"),
    "test_datasets": AxolotlKey("not in finetune: the eval split comes from `val_set_size`"),
    "default_system_message": AxolotlKey("not in finetune: put the system turn in the records' messages"),
    # --- what is trained ---
    "unfrozen_parameters": AxolotlKey(
        "finetune trains every weight (`adapter: none`) or the adapter, not the parameters that match a list; delete "
        "the line to train every weight (or use `adapter: lora`), or keep training this recipe with axolotl",
        blocks=True),
    "eot_tokens": AxolotlKey(
        "finetune supervises the end-of-turn token that the chat template writes after each assistant turn and "
        "cannot take another list; delete the line if the template's token is the one listed (`finetune preprocess "
        "recipe.yml --show 1` marks it), or keep training this recipe with axolotl", blocks=True),
    "train_on_eot": AxolotlKey(
        "finetune supervises the end-of-turn token of every assistant turn (axolotl's `turn`); delete the line "
        "for that, or keep training this recipe with axolotl", blocks=True),
    "streaming": AxolotlKey("not needed: finetune tokenizes the dataset once and caches it, reading the records a "
                            "batch at a time"),
    "torch_compile": AxolotlKey("write `compile: true` (each decoder layer is compiled; `compile: auto`, the "
                                "default, is on with CUDA)", _when_true({"compile": True})),
}


def _unhonoured(what: str) -> AxolotlKey:
    """A key that changes what is trained and that finetune has no equivalent for: kept for the user's decision."""
    return AxolotlKey(f"{what}; finetune has no equivalent: delete the line (`--set KEY=null` when porting) to "
                      "train without it, or keep training this recipe with axolotl", blocks=True)


# Kept for a decision (unhonoured.py); a key another table above already describes keeps that
# description.
for _key, _what in UNHONOURED.items():
    KEYS.setdefault(_key, _unhonoured(_what))
KEYS.setdefault("mean_resizing_embeddings", AxolotlKey("not needed: finetune always starts new token rows at the "
                                                       "mean of the others"))

# Whole-recipe kinds finetune does not train: porting would produce a recipe that trains something else.
UNPORTABLE = {
    "process_reward_model": "finetune leaves process reward models out (TRL moved its PRMTrainer to the experimental "
                            "package); outcome reward models are `method: reward` (axolotl's `reward_model: true`, "
                            "docs/reward-models.md)",
    "pretraining_dataset": "finetune has no streaming pretraining datasets; use `datasets:` with `type: completion`",
}

# --- GRPO: axolotl's top-level keys of `rl: grpo` recipes (its `trl:` keys: port/grpo.py) --------------------------

IN_PROCESS = ("not needed: finetune generates with the model as it trains, in the training process, so there is no "
              "vLLM server to start, configure or sync weights to")
GRPO_HINTS = {
    "vllm": IN_PROCESS,
    "skip_prepare_dataset": "not needed: finetune tokenizes the prompt records once and caches them",
    "batch_flattening": "not needed: finetune scores each prompt's completions packed in rows already",
}

# --- multimodal (vision-language) keys: their hints are vision.py, their conversion finetune/port/axolotl_vision.py ---
for _key, _hint in VISION_HINTS.items():
    if _key not in GRPO_HINTS:  # skip_prepare_dataset: GRPO's hint says it for prompts
        KEYS.setdefault(_key, AxolotlKey(_hint, blocks=_key in VISION_BLOCKING))

# --- inside a `datasets:` entry ---------------------------------------------------------------------------------

_ALPACA_PROMPT = "not in finetune: `type: instruction` renders the alpaca prompt as it is"

DATASET_KEYS: dict[str, AxolotlKey] = {
    "ds_type": AxolotlKey("not needed: `datasets` reads the files by their extension (JSONL, JSON, parquet, arrow)"),
    "trust_remote_code": AxolotlKey("not in finetune: hub datasets are read from their data files (parquet, JSON, "
                                    "arrow), never by running a loading script"),
    "shards": AxolotlKey("not in finetune: shard the file yourself"),
    "field_system": AxolotlKey("finetune's `map: {system: FIELD}` in the dataset entry (a chat dataset's system "
                               "turn; an instruction dataset's replacement for the alpaca prompt's opening sentence)"),
    **{key: AxolotlKey(f"finetune's `map: {{{ours}: FIELD}}` in the dataset entry") for key, ours in (
        ("field_messages", "messages"), ("message_field_role", "role"), ("message_field_content", "content"),
        ("field_instruction", "instruction"), ("field_input", "input"), ("field_output", "output"), ("field", "text"))},
    "message_property_mappings": AxolotlKey("finetune's `map: {role: KEY, content: KEY}` in the dataset entry"),
    "system_prompt": AxolotlKey(_ALPACA_PROMPT),
    "system_format": AxolotlKey(_ALPACA_PROMPT),
    "format": AxolotlKey(_ALPACA_PROMPT),
    "no_input_format": AxolotlKey(_ALPACA_PROMPT),
    "roles_to_train": AxolotlKey("finetune's top-level `roles_to_train` (one list for every chat dataset; `finetune "
                                 "port` writes it when the datasets agree)"),
    "train_on_eos": AxolotlKey("not in finetune: assistant turns carry the loss as the chat template renders them"),
    "train_on_eot": AxolotlKey("not in finetune: assistant turns carry the loss as the chat template renders them"),
    "chat_template": AxolotlKey("not in finetune per dataset: one top-level `chat_template` renders every chat record"),
    "conversation": AxolotlKey("not in finetune: chat records are rendered with the top-level `chat_template`"),
    "drop_system_message": AxolotlKey("not in finetune: remove system turns from the records"),
}

DATASET_TYPES = {
    "alpaca": ("instruction", "{instruction, input, output} records with the alpaca prompt"),
    "chat_template": ("chat", "{messages: [{role, content}]} records rendered with `chat_template`"),
    "completion": ("completion", "{text} records"),
    "pretrain": ("completion", "{text} records"),
    "sharegpt": ("chat", "sharegpt records ({conversations: [{from, value}]}, roles human/gpt) are read as they are"),
}


def dataset_type(value) -> tuple[str | None, str]:
    """(finetune `type`, note) for an axolotl dataset type; None when finetune has no equivalent."""
    if isinstance(value, str) and value in DATASET_TYPES:
        return DATASET_TYPES[value]
    if isinstance(value, str) and value in ("instruction", "chat", "auto", "preference", "unpaired"):
        return value, ""
    if isinstance(value, str) and "." in value and known_preference_type(value):
        return None, (f"axolotl's `{value}` is a preference dataset type (for `rl:`): finetune reads preference "
                      "records with `type: preference` ({prompt, chosen, rejected}; KTO: `unpaired`) and a `method:`; "
                      "`finetune port` says whether these records read as they are (docs/preference.md)")
    if isinstance(value, str) and "." in value:
        return None, (f"axolotl's `{value}` is a Python transform (for `rl: grpo`: `module.function`): finetune runs "
                      "no dataset code and reads GRPO's {prompt, ...} records as `type: prompt`; `finetune port` "
                      "writes the command that runs the transform once")
    shown = value if isinstance(value, str) else "a custom prompt mapping"
    return None, (f"axolotl's `{shown}` prompt format has no finetune equivalent: convert the records to "
                  "{instruction, input, output} (`instruction`), {text} (`completion`) or {messages} (`chat`)")


# --- values of keys both tools have (chat_template: chat_templates.py) -------------------------------------------


def gradient_checkpointing(value) -> tuple[str, str]:
    if value is True or value == "full":
        return "full", ""
    if value in (False, None, "off"):
        return "off", ""
    return "full", f"axolotl's `{value}` checkpointing (activation offload) is not in finetune: full checkpointing"

