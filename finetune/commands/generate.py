"""Generate a reply to one prompt with the trained model (the adapter in the recipe's output_dir).

    finetune generate recipe.yml --prompt "What is LoRA?"
    finetune generate outputs/run --prompt "Once upon a time" --raw --max-new-tokens 64
"""

from __future__ import annotations

import argparse

from finetune.commands.args import add_overrides


def add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """Shared by `chat` and `generate`."""
    parser.add_argument("target", metavar="RECIPE_OR_DIR",
                        help="a recipe (uses its output_dir), an adapter folder or a model folder")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="longest reply, in tokens (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sample")
    parser.add_argument("--system", default=None, help="a system message to start the conversation with")
    parser.add_argument("--raw", action="store_true", help="plain text continuation: no chat template")
    add_overrides(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_generation_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the user message (or, with --raw, the text to continue)")


def first_messages(args: argparse.Namespace) -> list[dict]:
    return [{"role": "system", "content": args.system}] if args.system else []


def prompt_format(args: argparse.Namespace) -> str:
    """The format the run trained with (or --raw), said once on stderr, so nobody is served another silently."""
    import sys

    from finetune.model.inference import served_format_of

    if args.raw:
        return "raw"
    name, why = served_format_of(args.target, args.overrides)
    system = ""
    if name == "alpaca" and args.system:
        system = "; --system is not used: the alpaca prompt has no system message"
    print(f"prompt format: {name} ({why}){system}", file=sys.stderr)
    return name


def run(args: argparse.Namespace) -> int:
    from finetune.model.inference import load_for_inference, reply

    model, tokenizer = load_for_inference(args.target, args.overrides)
    fmt = prompt_format(args)
    messages = first_messages(args) + [{"role": "user", "content": args.prompt}]
    print(reply(model, tokenizer, messages, args.max_new_tokens, args.temperature, use_template=fmt != "raw",
                prompt_format=fmt))
    return 0
