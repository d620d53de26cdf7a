"""The LR formula applied to a recipe and its tokenized data (no torch: counts in, LrPlan out).

train.py calls resolve_learning_rate() once the data is prepared; `finetune lr recipe.yml` prints the same.
"""

from __future__ import annotations

from finetune.errors import RecipeError
from finetune.plan.lr import LrPlan, find_family, plan_learning_rate
from finetune.plan.steps import optimizer_steps


def base_lr_for(recipe) -> tuple[float, int, str]:
    """(base LR, pretraining batch tokens, source): from the recipe's lr_base / lr_pretrained_batch_tokens,
    else the family table row matching base_model."""
    family = find_family(recipe.base_model)
    base_lr = recipe.lr_base if recipe.lr_base is not None else (family.base_lr if family else None)
    batch = (recipe.lr_pretrained_batch_tokens if recipe.lr_pretrained_batch_tokens is not None
             else (family.pretrained_batch_tokens if family else None))
    if base_lr is None or batch is None:
        missing = [k for k, v in (("lr_base", base_lr), ("lr_pretrained_batch_tokens", batch)) if v is None]
        raise RecipeError([
            f"`learning_rate: auto` needs {' and '.join(f'`{k}`' for k in missing)}: `{recipe.base_model}` is not in "
            "the model family table (docs/planning.md). Set them from the base model's paper, e.g. "
            "lr_base: 3.0e-4 and lr_pretrained_batch_tokens: 4000000 for Llama 2 7B, or give a number for learning_rate"
        ])
    if recipe.lr_base is not None and recipe.lr_pretrained_batch_tokens is not None:
        source = "recipe (lr_base, lr_pretrained_batch_tokens)"
    elif recipe.lr_base is None and recipe.lr_pretrained_batch_tokens is None:
        source = f"{family.name}: {family.source}"
    else:
        source = f"recipe and {family.name}: {family.source}"
    return base_lr, batch, source


def lr_plan_for_recipe(recipe, train_examples: int, supervised_tokens: int, world_size: int = 1) -> LrPlan:
    """The formula over the recipe's exact optimizer steps and the training split's supervised tokens."""
    total_steps = optimizer_steps(train_examples, recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                                  world_size, recipe.num_epochs, recipe.max_steps)
    # With max_steps the run covers total_steps / steps-per-epoch passes, not num_epochs.
    per_epoch = optimizer_steps(train_examples, recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                                world_size, 1, None)
    epochs = recipe.num_epochs if recipe.max_steps is None else total_steps / per_epoch
    base_lr, batch, source = base_lr_for(recipe)
    return plan_learning_rate(supervised_tokens, total_steps, epochs, base_lr, batch, source)


def resolve_learning_rate(recipe, train_stats: dict, world_size: int = 1) -> tuple[float, LrPlan | None]:
    """(learning rate to train with, the plan when it was derived). `train_stats` is
    Prepared.stats["train"]: {"examples", "tokens", "supervised_tokens"}."""
    if recipe.learning_rate != "auto":
        return float(recipe.learning_rate), None
    plan = lr_plan_for_recipe(recipe, train_stats["examples"], train_stats["supervised_tokens"], world_size)
    return plan.learning_rate, plan
