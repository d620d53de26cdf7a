"""The prompt format a trained model is served with: the one its run trained with."""

from __future__ import annotations

import json
from pathlib import Path

# How a prompt is written for the model: the format the run trained with. A run on instruction records learned
# the alpaca prompt, one on completion text plain continuation; rendering their prompts with the tokenizer's chat
# template instead serves a format the model never saw.
FORMAT_FILE = "prompt_format.json"  # beside a merged model, which has no run.json


def served_format(folder: str | Path) -> tuple[str, str]:
    """("chat" | "alpaca" | "raw", why) for the model in `folder`: from its run.json (the record shapes the run
    trained on, `data.formats`), or the prompt_format.json a merge wrote; "chat" when neither says."""
    folder = Path(folder)
    if (folder / FORMAT_FILE).is_file():
        saved = json.loads((folder / FORMAT_FILE).read_text())
        return saved["format"], saved["why"]
    try:
        run = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return "chat", f"no run.json in {folder} says what the run trained on: the tokenizer's chat template"
    formats = set((run.get("data") or {}).get("formats") or ())
    if run.get("method", "sft") == "sft" and not formats:
        return "chat", "run.json does not record the record shapes (an older run): the tokenizer's chat template"
    return format_for(run.get("method", "sft"), formats)


def format_for(method: str, formats: set[str]) -> tuple[str, str]:
    """(format, why) for a run of `method` on records of `formats` (the record shapes it trained on)."""
    if method == "grpo":  # data.formats: "chat" for conversation prompts, "completion" for text ones
        if "completion" in formats and "chat" not in formats:
            return "raw", "a grpo run on text prompts: plain continuation, as it generated in training"
        return "chat", "a grpo run on conversation prompts: the chat template, as it generated in training"
    if method != "sft":
        return "chat", f"a {method} run: its pairs' prompts, through the chat template"
    if "chat" in formats:
        mixed = " (and instruction records, whose alpaca prompt --raw can take)" if "instruction" in formats else ""
        return "chat", f"the run trained on chat records{mixed}: the chat template"
    if "instruction" in formats:
        return "alpaca", "the run trained on instruction records: the alpaca prompt it learned"
    return "raw", "the run trained on completion text: plain continuation"
