"""Check a recipe: print it resolved, or every problem with its key, line and fix (exit 2), the model family's
refusals included (finetune/model/families.py: what `finetune train` refuses, in its words); then whether this machine
can train it (finetune/train/preflight.py: every problem at once; `--recipe-only` skips it). A GRPO recipe's reward
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
    parser.add_argument("--recipe-only", action="store_true",
                        help="check the recipe alone, not whether this machine can train it (CUDA for `fsdp`, "
                             "flash-attn, DeepSpeed, the hub or its cache for hub ids, lm-eval's task names)")


def run(args: argparse.Namespace) -> int:
    from finetune.model.families import declared_config, generic_path

    recipe = load_recipe(args.recipe, args.overrides, world_size=args.num_processes)
    config = declared_config(recipe)  # config.json as JSON: validate imports no transformers
    if config is not None:
        generic_path(recipe, config)  # the family's refusal (packing it cannot isolate), in train's words
    if not args.recipe_only:
        from finetune.train.preflight import check_machine

        check_machine(recipe, str(args.recipe), hint="(`finetune validate --recipe-only` checks the recipe alone)")
    print(redact_text(dump_recipe(recipe)), end="")  # a database URL's password is not echoed
    if recipe.method == "grpo":
        from finetune.train.grpo.agent_check import uses_agents, validate_agents
        from finetune.train.grpo.reward_check import validate_rewards

        code = validate_rewards(recipe) if recipe.rewards else 0
        if uses_agents(recipe):
            from finetune.data.grpo.prompts import first_records

            code = max(code, validate_agents(recipe, first_records(recipe, 3)))
        return code
    if recipe.method == "sft":
        from finetune.data.tool_chat import validate_transcripts
        from finetune.model.loader import load_tokenizer

        return validate_transcripts(recipe, load_tokenizer)
    return 0
