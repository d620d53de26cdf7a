"""The DeepSpeed JSON as the Trainer gets it: read once the recipe was checked, "auto" values resolved.

Finding the JSON (a shipped config by name, or a path) and checking it against the recipe live in
finetune/recipe_checks.py, below every stage, because load_recipe runs those checks; they are re-exported
here for the run.
"""

from __future__ import annotations

from finetune.recipe_checks import (  # noqa: F401 (the names the run and others import from here)
    SHIPPED,
    deepspeed_problems,
    read_deepspeed_config,
    resolve_deepspeed,
    shipped_path,
    zero_stage,
)


def trainer_deepspeed_config(path: str) -> dict:
    """The config handed to TrainingArguments(deepspeed=...).

    An "auto" train_batch_size is left out for DeepSpeed to derive (micro batch x accumulation x processes):
    transformers 5 fills "auto" values before its process group exists, so it would count one process and
    DeepSpeed would then refuse the batch sizes on any run with several.
    """
    config, problem = read_deepspeed_config(path)
    if problem:  # the recipe was checked when loaded; this is a file changed since
        from finetune.errors import RecipeError

        raise RecipeError([problem], path)
    if config.get("train_batch_size") == "auto":
        del config["train_batch_size"]
    return config


def fill_resolved_learning_rate(args, path: str) -> None:
    """Put the learning rate run_training resolved (`learning_rate: auto` needs the data counted) where the
    JSON says "auto": TrainingArguments filled those earlier, with the placeholder it was built with."""
    hf_config = getattr(args, "hf_deepspeed_config", None)
    original, _ = read_deepspeed_config(path)
    if hf_config is None or original is None:
        return
    for section, key in (("optimizer", "lr"), ("scheduler", "warmup_max_lr")):
        if ((original.get(section) or {}).get("params") or {}).get(key) == "auto":
            hf_config.config[section]["params"][key] = args.learning_rate


def weights_partitioned() -> bool:
    """True under ZeRO-3 (transformers loaded each rank's shard only): a forward pass must wait for the
    DeepSpeed engine, which gathers the weights layer by layer."""
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:
        return False
    return is_deepspeed_zero3_enabled()
