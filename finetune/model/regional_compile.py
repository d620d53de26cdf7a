"""Regional compilation: torch.compile each decoder layer instead of the whole model.

All decoder layers of a model share one code path, so dynamo traces one layer and reuses the graph for the
others (the compile cost is one layer's, not the model's), and the pieces around the layers (embeddings,
the LM head and loss, the Trainer's hooks, DeepSpeed's) stay eager. This is the recipe transformers and
PyTorch document for training ("regional compilation"). `nn.Module.compile()` compiles a module in place:
parameter names and state dicts do not change, so LoRA adapters, checkpoints and `save_pretrained` are
unaffected; gradient checkpointing (transformers wraps each layer's __call__) recomputes the compiled layer.

Compilation is lazy: it happens in the first forward passes, which the run times and reports once
(finetune/train/callbacks/compile_time.py).
"""

from __future__ import annotations


def resolve_compile(recipe, device=None) -> tuple[bool, str]:
    """(compile decoder layers?, the reason in words) on `device` (a finetune.model.device.Device; default: this
    process's). `auto`: on with a GPU of compute capability 8.0 or newer, and only once a compiled layer has run
    there (the probe in finetune/train/fast_paths.py); off on CPU, where the inductor kernels rarely beat eager for
    the small models trained there and compiling costs tens of seconds, and off on older GPUs (T4, V100)."""
    if recipe.compile != "auto":
        return bool(recipe.compile), "set in the recipe (compile)"
    if getattr(recipe, "fsdp", None) is not None:  # `compile: true` with `fsdp` is refused (recipe/distributed.py)
        return False, "auto: off under `fsdp` (FSDP2's hooks sit on the decoder layers compile would compile)"
    if device is None:
        from finetune.model.device import training_device

        device = training_device()
    if device.fast_paths:
        return True, f"auto: {device.describe()}"
    if device.cuda:
        return False, (f"auto: off on {device.describe()}, older than 8.0 (the Triton kernels compile generates "
                       "are tuned for 8.0 and newer; set `compile: true` to try it, it is probed first)")
    return False, "auto: off on CPU"


def decoder_layers(model) -> list:
    """Every decoder layer of `model` (also under a PEFT wrapper): transformers' GradientCheckpointingLayer
    subclasses, the unit transformers itself checkpoints."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def compile_decoder_layers(model) -> int:
    """Compile every decoder layer in place; returns how many. Call after LoRA is attached (its modules
    are then part of the compiled layer) and before the Trainer wraps the model."""
    layers = decoder_layers(model)
    for layer in layers:
        # dynamic=None: static shapes first, a dynamic graph after the first shape change (eval rows,
        # the last partial batch) instead of one recompilation per length
        layer.compile()
    return len(layers)
