"""How a record reads as text: the alpaca prompt of an instruction, the rendered chat with the character
span of each assistant turn, and the Example they become (`input_ids`, `labels`).

The supervised span of a chat is found from the rendered text, not by guessing token patterns: each
assistant turn's characters are located by rendering the conversation up to that turn (with and without
the generation prompt). finetune/data/encode.py then tokenizes the full text once with offsets and
supervises every token whose first character lies inside an assistant span. This works for any chat
template whose renderings of a growing conversation are prefixes of each other (but for the text the template
writes only to close a conversation, such as Phi-3's EOS: an earlier turn's span stops before it, the last turn's
keeps it), which is checked: a template that writes a turn differently once later turns follow (Qwen3's drops the
earlier turns' <think> blocks) is refused with where the renderings part.
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


def _render(tokenizer, messages: list[dict], generation_prompt: bool, tools=None) -> str:
    # `or None`: some templates write their tool boilerplate for an empty list
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], roles=("assistant",), tools=None
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character span of each turn of `roles` (the assistant's: its
    answer after the generation prompt, its tool calls included; another role's: the whole rendered turn, its header
    included). `tools`: the JSON schemas the template renders where it puts them (a tool transcript's); a `tool`
    turn, a result, is never among `roles`."""
    full = _render(tokenizer, messages, False, tools)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] not in roles:
            continue
        answer = message["role"] == "assistant"
        before = _render(tokenizer, messages[:i], answer, tools) if i else ""
        through = _render(tokenizer, messages[: i + 1], False, tools)
        end = _turn_end(tokenizer, full, through, _text(message.get("content")), len(before))
        if end is None or not through.startswith(before):
            raise DataError(misaligned_turn(full, through, before, sum(m["role"] == "assistant" for m in messages[:i + 1])))
        spans.append((len(before), end))
    return full, spans


def _text(content) -> str:
    """A message's text: the string, or its text parts joined (a vision record's content is a list of parts)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def _turn_end(tokenizer, full: str, through: str, content: str, start: int) -> int | None:
    """Where the turn rendered last (`through`) ends inside the whole conversation (`full`): all of it when `full`
    starts with it; else before the closing text, what the template writes only to close a conversation (Phi-3's
    EOS), which `full` ends with too. The closing text starts at the first token where the two renderings part
    (tokens, not characters: `<|endoftext|>` and `<|user|>` share their first two). None when the turn reads
    differently once later turns follow. `start`: where the turn begins; `content`: the answer, never closing."""
    if full.startswith(through):
        return len(through)
    ids = [tokenizer(text, add_special_tokens=False, return_offsets_mapping=True) for text in (full, through)]
    same = 0
    for a, b, place in zip(ids[0]["input_ids"], ids[1]["input_ids"], ids[1]["offset_mapping"]):
        if a != b:
            break
        same = place[1]
    closing = through[same:]
    if same < start or (content and content in closing) or not full.endswith(closing):
        return None
    return same


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def misaligned_turn(full: str, through: str, before: str, turn: int) -> str:
    """Why assistant turn `turn` (1-based) cannot be located: where its rendering as the last turn and the whole
    conversation part, and what to do."""
    common = len(_common_prefix(full, through if through.startswith(before) else before))
    alone, within = through[common:common + 60], full[common:common + 60]
    why = ("the chat template writes an assistant turn differently once later turns follow it, so the tokens it "
           f"would be trained on are not the ones the model produces when it answers: assistant turn {turn}, "
           f"rendered as the last turn, reads {alone!r} where the whole conversation reads {within!r}")
    if "<think>" in through[common:] or "<think>" in full[common:]:
        why += (" (this template drops the <think> reasoning of every assistant turn before the last user message, "
                "and writes the last turn's, empty or not: Qwen3's, DeepSeek-R1's)")
    return (why + ". Give each record one exchange (the conversation up to the assistant turn to train, one record "
            "per turn), or render with `chat_template: chatml` or a `chat_template: jinja` template that writes "
            "every turn the same wherever it stands")
