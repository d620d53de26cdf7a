"""build_model(recipe): the base model, optionally quantized, with LoRA adapters when asked.

QLoRA is LoRA plus one switch (a 4-bit base), not a second code path. `method: reward` builds the base's own
sequence-classification class with one output instead of its causal LM (finetune/model/score_head.py): the same
decoder, a new score head (hidden -> 1) in place of the LM head; with LoRA the head trains in full and is saved with
the adapter (peft's modules_to_save), so a reloaded reward model scores as it trained.
"""

from __future__ import annotations

import functools
import os

from finetune.compat import parameter_count, peft_wrapping, save_new_token_rows_only
from finetune.errors import ModelError
from finetune.log import get_logger
from finetune.model.bnb import require_bitsandbytes
from finetune.model.checkpointing import checkpoint_mlps
from finetune.model.loader import _not_found, adapter_folder, load_tokenizer, resolve_model_path
from finetune.model.moe import MoeSetup, check_target_parameters, prepare_experts
from finetune.model.targets import check_targets, module_groups, ties_embeddings
from finetune.model.tokens import fit_embeddings
from finetune.model.vision import freeze_parts, is_vision_model, log_parts, lora_target_names
from finetune.recipe.adapter import mutates_base, uses_eva

log = get_logger(__name__)


def base_causal_lm(model):
    """The transformers causal LM inside `model`: under a PEFT wrapper, its base model (LoRA layers in it)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def resolve_precision(recipe, device=None) -> str:
    """`auto`: bf16 on GPUs with bf16 tensor cores, fp16 on older GPUs, fp32 on CPU (finetune/plan/precision.py),
    for `device` (a finetune.model.device.Device; default: this process's)."""
    from finetune.plan.precision import resolve_precision as rule

    if recipe.precision != "auto":
        return recipe.precision
    if device is None:
        from finetune.model.device import training_device

        device = training_device()
    # capability >= 8.0, not torch.cuda.is_bf16_supported(): a T4 "supports" bf16 only by emulation (torch's
    # default answers True there), several times slower than fp16; the GPU table and the planner say fp16 for it.
    return rule(recipe.precision, device.cuda, device.native_bf16)


def resolve_attn_implementation(recipe) -> str:
    """The attention implementation the model loads with; finetune/model/attention.py says why."""
    from finetune.model.attention import choose_attention

    return choose_attention(recipe)[0]


def quantized_base(recipe) -> bool:
    return recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit


def get_quantization_config(recipe, compute_dtype, keep: list[str] | None = None):
    """BitsAndBytesConfig for a quantized base, or None. `keep`: modules left unquantized (a vision-language model's
    tower, projector and output layer: model/vision.py); None: transformers' default (the output layer)."""
    if not quantized_base(recipe):
        return None
    require_bitsandbytes("a quantized base (`adapter: qlora`, `load_in_4bit` or `load_in_8bit`)")
    from transformers import BitsAndBytesConfig

    if recipe.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=keep)
    return BitsAndBytesConfig(
        llm_int8_skip_modules=keep,
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,  # quantize the quantization constants too: ~0.37 bits/param saved
        bnb_4bit_compute_dtype=compute_dtype,
    )


def describe_quantization(recipe, precision: str) -> str:
    if recipe.load_in_8bit:
        return "8-bit (LLM.int8)"
    return f"4-bit NF4, double quantization, compute in {precision}"


def get_lora_config(recipe, modules_to_save: list[str] | None = None, tie_embeddings: bool = False,
                    trainable_tokens: dict[str, list[int]] | None = None, exclude_modules: list[str] | None = None):
    """peft LoraConfig for `adapter: lora|qlora`, or None for a full fine-tune. `modules_to_save`: the recipe's
    (and the routers with `train_router`); `trainable_tokens`: the embedding (and lm_head) rows of the recipe's new
    tokens (fit_embeddings); `exclude_modules`: what no adapter may reach (frozen routers, model/moe.py)."""
    if recipe.adapter == "none":
        return None
    from peft import EvaConfig, LoraConfig

    return LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=recipe.lora_target_modules,
        # mixture-of-experts: the fused 3-D expert weights, one rank-r adapter per expert (docs/moe.md)
        target_parameters=recipe.lora_target_parameters,
        exclude_modules=exclude_modules or None,
        modules_to_save=modules_to_save,
        trainable_token_indices=trainable_tokens,  # the rows of new tokens (finetune/model/tokens.py)
        # a tied embedding / lm_head pair stays one trained matrix instead of two diverging copies
        ensure_weight_tying=tie_embeddings and bool(modules_to_save),
        bias="none",
        # a reward model's adapter is peft's sequence-classification kind: it saves the score head with the adapter
        task_type="SEQ_CLS" if recipe.method == "reward" else "CAUSAL_LM",
        # the variants (docs/lora.md): magnitudes + directions, alpha / sqrt(r), the adapters' starting values
        use_dora=recipe.peft_use_dora,
        use_rslora=recipe.peft_use_rslora,
        init_lora_weights=recipe.peft_init_lora_weights,
        # EVA's defaults (rho=2: a layer may take up to 2r of the rank budget); the data pass is
        # finetune/model/lora_variants.py: eva_initialise, run by the training run once the data is there
        eva_config=EvaConfig() if uses_eva(recipe) else None,
    )


