"""The reference encoder the tests hold production to: one record at a time, a Python loop per token.

Written for plainness, not speed, and on purpose apart from finetune/data/encode.py (the one encoder in
production): it finds the assistant turns of a chat itself, and masks token by token. It shares only the
alpaca prompt's text with production (a format, checked by hand in tests/test_formats.py).
benchmarks/bench_preprocess.py uses it as the plain per-record baseline.
"""

from __future__ import annotations

from finetune.contract import IGNORE_INDEX
from finetune.data.formats import Example, alpaca_prompt


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_completion(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    ids = _ids(tokenizer, record["text"], special=True) + [tokenizer.eos_token_id]
    return Example(ids, list(ids))


def encode_instruction(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    # the prompt and the response apart, as at inference time; EOS ends the response
    prompt_ids = _ids(tokenizer, alpaca_prompt(record), special=True)
    response_ids = _ids(tokenizer, record["output"], special=False) + [tokenizer.eos_token_id]
    prompt_labels = list(prompt_ids) if train_on_inputs else [IGNORE_INDEX] * len(prompt_ids)
    return Example(prompt_ids + response_ids, prompt_labels + list(response_ids))


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the [start, end) characters of each assistant turn: what rendering the turn
    adds after the prompt that asks for it."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(_render(tokenizer, messages[:i], generation_prompt=True)) if i else 0
            through = _render(tokenizer, messages[: i + 1], generation_prompt=False)
            assert full.startswith(through), "the oracle needs a prefix-stable chat template"
            spans.append((start, len(through)))
    return full, spans


def encode_chat(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    text, spans = _assistant_spans(tokenizer, record["messages"])
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if train_on_inputs:
        return Example(ids, list(ids))
    labels = []
    for token_id, (start, _end) in zip(ids, enc["offset_mapping"]):
        inside = any(lo <= start < hi for lo, hi in spans)
        labels.append(token_id if inside else IGNORE_INDEX)
    return Example(ids, labels)


ENCODERS = {"completion": encode_completion, "instruction": encode_instruction, "chat": encode_chat}


def encode(tokenizer, shape: str, record: dict, train_on_inputs: bool) -> Example:
    return ENCODERS[shape](tokenizer, record, train_on_inputs)
