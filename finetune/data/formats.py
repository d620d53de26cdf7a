"""How a record reads as text: the alpaca prompt of an instruction, the rendered chat with the character
span of each assistant turn, and the Example they become (`input_ids`, `labels`).

The supervised span of a chat is found from the rendered text, not by guessing token patterns: each
assistant turn's characters are located by rendering the conversation up to that turn (with and without
the generation prompt). finetune/data/encode.py then tokenizes the full text once with offsets and
supervises every token whose first character lies inside an assistant span. This works for any chat
template whose renderings of a growing conversation are prefixes of each other, which is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from finetune.contract import ALPACA_NO_INPUT, ALPACA_WITH_INPUT, IGNORE_INDEX, alpaca_prompt
from finetune.errors import DataError

# The alpaca template lives in finetune/contract.py (ingestion renders preference prompts with it too);
# re-exported here, where the data stage and its tests have always imported it.
__all__ = ["ALPACA_NO_INPUT", "ALPACA_WITH_INPUT", "Example", "alpaca_prompt", "assistant_spans"]


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    images: list[dict] = field(default_factory=list)  # the record's image parts, in order (vision-language models)
    image_tokens: int = 0  # tokens the images became: image tokens and their boundaries (never supervised)

    @property
    def supervised_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], roles=("assistant",)) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character span of each turn of `roles` (the assistant's: its
    answer after the generation prompt; another role's: the whole rendered turn, its header included)."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] not in roles:
            continue
        answer = message["role"] == "assistant"
        before = _render(tokenizer, messages[:i], generation_prompt=answer) if i else ""
        through = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if not (full.startswith(through) and through.startswith(before)):
            raise DataError(
                "the chat template does not render a growing conversation as a prefix of the whole one, "
                "so the assistant turns cannot be located; use `chat_template: chatml` or a template "
                "without per-position content"
            )
        spans.append((len(before), len(through)))
    return full, spans
