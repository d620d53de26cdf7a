"""Generate a reply to one prompt with the trained model (the adapter in the recipe's output_dir).

    finetune generate recipe.yml --prompt "What is LoRA?"
    finetune generate outputs/run --prompt "Once upon a time" --raw --max-new-tokens 64
    finetune generate outputs/vlm --image photo.jpg --prompt "What colour is the car?"   # a vision-language run
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
    parser.add_argument("--image", action="append", default=[], metavar="PATH",
                        help="an image shown with the (first) message, for a vision-language run; repeat for several")
    add_overrides(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_generation_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the user message (or, with --raw, the text to continue)")


def first_messages(args: argparse.Namespace) -> list[dict]:
    return [{"role": "system", "content": args.system}] if args.system else []


def images_of(args: argparse.Namespace) -> tuple[list[dict], tuple]:
    """(the --image files as image parts, the run's pixel budget), checked before any model loads."""
    from finetune.errors import FinetuneError
    from finetune.model.trained import locate
    from finetune.model.vision_prompt import image_part, run_pixel_budget

    if not args.image:
        return [], (None, None)
    trained = locate(args.target, args.overrides)
    if not trained.vision:
        raise FinetuneError(f"--image: `{args.target}` holds a text model's run, which reads no images; --image is "
                            "for a run whose base_model is a vision-language model (docs/vision.md)")
    if args.raw:
        raise FinetuneError("--image with --raw: plain text has no place for an image; the chat template places "
                            "images, so leave out --raw")
    return [image_part(path) for path in args.image], run_pixel_budget(trained)


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

    from finetune.model.vision_prompt import with_images

    images, pixels = images_of(args)
    model, tokenizer = load_for_inference(args.target, args.overrides)
    fmt = prompt_format(args)
    messages = first_messages(args) + [{"role": "user", "content": with_images(args.prompt, images)}]
    print(reply(model, tokenizer, messages, args.max_new_tokens, args.temperature, use_template=fmt != "raw",
                prompt_format=fmt, pixels=pixels))
    return 0
