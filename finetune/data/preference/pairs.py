"""Preference records -> tokenized pairs (`prompt_ids`, `chosen_ids`, `rejected_ids`) or, for KTO, unpaired
examples (`prompt_ids`, `completion_ids`, `label`).

One render, one split, no drift. A conversational record is rendered ONCE per response through the chat
template, prompt and response together, and tokenized once; the prompt is the generation-prompt rendering
of the prompt messages, which must be a character prefix of the whole rendering (checked, never searched
for), and its tokens must be exactly the first tokens of the whole (a token-prefix check: a tokenizer that
merges characters across the boundary is refused with one message, where TRL warns and trains on a prompt
it never sees at inference). The response is everything after it: the answer and the template's end of
turn (`<|im_end|>` and its newline in ChatML), all supervised, as the SFT chat encoder supervises an
assistant turn. BOS appears once: the template writes it (the text is tokenized without special tokens).

A plain-text record is encoded as an SFT instruction is: the prompt with the tokenizer's special tokens
(its BOS), the response without, then EOS; the model sees at inference exactly the prompt's tokens.

Too long (prompt + the longer response over `sequence_len`): `drop` drops the pair, `error` stops, and
`truncate` cuts the prompt from its START (the BOS stays), never the assistant header at its end and never
a response; a pair whose response alone leaves no room for the header is dropped. Every drop is counted
and the first few are listed (file and record number) in the data stats.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from finetune.errors import DataError

LISTED_DROPS = 20  # how many dropped records the stats name


@dataclass
class Pair:
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    margin: float | None = None  # `method: reward` with a `margin` column: how much better chosen is (else None)

    def responses(self) -> list[list[int]]:
        return [self.chosen_ids, self.rejected_ids]


@dataclass
class Unpaired:
    prompt_ids: list[int]
    completion_ids: list[int]
    label: bool

    def responses(self) -> list[list[int]]:
        return [self.completion_ids]


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


class Renderer:
    """Turns a canonical prompt and responses (finetune/ingest/preference.py) into token ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._header = None

    def header_tokens(self) -> int:
        """Tokens of the assistant header the template adds as the generation prompt (0 for plain text)."""
        if self._header is None:
            probe = [{"role": "user", "content": "x"}]
            header = _render(self.tokenizer, probe, True)[len(_render(self.tokenizer, probe, False)):]
            self._header = len(self.tokenizer(header, add_special_tokens=False)["input_ids"])
        return self._header

    def plain(self, prompt: str, responses: list[str]) -> tuple[list[int], list[list[int]]]:
        ids = self.tokenizer([prompt], add_special_tokens=True)["input_ids"][0]
        answers = self.tokenizer(responses, add_special_tokens=False)["input_ids"]
        return list(ids), [list(a) + [self.eos] for a in answers]

    def chat(self, prompt: list[dict], responses: list[list[dict]]) -> tuple[list[int], list[list[int]]]:
        prompt_text = _render(self.tokenizer, prompt, True)
        wholes = [_render(self.tokenizer, prompt + response, False) for response in responses]
        for whole in wholes:
            if not whole.startswith(prompt_text):
                raise DataError(
                    "the chat template renders the prompt differently on its own (with the generation prompt) than "
                    "followed by the response, so the response cannot be split off exactly; use `chat_template: "
                    "chatml`, or a template whose generation prompt is the start of the assistant turn"
                )
        prompt_ids = self.tokenizer([prompt_text], add_special_tokens=False)["input_ids"][0]
        encoded = self.tokenizer(wholes, add_special_tokens=False)["input_ids"]
        n = len(prompt_ids)
        for ids in encoded:
            if list(ids[:n]) != list(prompt_ids):
                raise DataError(
                    "the tokenizer merges characters across the end of the prompt and the start of the response, so "
                    "the prompt's tokens alone differ from its tokens followed by a response: training would see a "
                    "prompt the model never sees at inference. Use a chat template whose generation prompt ends on "
                    "a token boundary (e.g. a newline, as ChatML does)"
                )
        return list(prompt_ids), [list(ids[n:]) for ids in encoded]

    def encode(self, prompt, responses: list) -> tuple[list[int], list[list[int]]]:
        return self.chat(prompt, responses) if isinstance(prompt, list) else self.plain(prompt, responses)


def fit(prompt_ids: list[int], responses: list[list[int]], recipe, header: int, bos) -> tuple[list[int] | None, str | None]:
    """excess_length_strategy for a prompt and its responses: (prompt ids, what happened), None when dropped."""
    longest = max(len(r) for r in responses)
    if len(prompt_ids) + longest <= recipe.sequence_len:
        return prompt_ids, None
    if recipe.excess_length_strategy == "error":
        raise DataError(
            f"a preference record has {len(prompt_ids)} prompt tokens and a {longest}-token response, over "
            f"sequence_len {recipe.sequence_len}; raise `sequence_len`, or set `excess_length_strategy: drop` or "
            "`truncate` (which cuts the prompt from its start)"
        )
    if recipe.excess_length_strategy == "drop":
        return None, "too_long"
    keep_bos = int(bos is not None and len(prompt_ids) > 0 and prompt_ids[0] == bos)
    room = recipe.sequence_len - longest  # prompt tokens that fit
    if room < header + keep_bos + 1:  # not even the assistant header and one token of the prompt
        return None, "response_too_long"
    kept = prompt_ids[len(prompt_ids) - (room - keep_bos):]
    return prompt_ids[:keep_bos] + kept, "truncated"


