"""Merge a trained LoRA / QLoRA adapter into its base model: a plain HF model in full precision.

    finetune merge recipe.yml                  # the adapter in output_dir -> output_dir/merged
    finetune merge outputs/run --output merged # an adapter folder
"""

from __future__ import annotations

import argparse
from pathlib import Path

from finetune.commands.args import add_overrides
from finetune.log import get_logger


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RECIPE_OR_ADAPTER_DIR",
                        help="a recipe (its output_dir holds the adapter) or an adapter folder")
    parser.add_argument("--output", default=None, help="where to write the merged model (default: ADAPTER_DIR/merged)")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="precision of the merged weights (default fp32; the base is loaded unquantized)")
    add_overrides(parser)


def run(args: argparse.Namespace) -> int:
    from finetune.export.merge import merge_adapter
    from finetune.model.trained import locate

    trained = locate(args.target, args.overrides)
    out_dir = Path(args.output) if args.output else trained.folder / "merged"
    get_logger(__name__).info(f"merging {trained.folder} into its base {trained.base_source} ({args.dtype}, "
                              "unquantized)")
    merge_adapter(trained, out_dir, args.dtype)
    print(out_dir)
    return 0
