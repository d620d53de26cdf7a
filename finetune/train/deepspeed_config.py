"""The DeepSpeed JSON as the Trainer gets it: read once the recipe was checked, "auto" values resolved.

Finding the JSON (a shipped config by name, or a path) and checking it against the recipe live in
finetune/recipe/checks.py, below every stage, because load_recipe runs those checks; they are re-exported
here for the run.
"""

from __future__ import annotations

from finetune.recipe.checks import (  # noqa: F401 (the names the run and others import from here)
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