def reward_loader():
    """AutoModelForSequenceClassification.from_pretrained with one output: the base's sequence-classification class, a
    reward model (`method: reward`; its score head new, the LM head not loaded; transformers' report of exactly those
    two is expected and kept out of the log: finetune/compat.py)."""
    from transformers import AutoModelForSequenceClassification

    def load(*args, **kwargs):
        from finetune.compat import quiet_head_swap_report

        with quiet_head_swap_report():
            return AutoModelForSequenceClassification.from_pretrained(*args, num_labels=1, **kwargs)

    return load


def load_base_model(recipe, precision: str, attn: str):
    import torch

    from finetune.model.vision import model_class, unquantized_modules

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    # Adapters train on a base held in the compute dtype; a full fine-tune keeps fp32 master weights and
    # lets autocast run the matmuls in bf16/fp16.
    load_dtype = dtypes[precision] if recipe.adapter != "none" else torch.float32
    source = resolve_model_path(recipe.base_model, recipe.cache_dir)
    quantization = get_quantization_config(recipe, dtypes[precision], unquantized_modules(recipe))
    # bitsandbytes quantizes while loading, onto this process's GPU (one per process under accelerate)
    device_map = {"": int(os.environ.get("LOCAL_RANK", "0"))} if quantization and torch.cuda.is_available() else None
    loader = reward_loader() if recipe.method == "reward" else model_class(recipe).from_pretrained
    load = functools.partial(loader, source, dtype=load_dtype,
                             quantization_config=quantization, device_map=device_map,
                             trust_remote_code=recipe.trust_remote_code)
    try:
        # `auto` chose flex_attention only for a model class that has it (attention.flex_support): no fallback
        # here, so the attention logged and recorded is the one the model trains with
        return load(attn_implementation=attn)
    except ImportError as exc:  # remote model code, or a kernel package, that needs what is not installed
        raise ModelError(f"loading `{recipe.base_model}` needs a package that is not installed: {exc}") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and "attn" in str(exc).lower():
            hint = (" (`attn_implementation: auto` chose it from the model class; set `attn_implementation: sdpa`)"
                    if recipe.attn_implementation == "auto" else "")
            raise ModelError(f"attention implementation {attn} not usable here: {exc}{hint}") from None
        raise _not_found(recipe.base_model, exc) from None


