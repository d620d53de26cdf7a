"""Every place finetune touches a library's private attribute or changes a library object's behaviour.

Each function is one such touch, with the version it was checked against. tests/test_compat.py asserts,
against the installed versions, that what each one relies on still exists and still does what we use it
for, so an upgrade that moves it fails there (by name) instead of somewhere deep in a training run.

Checked against: transformers 5.23.0, peft 0.21.2, accelerate 1.15.0, deepspeed 0.19.8, bitsandbytes 0.50.2,
tqdm 4.70.1, torch 2.13.0, lm-eval 0.4.13, huggingface_hub 2.4.0. Nothing heavy is imported at module level (ingestion imports this module and
never imports torch).
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path


# --- transformers ----------------------------------------------------------------------------------------

def attn_implementation(config) -> str | None:
    """The attention implementation a loaded model runs with. transformers 5.23 keeps it in the private
    `config._attn_implementation` (the public `set_attn_implementation` only writes it)."""
    return getattr(config, "_attn_implementation", None)


def sdpa_functions():
    """(sdpa_attention_forward, sdpa_mask): transformers' stock SDPA attention and mask functions, which finetune's
    per-example attention falls back to. Module-level functions of transformers.integrations.sdpa_attention and
    transformers.masking_utils (5.23), not in the top-level API."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    return sdpa_attention_forward, sdpa_mask


def set_loss_function(causal_lm, loss_function) -> None:
    """Replace a causal LM's loss for this instance. transformers 5.23: `PreTrainedModel.loss_function` is a
    property with a setter (it stores `_loss_function`), and `*ForCausalLM.forward` calls
    `self.loss_function(logits=..., labels=..., vocab_size=..., **kwargs)`."""
    causal_lm.loss_function = loss_function


def quiet_head_swap_report():
    """A context in which transformers' load report of a causal LM's checkpoint loaded into its
    sequence-classification class (a reward model: the LM head not loaded, the score head new) is not logged.
    transformers 5.23 logs it as one warning of the `transformers.modeling_utils` logger, a "LOAD REPORT" table of
    `key | STATUS` rows (utils/loading_report.py); a report that names any other key is kept."""
    import contextlib
    import logging
    import re

    ansi = re.compile(r"\x1b\[[0-9;]*m")

    def expected(record: logging.LogRecord) -> bool:
        text = ansi.sub("", record.getMessage())
        if "LOAD REPORT" not in text:
            return False
        rows = [[cell.strip() for cell in line.split("|")] for line in text.splitlines() if "|" in line]
        keys = [(row[0], row[1]) for row in rows[1:] if len(row) > 1 and row[0] and not set(row[0]) <= set("-+")]
        return bool(keys) and all((key.startswith("lm_head.") and status == "UNEXPECTED")
                                  or (key.startswith("score.") and status == "MISSING") for key, status in keys)

    @contextlib.contextmanager
    def quiet():
        logger = logging.getLogger("transformers.modeling_utils")
        drop = lambda record: not expected(record)  # noqa: E731 - a logging filter may be any callable
        logger.addFilter(drop)
        try:
            yield
        finally:
            logger.removeFilter(drop)

    return quiet()


def set_router_aux_loss_coef(causal_lm, value) -> None:
    """The weight a mixture-of-experts causal LM gives its load-balancing loss in this forward. transformers 5.23's
    MoE `*ForCausalLM.__init__` copies `config.router_aux_loss_coef` into the instance attribute
    `router_aux_loss_coef`, and `forward` adds `self.router_aux_loss_coef * aux_loss` to the loss when it computes
    router logits (qwen3_moe, gpt_oss, mixtral, olmoe, qwen2_moe...). A number or a 0-dim tensor."""
    causal_lm.router_aux_loss_coef = value


