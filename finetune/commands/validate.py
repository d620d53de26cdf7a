"""Check a recipe: print it resolved, or every problem with its key, line and fix (exit 2), the model family's
refusals included (finetune/model/families.py: what `finetune train` refuses, in its words). A GRPO recipe's reward
functions also run on a few of its records, each in a worker with its timeout (exit 2 when one fails)."""

from __future__ import annotations

import argparse

from finetune.commands.args import add_recipe_arguments
from finetune.recipe.load import dump_recipe, load_recipe
from finetune.redact import redact_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--num-processes", type=int, default=None,
                        help="processes the run will use (for the global batch size check); default $WORLD_SIZE or 1")


def run(args: argparse.Namespace) -> int:
    from finetune.model.families import generic_path

    recipe = load_recipe(args.recipe, args.overrides, world_size=args.num_processes)
    generic_path(recipe, local_only=True)  # the family's refusal (packing it cannot isolate), in train's words
    print(redact_text(dump_recipe(recipe)), end="")  # a database URL's password is not echoed
    if recipe.method == "grpo":
        from finetune.train.grpo.reward_check import validate_rewards

        return validate_rewards(recipe)
    return 0
