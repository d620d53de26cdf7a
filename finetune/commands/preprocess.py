"""Tokenize and cache a recipe's datasets; print counts and, with --show N, decoded examples."""

from __future__ import annotations

import argparse

from finetune.commands.args import add_recipe_arguments
from finetune.contract import IGNORE_INDEX
from finetune.recipe_load import load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print N decoded training examples with the supervised spans in [[...]]")


def marked(tokenizer, input_ids: list[int], labels: list[int]) -> str:
    """Decode an example, wrapping each run of supervised tokens in [[ ]]."""
    out, run, supervised = [], [], False
    for token, label in zip(input_ids, labels):
        now = label != IGNORE_INDEX
        if now != supervised and run:
            text = tokenizer.decode(run)
            out.append(f"[[{text}]]" if supervised else text)
            run = []
        supervised = now
        run.append(token)
    if run:
        text = tokenizer.decode(run)
        out.append(f"[[{text}]]" if supervised else text)
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    recipe = load_recipe(args.recipe, args.overrides)
    tokenizer = load_tokenizer(recipe)
    prepared = build_dataset(recipe, tokenizer)
    s = prepared.stats
    print(f"cache: {prepared.cache_path}{' (reused)' if prepared.reused else ' (built)'}")
    print(f"records: {s['records']}; dropped: {s['dropped_too_long']} over sequence_len {recipe.sequence_len}, "
          f"{s['dropped_no_supervised_tokens']} with no supervised tokens; truncated: {s['truncated']}")
    for name in ("train", "eval"):
        part = s[name]
        print(f"{name}: {part['examples']} examples, {part['tokens']:,} tokens, "
              f"{part['supervised_tokens']:,} supervised")
    for i in range(min(args.show, len(prepared.train))):
        row = prepared.train[i]
        print(f"\n--- example {i} ({len(row['input_ids'])} tokens; supervised in [[ ]]) ---")
        print(marked(tokenizer, row["input_ids"], row["labels"]))
    return 0