def _pair_texts(record: dict, method: str):
    """(prompt, responses, label) items of one canonical record, as the method reads it."""
    if "completion" in record:
        return [(record["prompt"], [record["completion"]], bool(record["label"]))]
    if method == "kto":  # a pair is two unpaired examples: chosen desirable, rejected undesirable
        return [(record["prompt"], [record["chosen"]], True), (record["prompt"], [record["rejected"]], False)]
    return [(record["prompt"], [record["chosen"], record["rejected"]], None)]


def _with_margins(items: list, margins: list) -> None:
    """`method: reward`: each pair's margin when any record has one (0 for a record without: TRL needs the column
    whole); nothing when none has one."""
    if any(m is not None for m in margins):
        for item, margin in zip(items, margins):
            item.margin = 0.0 if margin is None else float(margin)


def tokenize_preferences(recipe, tokenizer, files: list[tuple[str, str]], records: list | None = None
                         ) -> tuple[list, dict]:
    """Every record of every file -> Pair (or Unpaired for KTO), fitted to sequence_len; with the outcome counts.
    `records`: a list that receives the (shape, record) of each kept item, in step with the items (evaluation
    shows the held-out pairs' texts)."""
    from finetune.data.dedup import recipe_records
    from finetune.recipe.methods import shapes_for

    renderer = Renderer(tokenizer)
    items, outcome, listed, margins, formats = [], Counter(), [], [], Counter()
    for _, path, number, (found, record) in recipe_records(files, recipe.dataset_exact_deduplication, outcome):
        if found not in shapes_for(recipe.method):
            raise DataError(
                f"`{path}` record {number} is a {found} record; `method: {recipe.method}` trains on "
                f"{' or '.join(shapes_for(recipe.method))} records ({{prompt, chosen, rejected}}"
                f"{'; one example: {prompt, completion, label} or {messages, label}' if recipe.method == 'kto' else ''}"
                ": docs/preference.md). "
                "Point the dataset at preference data, or set `method: sft` for this file"
            )
        outcome["records"] += 1
        formats["chat" if isinstance(record["prompt"], list) else "completion"] += 1  # conversations or plain text
        for prompt, responses, label in _pair_texts(record, recipe.method):
            prompt_ids, answers = renderer.encode(prompt, responses)
            header = renderer.header_tokens() if isinstance(prompt, list) else 0
            prompt_ids, what = fit(prompt_ids, answers, recipe, header, tokenizer.bos_token_id)
            if what:
                outcome[what] += 1
            if prompt_ids is None:
                if len(listed) < LISTED_DROPS:
                    listed.append(f"{path} record {number}: {what}")
                continue
            items.append(Pair(prompt_ids, *answers) if label is None else Unpaired(prompt_ids, answers[0], label))
            margins.append(record.get("margin") if recipe.method == "reward" else None)
            if records is not None:
                records.append((found, record))
    outcome_dict = dict(outcome)
    outcome_dict["dropped_listed"] = listed
    outcome_dict["formats"] = dict(formats)
    if not items:
        raise DataError(
            f"no usable preference examples: {outcome['records']} records, {outcome['too_long']} over sequence_len "
            f"{recipe.sequence_len}, {outcome['response_too_long']} whose response alone leaves no room for the "
            "prompt; raise `sequence_len` or set `excess_length_strategy: truncate`"
        )
    if recipe.method == "kto":
        check_labels(items)
    _with_margins(items, margins)
    return items, outcome_dict


def check_labels(items: list[Unpaired]) -> None:
    labels = Counter(item.label for item in items)
    if len(labels) < 2:
        only = "desirable (label true)" if True in labels else "undesirable (label false)"
        raise DataError(
            f"every KTO example is {only}: KTO learns from the contrast between desirable and undesirable "
            "completions, so it needs both labels; add examples of the other label, or use pairs "
            "({prompt, chosen, rejected}), which KTO reads as one of each"
        )


def item_stats(items: list) -> dict:
    """Counts the planner and the logs read: `examples` (pairs, or unpaired examples), `tokens` (every sequence
    the model reads: prompt + response, per response), `supervised_tokens` (response tokens)."""
    tokens = supervised = 0
    for item in items:
        for response in item.responses():
            tokens += len(item.prompt_ids) + len(response)
            supervised += len(response)
    stats = {"examples": len(items), "tokens": tokens, "supervised_tokens": supervised}
    if items and isinstance(items[0], Unpaired):
        stats["desirable"] = sum(1 for item in items if item.label)
        stats["undesirable"] = len(items) - stats["desirable"]
    return stats


def to_dataset(items: list):
    from datasets import Dataset

    if items and isinstance(items[0], Unpaired):
        return Dataset.from_dict({"prompt_ids": [i.prompt_ids for i in items],
                                  "completion_ids": [i.completion_ids for i in items],
                                  "label": [i.label for i in items]})
    columns = {"prompt_ids": [i.prompt_ids for i in items], "chosen_ids": [i.chosen_ids for i in items],
               "rejected_ids": [i.rejected_ids for i in items]}
    if items and items[0].margin is not None:
        columns["margin"] = [i.margin for i in items]
    return Dataset.from_dict(columns)
