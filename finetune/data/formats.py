"""Record -> tokenized example: `input_ids` and `labels`, with labels -100 on every token that is not
supervised (the prompt of an instruction, every non-assistant turn of a chat), unless train_on_inputs.

The supervised span of a chat is found from the rendered text, not by guessing token patterns: each
assistant turn's characters are located by rendering the conversation up to that turn (with and without
the generation prompt), then the full text is tokenized once with offsets and every token whose first
character lies inside an assistant span is supervised. This works for any chat template whose renderings
of a growing conversation are prefixes of each other, which is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import DataError

IGNORE_INDEX = -100

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

# ChatML, used when the tokenizer has no template of its own (and on request).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]

    @property
    def supervised_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def alpaca_prompt(record: dict) -> str:
    if (record.get("input") or "").strip():
        return ALPACA_WITH_INPUT.format(instruction=record["instruction"], input=record["input"])
    return ALPACA_NO_INPUT.format(instruction=record["instruction"])


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_completion(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    ids = _ids(tokenizer, record["text"], special=True) + [tokenizer.eos_token_id]
    return Example(ids, list(ids))


def encode_instruction(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    # The prompt and the response are tokenized apart, exactly as at inference time, where the model
    # sees the prompt's tokens and then generates; EOS ends the response so the model learns to stop.
    prompt_ids = _ids(tokenizer, alpaca_prompt(record), special=True)
    response_ids = _ids(tokenizer, record["output"], special=False) + [tokenizer.eos_token_id]
    prompt_labels = list(prompt_ids) if train_on_inputs else [IGNORE_INDEX] * len(prompt_ids)
    return Example(prompt_ids + response_ids, prompt_labels + list(response_ids))


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character span of each assistant turn."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        through = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if not (full.startswith(through) and through.startswith(before)):
            raise DataError(
                "the chat template does not render a growing conversation as a prefix of the whole one, "
                "so the assistant turns cannot be located; use `chat_template: chatml` or a template "
                "without per-position content"
            )
        spans.append((len(before), len(through)))
    return full, spans


def encode_chat(tokenizer, record: dict, train_on_inputs: bool) -> Example:
    text, spans = assistant_spans(tokenizer, record["messages"])
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
