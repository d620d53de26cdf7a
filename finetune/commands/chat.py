"""Chat with the trained model: one message a line on stdin, the reply on stdout, in the prompt format the run
trained with (the chat template; the alpaca prompt for a run on instruction records, one message at a time).

    finetune chat recipe.yml
    echo "hello" | finetune chat outputs/run
    finetune chat outputs/vlm --image photo.jpg     # a vision-language run: the images go with the first message

`/reset` starts a new conversation; `/exit` or end of input (Ctrl-D) quits.
"""

from __future__ import annotations

import argparse
import sys

from finetune.commands.generate import add_generation_arguments, first_messages, images_of, prompt_format


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_generation_arguments(parser)


def read_line(interactive: bool) -> str | None:
    try:
        line = input("you> ") if interactive else sys.stdin.readline()
    except EOFError:
        return None
    if not interactive and line == "":
        return None
    return line.strip()


def run(args: argparse.Namespace) -> int:
    from finetune.model.inference import load_for_inference, reply
    from finetune.model.vision_prompt import with_images

    images, pixels = images_of(args)
    model, tokenizer = load_for_inference(args.target, args.overrides)
    fmt = prompt_format(args)  # alpaca: each message is prompted on its own, as the run's instructions were
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat: /reset starts over, /exit or Ctrl-D quits", file=sys.stderr)
    messages = first_messages(args)
    while (line := read_line(interactive)) is not None:
        if line == "/exit":
            break
        if line == "/reset":
            messages = first_messages(args)
            continue
        if not line:
            continue
        first = not any(m["role"] == "user" for m in messages)  # a new conversation shows the images again
        messages.append({"role": "user", "content": with_images(line, images if first else [])})
        answer = reply(model, tokenizer, messages, args.max_new_tokens, args.temperature, use_template=fmt != "raw",
                       prompt_format=fmt, pixels=pixels)
        messages.append({"role": "assistant", "content": answer})
        print(f"assistant> {answer}" if interactive else answer, flush=True)
    return 0
