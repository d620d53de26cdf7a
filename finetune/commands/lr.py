"""Learning rate from supervised tokens per step: lr = base_lr x sqrt(tokens per step / pretraining batch tokens).

    finetune lr recipe.yml                       # tokenizes (cached), counts exactly, the formula beside the recipe's LR
    finetune lr recipe.yml --family llama-2-7b   # take the base LR and batch from a family table row
    finetune lr --supervised-tokens 2000000 --steps 350 --epochs 1 --base-lr 5e-5 --pretrained-batch-tokens 4000000
    finetune lr --method dpo                     # preference methods, GRPO: the published defaults with sources

A preference recipe (`method: dpo`...) or a GRPO one gets the method's published default instead of the formula
(finetune/plan/lr_preference.py); `finetune lr recipe.yml` shows it with its sources beside the recipe's LR.
"""

from __future__ import annotations

import argparse

from finetune.commands.args import add_overrides
from finetune.errors import FinetuneError
from finetune.plan.lr import FAMILIES, family_by_name, format_lr, plan_learning_rate
from finetune.plan.lr_preference import METHOD_LRS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="a YAML recipe (omit to work from the numbers below)")
    add_overrides(parser)
    parser.add_argument("--num-processes", type=int, default=None, help="processes the run will use (default 1)")
    parser.add_argument("--supervised-tokens", type=int, help="total supervised (label != -100) tokens in the data")
    parser.add_argument("--steps", type=int, help="total optimizer steps")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs those steps cover (default 1)")
    parser.add_argument("--base-lr", type=float, help="the base model's pretraining peak LR (overrides the recipe)")
    parser.add_argument("--pretrained-batch-tokens", type=int,
                        help="the pretraining global batch, in tokens (overrides the recipe)")
    parser.add_argument("--family", help="take base LR and batch from the family table (see --list-families)")
    parser.add_argument("--list-families", action="store_true", help="print the family table with sources")
    parser.add_argument("--method", choices=sorted(METHOD_LRS),
                        help="without a recipe: print a preference method's or GRPO's default LRs (full, LoRA) "
                             "with sources")
    parser.add_argument("--verbose", "-v", action="store_true", help="show the working, not just the LR")


def _list_families() -> None:
    for f in FAMILIES:
        print(f"{f.name:<16} base_lr {f.base_lr:<8.2g} batch {f.pretrained_batch_tokens:>10,} tokens   {f.source}")


def _from_numbers(args: argparse.Namespace):
    base_lr, batch, source = args.base_lr, args.pretrained_batch_tokens, "command line"
    if args.family:
        family = family_by_name(args.family)
        base_lr = base_lr if base_lr is not None else family.base_lr
        batch = batch if batch is not None else family.pretrained_batch_tokens
        source = family.source
    missing = [flag for flag, value in (("--supervised-tokens", args.supervised_tokens), ("--steps", args.steps),
                                        ("--base-lr", base_lr), ("--pretrained-batch-tokens", batch)) if value is None]
    if missing:
        raise FinetuneError(
            f"missing {', '.join(missing)}. Give a recipe (`finetune lr recipe.yml`) or all of --supervised-tokens, "
            "--steps, --base-lr and --pretrained-batch-tokens (or --family NAME for the last two)."
        )
    return plan_learning_rate(args.supervised_tokens, args.steps, args.epochs, base_lr, batch, source)


def _recipe_counts(args: argparse.Namespace):
    """(recipe, training split counts, world size): the data tokenized (cached) as training will see it."""
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor
    from finetune.recipe import load_recipe

    world_size = args.num_processes or 1
    recipe = load_recipe(args.recipe, args.overrides, world_size=world_size)
    prepared = build_dataset(recipe, *tokenizer_and_processor(recipe))  # a vision model's image tokens apart
    return recipe, prepared.train_counts(), world_size  # packed rows with sample_packing: what steps are made of


def _from_recipe(args: argparse.Namespace):
    """The LrPlan `learning_rate: auto` would train with (RecipeError when the recipe cannot say)."""
    from finetune.plan.lr_recipe import lr_plan_for_recipe

    recipe, train, world_size = _recipe_counts(args)
    return lr_plan_for_recipe(recipe, train["examples"], train["supervised_tokens"], world_size)


def _method_defaults(method: str) -> None:
    row = METHOD_LRS[method]
    print(f"{method} full fine-tune   {format_lr(row.full)}   ({row.full_source})")
    print(f"{method} LoRA / QLoRA     {format_lr(row.lora)}   ({row.lora_source})")
    print(f"usual range        {row.usual}")


def _report(args: argparse.Namespace) -> int:
    from finetune.plan.lr_recipe import base_inputs, base_lr_for, preference_lr_report, recipe_lr_report

    recipe, train, world_size = _recipe_counts(args)
    if recipe.method != "sft":
        if args.family or args.base_lr is not None or args.pretrained_batch_tokens is not None:
            print(f"note: --family / --base-lr / --pretrained-batch-tokens feed the SFT formula, which `method: "
                  f"{recipe.method}` does not use; they are ignored")
        print(f"recipe                     {args.recipe}   (method: {recipe.method}, adapter: {recipe.adapter}, "
              f"base_model: {recipe.base_model})")
        print("\n".join(preference_lr_report(recipe, train["examples"], world_size)))
        print("\n".join(_variant_lines(recipe, train, world_size)))
        return 0
    inputs = base_inputs(recipe, args.base_lr, args.pretrained_batch_tokens, args.family)
    print(f"recipe                     {args.recipe}   (adapter: {recipe.adapter}, base_model: {recipe.base_model})")
    print("\n".join(recipe_lr_report(recipe, train["examples"], train["supervised_tokens"], world_size, inputs)))
    print("\n".join(_variant_lines(recipe, train, world_size)))
    if recipe.learning_rate == "auto":
        base_lr_for(recipe)  # the recipe cannot train as written: the same RecipeError (exit 2) training raises
    return 0


def _variant_lines(recipe, train: dict, world_size: int) -> list[str]:
    """The LoRA variants' effect on the learning rate training will use (plan/lr_lora.py)."""
    from finetune.errors import FinetuneError
    from finetune.plan.lr_lora import lora_variant_lines
    from finetune.plan.lr_recipe import resolve_learning_rate

    try:
        lr = resolve_learning_rate(recipe, train, world_size)[0]
    except FinetuneError:  # an `auto` the recipe cannot resolve: the report above says why
        lr = None
    return lora_variant_lines(recipe, lr)


def run(args: argparse.Namespace) -> int:
    if args.list_families:
        _list_families()
        return 0
    if args.method and not args.recipe:
        _method_defaults(args.method)
        return 0
    if args.recipe:
        return _report(args)
    plan = _from_numbers(args)
    print(plan.describe() if args.verbose else format_lr(plan.learning_rate))
    return 0
