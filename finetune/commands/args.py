"""The one way a verb takes a recipe: its path and `--set KEY=VALUE` overrides."""

from __future__ import annotations

import argparse


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE` (repeatable): the one declaration every verb that can read a recipe uses."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe key (YAML value), e.g. --set learning_rate=1e-4 --set datasets.0.path=x.jsonl",
    )


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe path and `--set KEY=VALUE` overrides, for verbs whose input is always a recipe."""
    parser.add_argument("recipe", help="path to the YAML recipe")
    add_overrides(parser)
