"""build_model(recipe): the base model, optionally quantized, with LoRA adapters when asked.

QLoRA is LoRA plus one switch (a 4-bit base), not a second code path.
"""

from __future__ import annotations

import importlib.util
import sys

from finetune.errors import ModelError
from finetune.model.loader import _not_found, load_tokenizer, resolve_model_path


def resolve_precision(recipe) -> str:
    """`auto`: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    if recipe.precision != "auto":
        return recipe.precision
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def resolve_attn_implementation(recipe) -> str:
    if recipe.attn_implementation != "auto":
        return recipe.attn_implementation
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def quantized_base(recipe) -> bool:
    return recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit


def get_quantization_config(recipe, compute_dtype):
    """BitsAndBytesConfig for a quantized base, or None."""
    if not quantized_base(recipe):
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(
            "a quantized base (QLoRA / load_in_4bit / load_in_8bit) needs bitsandbytes: pip install 'finetune[qlora]'"
        )
    from transformers import BitsAndBytesConfig

    if recipe.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,  # quantize the quantization constants too: ~0.37 bits/param saved
        bnb_4bit_compute_dtype=compute_dtype,
    )


def get_lora_config(recipe):
    """peft LoraConfig for `adapter: lora|qlora`, or None for a full fine-tune."""
    if recipe.adapter == "none":
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=recipe.lora_target_modules,
        modules_to_save=recipe.lora_modules_to_save,
        bias="none",
        task_type="CAUSAL_LM",
    )


def linear_module_names(model) -> list[str]:
    import torch

    return sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)})


def load_base_model(recipe, precision: str):
    import torch
    from transformers import AutoModelForCausalLM

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    # Adapters train on a base held in the compute dtype; a full fine-tune keeps fp32 master weights and
    # lets autocast run the matmuls in bf16/fp16.
    load_dtype = dtypes[precision] if recipe.adapter != "none" else torch.float32
    source = resolve_model_path(recipe.base_model, recipe.cache_dir)
    try:
        return AutoModelForCausalLM.from_pretrained(
            source,
            dtype=load_dtype,
            attn_implementation=resolve_attn_implementation(recipe),
            quantization_config=get_quantization_config(recipe, dtypes[precision]),
            trust_remote_code=recipe.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and "attn" in str(exc).lower():
            raise ModelError(f"attention implementation not usable here: {exc}") from None
        raise _not_found(recipe.base_model, exc) from None


def build_model(recipe, tokenizer=None):
    """(model, tokenizer) ready for the Trainer, with the trainable-parameter count printed."""
    tokenizer = tokenizer or load_tokenizer(recipe)
    if recipe.trust_remote_code:
        print("WARNING: trust_remote_code is ON: code shipped with the model will run.", file=sys.stderr)
    precision = resolve_precision(recipe)
    model = load_base_model(recipe, precision)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if quantized_base(recipe):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.gradient_checkpointing)
    lora = get_lora_config(recipe)
    if lora is not None:
        from peft import get_peft_model

        try:
            model = get_peft_model(model, lora)
        except ValueError as exc:
            if "not found" not in str(exc) and "target" not in str(exc).lower():
                raise
            raise ModelError(
                f"`lora_target_modules` {recipe.lora_target_modules} match no module of this model. "
                f"Linear modules it has: {', '.join(linear_module_names(model))}"
            ) from None
    if recipe.gradient_checkpointing:
        model.config.use_cache = False
    trainable, total = count_parameters(model)
    print(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.3f}%)", file=sys.stderr)
    return model, tokenizer


def count_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
