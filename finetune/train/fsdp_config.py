"""The recipe's `fsdp:` section as TrainingArguments takes it: `fsdp=True` and an `fsdp_config` with `version: 2`.

The sibling of deepspeed_config.py: resolved once in train/settings.py, handed to TrainingArguments, which builds
accelerate's FullyShardedDataParallelPlugin from it; the Trainer then shards the model with `fully_shard` one
decoder layer at a time (the wrap policy: the model's `_no_split_modules` unless the recipe names a class).
Keys as transformers 5 reads them (TrainingArguments._process_fsdp_args).
"""

from __future__ import annotations

from finetune.errors import ModelError


def trainer_fsdp_config(recipe) -> dict | None:
    """TrainingArguments(fsdp_config=...) for the recipe's `fsdp:`; None without one."""
    spec = recipe.fsdp
    if spec is None:
        return None
    config = {
        "version": 2,
        "reshard_after_forward": spec.reshard_after_forward,
        "cpu_offload": spec.offload_params,
        "state_dict_type": spec.state_dict_type,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # one shard unit per decoder layer
        # FSDP's own activation checkpointing: the TrainingArguments switch would gather each layer twice in backward
        "activation_checkpointing": recipe.gradient_checkpointing == "full",
        "cpu_ram_efficient_loading": False,  # every process loads the base: the probes run on the whole model
    }
    if spec.transformer_layer_cls_to_wrap:
        config["transformer_layer_cls_to_wrap"] = [spec.transformer_layer_cls_to_wrap]
    return config


def check_fsdp_device(recipe, cuda: bool) -> None:
    """`fsdp` needs GPU processes: on CPU accelerate leaves the FSDP plugin unused and the Trainer would train as
    plain DDP, every process holding the whole model (or, without a CPU group, refuse with "Using fsdp only works
    in distributed training"). Refused here, before any model is loaded."""
    if recipe.fsdp is not None and not cuda:
        raise ModelError("`fsdp` shards over GPU processes and this machine has no CUDA GPU: accelerate applies FSDP2 "
                         "only to GPU processes (on CPU the run would be plain DDP, every process holding the whole "
                         "model). Remove `fsdp` to train here (`--num-processes N` runs DDP over CPU processes), or "
                         "use `deepspeed: zero3`, which shards on CPU too.")