def drop_quantizer(model) -> None:
    """Mark a model dequantized (a GGUF model is dequantized to floats on load). A quantized load sets
    `model.hf_quantizer` (read by transformers 5.23's save_pretrained) and `model.is_quantized` (read by
    peft 0.21 with getattr); `config.quantization_config` is written into config.json."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def keep_4bit_layout(model) -> int:
    """Keep bitsandbytes' 4-bit weights in their usual layout on a CPU; returns how many layers. bitsandbytes
    0.50.2's `Linear4bit.forward`, on a CPU with AVX512-BF16 (`support_avx512bf16_for_cpu`, set in `__init__`),
    repacks its weight for a faster CPU kernel at the first no-grad forward in eval mode and keeps it so; the
    backward of every later training forward then reads the repacked weight as the usual layout, and the
    gradients through the frozen 4-bit layers come out wrong (72% off on the tiny test model). A QLoRA run on such
    a CPU trained differently after its first no-grad pass (DPO's reference pass, GRPO's generation, an eval)."""
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


# --- peft ------------------------------------------------------------------------------------------------

def peft_moe_conversion(lora_config, model) -> None:
    """Rewrite `lora_config` in place as peft will before it builds the adapters. peft 0.21.2's `inject_adapter`
    first calls peft.utils.transformers_weight_conversion.convert_peft_config_for_transformers (for adapters trained
    on transformers 4): for the model types transformers 5.23 maps to its mixtral / qwen2_moe weight conversions
    (qwen3_moe, olmoe, deepseek_v3, glm4_moe, qwen3_next, minimax...), the transformers-4 names of the expert Linear
    layers (gate_proj / up_proj / down_proj, mixtral's w1 / w3 / w2) and `all-linear` become `target_parameters`
    on the fused 3-D weights (gate_up_proj at rank 2r and alpha 2 x alpha, down_proj) and the router `gate` becomes
    `gate.weight`. Converting a converted config changes nothing, so finetune converts first and edits the result."""
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
    from transformers.conversion_mapping import get_model_conversion_mapping

    convert_peft_config_for_transformers(lora_config, model=model, conversions=get_model_conversion_mapping(model))


PEFT_READS_DEPRECATED = r"`is_gradient_checkpointing` is deprecated"  # transformers 5.23's FutureWarning, peft's read
# peft 0.21.2 (tuners_utils.BaseTuner.inject_adapter) checks rank_pattern / alpha_pattern keys against the targeted
# MODULES only, so a key for a targeted parameter (a fused expert weight: `.*\.gate_up_proj` at rank 2r) is said to be
# "ignored" although peft applies it (gate_up_proj's lora_A is 2r x experts rows)
PEFT_PATTERN_IGNORED = re.compile(r"The following (?:rank|alpha)_pattern keys did not match any targeted module and "
                                  r"were ignored: (\[.*\])\.$")


def _parameter_patterns_only(message: str, target_parameters: list[str]) -> bool:
    r"""Whether `message` is peft's "pattern keys ... ignored" warning and every key it lists matches one of the
    adapter's target parameters (the rule peft applies them by: `(.*\.)?(KEY)$` on the weight's name)."""
    import ast

    found = PEFT_PATTERN_IGNORED.match(message)
    if not found or not target_parameters:
        return False
    keys = ast.literal_eval(found.group(1))
    return all(any(re.match(rf"(.*\.)?({key})$", f"model.{name}") for name in target_parameters) for key in keys)


def _target_parameters(adapter) -> list[str]:
    """A LoraConfig's target_parameters, or a saved adapter folder's (its adapter_config.json)."""
    if adapter is None:
        return []
    if isinstance(adapter, (str, os.PathLike)):
        config = Path(adapter) / "adapter_config.json"
        return list(json.loads(config.read_text()).get("target_parameters") or []) if config.is_file() else []
    return list(getattr(adapter, "target_parameters", None) or [])


@contextmanager
def peft_wrapping(adapter=None):
    """A context for building or loading a PeftModel without two warnings peft 0.21.2 prints about its own work:
    - transformers' FutureWarning: peft's `PeftModel.__init__` reads `model.is_gradient_checkpointing`, which
      transformers 5.23 deprecated for `is_activation_checkpointing` ("will be removed in v6"), so every verb that
      builds or loads an adapter (train, eval, generate, chat, merge) printed it; what peft reads is unchanged;
    - `adapter` (the LoraConfig being built, or a saved adapter's folder) with target_parameters: peft's "The
      following rank_pattern keys did not match any targeted module and were ignored", for keys that match a
      targeted parameter, which peft applied (PEFT_PATTERN_IGNORED); any other key's warning is shown as it was.
    Only those messages, only while peft wraps the model. Drop each when peft stops printing it (tests/test_moe.py
    fails then)."""
    import warnings

    parameters = _target_parameters(adapter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("ignore", message=PEFT_READS_DEPRECATED, category=FutureWarning)
        yield
    for shown in caught:  # the rest, through the filters as they were outside
        if not (shown.category is RuntimeWarning and _parameter_patterns_only(str(shown.message), parameters)):
            warnings.warn_explicit(shown.message, shown.category, shown.filename, shown.lineno, source=shown.source)


def save_new_token_rows_only(peft_model) -> None:
    """Save this adapter without whole copies of the resized embeddings and lm_head. peft 0.21.2's
    `PeftModel.save_pretrained(save_embedding_layers="auto")` adds both whole matrices to the adapter whenever the
    vocabulary was resized (utils/save_and_load.py compares `config.vocab_size` with the base's), also when the new
    rows are trainable tokens, which the adapter holds already. The HF Trainer (5.23) saves checkpoints and the
    final model through `model.save_pretrained(output_dir, state_dict=..., is_main_process=...)`, with no way to
    pass it; this one instance's save_pretrained passes `save_embedding_layers=False` (the class is untouched)."""
    import functools

    peft_model.save_pretrained = functools.partial(peft_model.save_pretrained, save_embedding_layers=False)


def replace_lora_dropout(model, make) -> int:
    """Replace each LoRA layer's `nn.Dropout` by `make(dropout)`; returns the count. peft 0.21 keeps a layer's
    dropout per adapter in the ModuleDict `lora_dropout` (nn.Identity when p is 0: left as it is) and calls it on
    the layer's input before lora_A; DoRA's variant calls the same module."""
    import torch

    swapped = 0
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, torch.nn.ModuleDict):
            continue
        for name, dropout in list(dropouts.items()):
            if type(dropout) is torch.nn.Dropout:
                dropouts[name] = make(dropout)
                swapped += 1
    return swapped


# --- torch.nn.Module instances (any library's) ---------------------------------------------------------

def replace_forward(module, forward) -> None:
    """Give one module instance another forward (its class is untouched). nn.Module.__call__ (torch 2.13)
    calls `self.forward`, so an instance attribute takes precedence over the class's method."""
    module.forward = forward


# --- accelerate ------------------------------------------------------------------------------------------

def reset_accelerate_state() -> None:
    """Forget any process state an earlier run in this process left. accelerate 1.15:
    `AcceleratorState._reset_state(reset_partial_state=True)` (private; TrainingArguments calls it too)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


# --- deepspeed / bitsandbytes parameters ---------------------------------------------------------------

def parameter_count(param) -> int:
    """Elements a parameter stands for. bitsandbytes 0.50 `Params4bit` packs 2 weights per byte of its
    storage; DeepSpeed 0.19 ZeRO-3 partitioned weights hold an empty placeholder and the real count in
    `ds_numel`."""
    if type(param).__name__ == "Params4bit":
        return param.numel() * 2 * param.element_size()
    if hasattr(param, "ds_numel"):
        return param.ds_numel
    return param.numel()


def zero3_partitioned(module) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions this module's weights (DeepSpeed 0.19 marks each such parameter
    with `ds_id`; its hooks gather a weight for the module's forward and free it right after)."""
    return any(hasattr(param, "ds_id") for param in module.parameters(recurse=False))


# --- lm-eval (the optional `eval` extra) ------------------------------------------------------------------

def lm_eval_load_yaml(path):
    """One lm-eval task YAML as a dict, with its `include:` merged and its `!function` tags resolved relative to
    the file, as lm-eval's own TaskManager reads it. lm-eval 0.4.13 keeps this in the private module
    lm_eval.tasks._yaml_loader (`load_yaml`; 0.4.8 had it as lm_eval.utils.load_yaml_config)."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError:  # lm-eval < 0.4.10
        from lm_eval.utils import load_yaml_config

        return load_yaml_config(yaml_path=str(path))
    return load_yaml(path)


# --- tqdm ------------------------------------------------------------------------------------------------

def disable_tqdm_monitor(tqdm_class) -> None:
    """No tqdm monitor thread (a thread must not exist when worker processes are forked). tqdm 4.70: the
    class attribute `monitor_interval`; 0 disables the monitor for bars created afterwards, process-wide."""
    tqdm_class.monitor_interval = 0


# --- huggingface_hub --------------------------------------------------------------------------------------

def set_hub_offline(offline: bool) -> bool:
    """Switch the hub's offline mode for this process and the processes it starts; returns the previous switch.
    huggingface_hub 2.4 reads HF_HUB_OFFLINE once, at its import, into `constants.HF_HUB_OFFLINE`, which
    `is_offline_mode()` (its downloads', transformers' and datasets' check) reads on every call; the environment
    variable is what a process started later (a launched worker, datasets' own config) reads."""
    from huggingface_hub import constants

    before = bool(constants.HF_HUB_OFFLINE)
    constants.HF_HUB_OFFLINE = offline
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    else:
        os.environ.pop("HF_HUB_OFFLINE", None)
    return before
