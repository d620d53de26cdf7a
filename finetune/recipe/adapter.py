"""The recipe's adapter keys: a full fine-tune, LoRA, or QLoRA (LoRA on a 4-bit base), and the quantized base."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field

from finetune.recipe.methods import method_setting
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

    lora_target_parameters: list[str] | None = Field(
        None,
        description="Parameters (not modules) to adapt, by name or suffix, e.g. [mlp.experts.gate_up_proj, "
                    "mlp.experts.down_proj]: the fused 3-D expert weights of mixture-of-experts models, which "
                    "`all-linear` never reaches (peft's `target_parameters`: one rank-r adapter per expert). Needs "
                    "`lora_dropout: 0`. `finetune targets` lists a model's expert weights (docs/moe.md).",
        json_schema_extra=affects(TRAIN),
    )

    lora_modules_to_save: list[str] | None = Field(
        None, description="Modules trained in full and saved with the adapter, e.g. [embed_tokens, lm_head].",
        json_schema_extra=affects(TRAIN),
    )

    # --- LoRA variants (peft); axolotl's key names. docs/lora.md says what each one changes. -----------------

    peft_use_dora: bool = Field(
        False,
        description="DoRA: each adapted weight is split into a magnitude (one trained number per output feature) and "
                    "a direction that LoRA updates. A few more trainable parameters; each adapted layer's forward pass "
                    "also computes the weight's column norms, so steps are slower and use more memory than LoRA.",
        json_schema_extra=affects(TRAIN),
    )

    peft_use_rslora: bool = Field(
        False,
        description="rsLoRA: scale the update by lora_alpha / sqrt(lora_r) instead of lora_alpha / lora_r, so a higher "
                    "rank keeps learning as fast (at r=8, alpha=16 the scale is 5.66 instead of 2).",
        json_schema_extra=affects(TRAIN),
    )

    peft_init_lora_weights: Union[bool, str] = Field(
        True,
        description="How the adapters start. `true`: A random (Kaiming), B zero, so training starts at the base model. "
                    "`gaussian`: A drawn from N(0, 1/r). `pissa`: A and B hold the weight's top-r singular "
                    "directions and the base keeps the rest (`pissa_niter_N`: a fast randomized SVD with N "
                    "iterations). `olora`: A and B from a QR decomposition of the weight, the base keeps the rest. "
                    "PiSSA and OLoRA change the base in memory; the saved adapter is converted to plain LoRA for the "
                    "original base. `eva`: A from the principal directions of each layer's inputs on the training "
                    "data (a data pass before training, `method: sft`), ranks redistributed between layers.",
        json_schema_extra=affects(TRAIN),
    )

    loraplus_lr_ratio: float | None = Field(
        None, gt=0,
        description="LoRA+: the B matrices learn at learning_rate x this ratio (the paper suggests 16; A keeps "
                    "learning_rate). Unset: one learning rate for all.",
        json_schema_extra=affects(TRAIN),
    )

    loraplus_lr_embedding: float | None = Field(
        None, gt=0,
        description="LoRA+: the learning rate of LoRA adapters on embedding layers (peft's default when unset: 1e-6). "
                    "Needs `loraplus_lr_ratio`.",
        json_schema_extra=affects(TRAIN),
    )


# the initialisations that replace part of the base weight with the adapter's starting value
MUTATING_INITS = ("pissa", "olora")
_VARIANT_KEYS = ("peft_use_dora", "peft_use_rslora", "peft_init_lora_weights", "loraplus_lr_ratio",
                 "loraplus_lr_embedding", "lora_target_parameters")


def lora_init(value) -> str:
    """`peft_init_lora_weights` as one word: default, gaussian, pissa, olora, eva, or the value itself (refused)."""
    if value is True:
        return "default"
    if value is False:
        return "false"
    if value == "pissa" or (isinstance(value, str) and value.startswith("pissa_niter_")):
        return "pissa"
    return str(value)


def uses_eva(recipe) -> bool:
    """EVA: A starts from the principal directions of each layer's inputs on the training data (a data pass)."""
    return recipe.adapter != "none" and lora_init(recipe.peft_init_lora_weights) == "eva"


def mutates_base(recipe) -> bool:
    """PiSSA / OLoRA: the base in memory is W minus the adapter's starting value; the saved adapter is converted."""
    return recipe.adapter != "none" and lora_init(recipe.peft_init_lora_weights) in MUTATING_INITS


