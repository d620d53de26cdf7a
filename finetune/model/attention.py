"""Which attention kernel a run uses, and why: one function the run logs once.

Packed rows (several examples in one row, `sample_packing`) must attend only within each example. The
kernels that do that without scoring the masked-out pairs:
- flash-attn's variable-length kernel (`flash_attention_2`), when the flash-attn package is installed (CUDA);
- PyTorch's flex_attention, through transformers' own `flex_attention` implementation: with no
  attention_mask and packed `position_ids`, transformers builds a document (block-causal) BlockMask from the
  position ids (masking_utils.find_packed_sequence_indices), and flex skips the fully masked blocks.
  Checked against transformers 5.23 / torch 2.13. flex_attention has no backward on CPU (torch 2.13), so on
  CPU packed rows run example by example instead (finetune/model/varlen_attention.py).
- otherwise SDPA over a dense block-diagonal mask: correct, but it scores every pair of the row.
Whatever is chosen, the packing isolation guard (finetune/model/isolation.py) proves on the real model
that packed examples do not see each other before training starts.

`auto` picks flash-attn and flex_attention only on GPUs of compute capability 8.0 and newer (finetune/model/
device.py says why); below that (T4, V100) it picks sdpa. A flex_attention chosen by `auto` is then probed on
the device, forward and backward with the model's own head sizes and dtype, and replaced by sdpa if the probe
fails (finetune/train/fast_paths.py).
"""

from __future__ import annotations

import importlib.util


def _flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def model_class(recipe):
    """The class from_pretrained builds for the recipe's base model, found from its config alone (no weights
    read); None when the config cannot be read here (loading the model reports that properly)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from finetune.model.loader import resolve_model_path

    try:
        source = resolve_model_path(recipe.base_model, recipe.cache_dir)
        config = AutoConfig.from_pretrained(source, trust_remote_code=recipe.trust_remote_code)
        auto_map = getattr(config, "auto_map", None) or {}
        if recipe.trust_remote_code and "AutoModelForCausalLM" in auto_map:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            return get_class_from_dynamic_module(auto_map["AutoModelForCausalLM"], source)
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except Exception:  # noqa: BLE001 advisory only: remote code may raise anything; loading reports it properly
        return None


def flex_support(recipe) -> tuple[bool, str]:
    """(whether `auto` may pick flex_attention for the base model, why not in words): its family's row says so
    (finetune/model/families.py; tests hold the rows to transformers' class flags) and its class has the path.
    Asked before the model loads, so the attention the run logs and records is the one it trains with."""
    from finetune.model.families import family

    cls = model_class(recipe)
    if cls is None:
        return False, "the base model's class could not be determined from its config"
    if not getattr(cls, "_supports_flex_attn", False):
        return False, f"{cls.__name__} has no flex_attention path in transformers"
    row = family(getattr(cls.config_class, "model_type", None))
    if row is None or not row.flex:
        return False, f"`{cls.config_class.model_type}` is not a family with flex_attention (docs/models.md)"
    return True, ""


def sdpa_support(recipe) -> tuple[bool, str]:
    """(whether the base model's class has an SDPA path in transformers, why not in words): Gemma 2 (soft-capping)
    and gpt-oss (attention sinks) have none and train with eager attention. True when the class is unknown here."""
    cls = model_class(recipe)
    if cls is None or getattr(cls, "_supports_sdpa", True):
        return True, ""
    return False, f"{cls.__name__} has no sdpa path in transformers"


def choose_attention(recipe, device=None, supports_flex=flex_support, supports_sdpa=sdpa_support) -> tuple[str, str]:
    """(attn_implementation for from_pretrained, the reason in words) for this recipe on `device` (a
    finetune.model.device.Device; default: this process's). `supports_flex(recipe) -> (bool, why not)` is asked
    only when flex_attention would be chosen, `supports_sdpa` likewise for sdpa (eager where the class has none).
    A flex_attention chosen here is still probed on the device before the run uses it
    (finetune/train/fast_paths.py)."""
    if recipe.attn_implementation != "auto":
        return recipe.attn_implementation, "set in the recipe (attn_implementation)"
    attn, why = _choose(recipe, device, supports_flex)
    if attn == "sdpa":
        sdpa, why_not = supports_sdpa(recipe)
        if not sdpa:
            return "eager", f"{why_not}: eager attention (where `auto` picks sdpa: {why})"
    return attn, why


def _choose(recipe, device, supports_flex) -> tuple[str, str]:
    if device is None:
        from finetune.model.device import training_device

        device = training_device()
    if device.cuda and not device.fast_paths:
        # flash-attn 2 runs on sm_80+ only; flex's Triton kernels need more shared memory than these GPUs have
        return "sdpa", (f"{device.describe()} is older than compute capability 8.0: sdpa (flash-attn 2 needs 8.0+, "
                        "flex_attention's backward needs more shared memory per block than GPUs before 8.0 have)"
                        + (", packed rows with a dense per-example mask" if recipe.sample_packing else ""))
    if device.cuda and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", "flash-attn is installed and CUDA is available (variable-length kernel)"
    if not recipe.sample_packing:
        return "sdpa", "rows are not packed: sdpa with a padding mask"
    if device.cuda and _flex_available():
        flex, why_not = supports_flex(recipe)
        if not flex:
            return "sdpa", f"packed rows on CUDA without flash-attn, and {why_not}: sdpa with a dense per-example mask"
        return "flex_attention", ("packed rows on CUDA without flash-attn: flex_attention with a per-example "
                                  "(document) mask from position_ids skips the masked-out blocks")
    if device.cuda:
        return "sdpa", "packed rows on CUDA, neither flash-attn nor flex_attention available: sdpa with a dense mask"
    return "sdpa", ("CPU: sdpa, packed rows example by example where the model allows it (flex_attention "
                    "has no backward on CPU)")


def attention_problems(recipe, device) -> list[str]:
    """Every reason the attention implementation the recipe sets cannot train on `device` (flex_attention on CPU
    would otherwise fail in the first backward pass); `auto` never chooses one of these there."""
    problems = []
    if recipe.attn_implementation == "flash_attention_2":
        fix = "Set `attn_implementation: auto` (it picks flash-attn where it can run) or `sdpa`."
        if not device.cuda:
            problems.append("`attn_implementation: flash_attention_2` needs a CUDA GPU (flash-attn's kernels are CUDA "
                            f"only) and this machine has none. {fix}")
        elif not device.fast_paths:
            problems.append("`attn_implementation: flash_attention_2` needs a GPU of compute capability 8.0 or newer "
                            f"(flash-attn 2); this one is {device.describe()}. {fix}")
        if importlib.util.find_spec("flash_attn") is None:
            problems.append("`attn_implementation: flash_attention_2`: the flash-attn package is not installed "
                            f"(`pip install flash-attn --no-build-isolation`). {fix}")
    if recipe.attn_implementation == "flex_attention" and not device.cuda:
        problems.append("`attn_implementation: flex_attention` cannot train on CPU: PyTorch's flex_attention has "
                        "no backward pass there (torch 2.13). Set `attn_implementation: auto` (or `sdpa`).")
    return problems


def check_trainable(recipe, device) -> None:
    """Raise ModelError for an attention implementation the recipe sets that cannot train on this machine, before
    any model is loaded."""
    from finetune.errors import ModelError

    problems = attention_problems(recipe, device)
    if problems:
        raise ModelError(" ".join(problems))