def build_model(recipe, tokenizer=None, precision: str | None = None, attn_implementation: str | None = None):
    """(model, tokenizer) ready for the Trainer, with the trainable-parameter count printed. The run passes
    the precision and attention it resolved (finetune/train/settings.py); other callers let them resolve here."""
    tokenizer = tokenizer or load_tokenizer(recipe)
    if recipe.trust_remote_code:
        log.warning("trust_remote_code is ON: code shipped with the model will run.")
    precision = precision or resolve_precision(recipe)
    model = load_base_model(recipe, precision, attn_implementation or resolve_attn_implementation(recipe))
    # Training never reads a KV cache: it conflicts with recomputation (gradient checkpointing), and with one
    # transformers skips the packed-row mask (every packed token would see its whole row; see isolation.py).
    text_config = model.config.get_text_config()  # the config itself, or a vision-language model's language model's
    model.config.use_cache = text_config.use_cache = False
    if getattr(text_config, "pad_token_id", None) is None:
        text_config.pad_token_id = tokenizer.pad_token_id
    trainable_tokens = fit_embeddings(model, tokenizer, recipe)
    if quantized_base(recipe):
        log.info(f"base quantized: {describe_quantization(recipe, precision)}")
        from peft import prepare_model_for_kbit_training

        # norms to fp32, inputs ready for grads; checkpointing is switched on below / by the Trainer
        # (non-reentrant), not here (peft's default is the reentrant kind)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        from finetune.compat import keep_4bit_layout

        keep_4bit_layout(model)  # else a 4-bit layer's backward is wrong after a no-grad pass (CPU, AVX512-BF16)
    apply_gradient_checkpointing(model, recipe.gradient_checkpointing)
    adapter = adapter_folder(recipe.base_model)
    moe = prepare_experts(model, recipe, precision) if adapter is None else MoeSetup()
    lora = get_lora_config(recipe, modules_to_save(recipe, model, moe.saved),
                           tie_embeddings=ties_embeddings(model), trainable_tokens=trainable_tokens,
                           exclude_modules=moe.excluded)
    if lora is not None:
        moe.apply(lora)  # a mixture-of-experts model: peft's own conversion for fused experts, frozen routers out
    vision = is_vision_model(model)
    if adapter is not None:
        model = continue_adapter(model, adapter, recipe)
    elif lora is not None:
        from peft import get_peft_model

        if vision:  # adapters only in the parts that are not frozen (finetune/model/vision.py)
            lora.target_modules = lora_target_names(model, recipe)
            log_parts(model, recipe, lora.target_modules)
        else:
            modules = moe.targets.modules if moe.targets else recipe.lora_target_modules  # after peft's conversion
            if modules or not (recipe.lora_target_parameters or moe.targets and moe.targets.parameters):
                check_targets(module_groups(model), modules)  # [] is fine with parameter targets only
        check_target_parameters(model, recipe.lora_target_parameters)
        if trainable_tokens and mutates_base(recipe):
            raise ModelError(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` cannot train new tokens' "
                             "rows (trainable_token_indices): peft's conversion for the original base "
                             "keeps only A and B; use the default init, or add no tokens")
        try:
            with peft_wrapping(lora):
                model = get_peft_model(model, lora)
        except ValueError as exc:  # e.g. DoRA on a GPTQ / AWQ layer, which this peft cannot build
            raise ModelError(f"peft {peft_version()} cannot build these adapters on `{recipe.base_model}`: {exc}. "
                             "Drop the LoRA variant key it names (docs/lora.md), or use another base") from None
        if mutates_base(recipe):
            log.info(f"peft_init_lora_weights: {recipe.peft_init_lora_weights}: the adapters start from the "
                     "weights' decomposition, the base holds the rest; the saved adapter is converted to plain "
                     "LoRA for the original base")
    elif vision:  # a full fine-tune: the frozen parts get no gradients
        freeze_parts(model, recipe)
        log_parts(model, recipe)
    if getattr(getattr(model, "active_peft_config", None), "trainable_token_indices", None):
        save_new_token_rows_only(model)  # the adapter holds the new rows: never whole copies of both matrices
    trainable, total = count_parameters(model)
    log.info(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.3f}%)")
    return model, tokenizer


def modules_to_save(recipe, model, more: list[str] = ()) -> list[str] | None:
    """The modules an adapter trains in full and saves: the recipe's, `more` (a mixture-of-experts model's), and a
    reward model's score head always (without it the head stays at its random start and is not saved: the reloaded
    model scores at random, TRL #1379)."""
    names = list(recipe.lora_modules_to_save or []) + list(more)
    if recipe.method == "reward" and recipe.adapter != "none":
        from finetune.model.score_head import head_name

        head = head_name(model)
        names += [] if head in names else [head]
        log.info(f"reward model: the score head `{head}` ({model.config.hidden_size} -> 1, new) trains in full and "
                 "is saved with the adapter (modules_to_save)")
    return names or None


def peft_version() -> str:
    from importlib.metadata import version

    return version("peft")


def continue_adapter(model, folder, recipe):
    """base_model is an adapter folder (e.g. an SFT run's output): its adapter goes on the base. With `adapter:
    lora` / `qlora` the same adapter keeps training (its own rank and targets; the recipe's lora_* settings do
    not apply); with `adapter: none` it is merged into the weights, which are then trained in full."""
    from peft import PeftModel

    if recipe.method == "reward" and recipe.adapter != "none":
        raise ModelError(f"base_model is the adapter in {folder}, which a reward model cannot keep training: that "
                         "adapter has no place for the score head, which must train and be saved with the adapter. "
                         f"Merge it first (`finetune merge {folder}`) and set base_model to the merged folder, or set "
                         "`adapter: none` (the adapter is merged into its base, then every weight trains)")
    if recipe.adapter == "none":
        log.info(f"base_model is the adapter in {folder}: merged into its base, then fully fine-tuned")
        # peft froze the base's weights when it put the adapter on: after merging, every weight trains again
        with peft_wrapping(folder):
            return PeftModel.from_pretrained(model, str(folder)).merge_and_unload().requires_grad_(True)
    with peft_wrapping(folder):
        model = PeftModel.from_pretrained(model, str(folder), is_trainable=True)
    config = model.peft_config["default"]
    log.info(f"base_model is the adapter in {folder}: it keeps training (r={config.r}, alpha={config.lora_alpha}, "
             f"DoRA {'on' if config.use_dora else 'off'}, rsLoRA {'on' if config.use_rslora else 'off'}, its own "
             "target modules; the recipe's lora_* and peft_* settings do not apply, loraplus_* do)")
    return model


def apply_gradient_checkpointing(model, mode: str) -> None:
    """`mlp` wraps each MLP block here; `full` is switched on by the Trainer (train.py: activation_checkpointing)."""
    if mode == "off":
        return
    if mode == "full":
        log.info("gradient checkpointing: full (every decoder layer, non-reentrant)")
    if mode == "mlp":
        blocks = checkpoint_mlps(model)
        log.info(f"gradient checkpointing: mlp (recomputing {blocks} MLP blocks in the backward pass)")


def count_parameters(model) -> tuple[int, int]:
    trainable = sum(parameter_count(p) for p in model.parameters() if p.requires_grad)
    total = sum(parameter_count(p) for p in model.parameters())
    return trainable, total