def _init_problem(value) -> str | None:
    name = lora_init(value)
    if name in ("default", "gaussian", "olora", "eva"):
        return None
    if name == "pissa":
        niter = str(value).removeprefix("pissa").removeprefix("_niter_")
        if niter and not (niter.isdigit() and int(niter) > 0):
            return (f"`peft_init_lora_weights: {value}`: the fast PiSSA needs a whole number of iterations, "
                    "e.g. `pissa_niter_4`")
        return None
    if name == "false":
        return ("`peft_init_lora_weights: false` starts B random, so the model changes before it trains (peft keeps "
                "it for tests); use `true` (the default) or `gaussian`")
    return (f"`peft_init_lora_weights: {value}` is not one finetune supports; use true, gaussian, pissa, "
            "pissa_niter_N or olora")


def adapter_problems(recipe, explicit: set[str]) -> list[str]:
    """The LoRA-variant keys against the adapter, the base and the method; [] when they fit."""
    if recipe.adapter == "none":
        return [f"`{key}` is a LoRA setting, but `adapter: none` trains every weight without adapters; set `adapter: "
                "lora` (or `qlora`), or remove it" for key in _VARIANT_KEYS
                if key in explicit and getattr(recipe, key) is not None]
    problems = []
    init = _init_problem(recipe.peft_init_lora_weights)
    if init:
        problems.append(init)
    problems += _parameter_target_problems(recipe)
    if recipe.loraplus_lr_embedding is not None and recipe.loraplus_lr_ratio is None:
        problems.append("`loraplus_lr_embedding` is a LoRA+ setting; set `loraplus_lr_ratio` too (e.g. 16), or "
                        "remove it")
    if not init and uses_eva(recipe) and recipe.method != "sft":
        problems.append(f"`peft_init_lora_weights: eva` starts the adapters from an SVD of each layer's inputs over "
                        f"the training examples; finetune runs that data pass for `method: sft` only, not "
                        f"`{recipe.method}` (its rows are pairs or prompts). Use the default init, or pissa / olora")
    if init or not mutates_base(recipe):
        return problems
    name = "PiSSA" if lora_init(recipe.peft_init_lora_weights) == "pissa" else "OLoRA"
    if recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit:
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` ({name}) writes the weight minus "
                        "the adapter's start back into the base; a 4/8-bit base rounds that residual, so the adapter "
                        "saved for the original base no longer reproduces the trained model. Use `adapter: lora` "
                        "without a quantized base, or the default init")
    if recipe.peft_use_dora:
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` ({name}) with `peft_use_dora`: the "
                        "adapter is converted for the original base as plain LoRA (A, B), which has no place for "
                        "DoRA's magnitudes; drop one of them")
    if recipe.method == "grpo" and method_setting(recipe, "rl_beta") > 0:
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` ({name}) with GRPO's `rl_beta` "
                        f"> 0: the KL reference is the model with its adapter switched off, which under {name} is the "
                        "residual base, not the model training started from; set `rl_beta: 0` or use the default init")
    if recipe.lora_modules_to_save:
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` ({name}) with "
                        "`lora_modules_to_save`: peft's conversion for the original base keeps only A and B, and would "
                        "drop the modules trained in full; drop one of them")
    return problems


def _parameter_target_problems(recipe) -> list[str]:
    """What peft 0.21.2's adapters on parameters (`target_parameters`, lora.ParamWrapper) cannot do."""
    if not recipe.lora_target_parameters:
        return []
    problems = []
    if recipe.lora_dropout:
        problems.append(f"`lora_target_parameters` with `lora_dropout: {recipe.lora_dropout}`: an adapter on a "
                        "parameter adds its update to the weight itself, so there is no input to drop out (peft "
                        "refuses it); set `lora_dropout: 0`")
    if recipe.peft_use_dora:
        problems.append("`lora_target_parameters` with `peft_use_dora`: peft has no DoRA for adapters on parameters; "
                        "drop one of them")
    if lora_init(recipe.peft_init_lora_weights) not in ("default", "gaussian"):
        problems.append(f"`lora_target_parameters` with `peft_init_lora_weights: {recipe.peft_init_lora_weights}`: "
                        "that init reads a Linear weight, and a parameter target has none; use the default init")
    return problems
