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

A vision-language model (a processor): the prompt's images (ingestion keeps them in the prompt's user turns,
never in an answer) are expanded into the family's image tokens in the prompt and in each whole, through the
processor (finetune/data/vision/pairs.py), and the same prefix checks hold; every response token is text, so no
image token is ever scored. An image the processor cannot use is a counted reject (`image:` + its reason).

Too long (prompt + the longer response over `sequence_len`): `drop` drops the pair, `error` stops, and
`truncate` cuts the prompt from its START (the BOS stays), never the assistant header at its end and never
a response; a pair whose response alone leaves no room for the header is dropped, and a prompt with images is
never cut (dropped: `image:too_long_with_images`). Every drop is counted and the first few are listed (file and
record number) in the data stats.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from finetune.errors import DataError

LISTED_DROPS = 20  # how many dropped records the stats name


@dataclass
class Pair:
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    images: list[dict] = field(default_factory=list)  # the prompt's image parts (a vision-language model)
    image_tokens: int = 0  # of the prompt's tokens, those the images became
    margin: float | None = None  # `method: reward` with a `margin` column: how much better chosen is (else None)

    def responses(self) -> list[list[int]]:
        return [self.chosen_ids, self.rejected_ids]


@dataclass
class Unpaired:
    prompt_ids: list[int]
    completion_ids: list[int]
    label: bool
    images: list[dict] = field(default_factory=list)
    image_tokens: int = 0

    def responses(self) -> list[list[int]]:
        return [self.completion_ids]


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


class Renderer:
    """Turns a canonical prompt and responses (finetune/ingest/preference.py) into token ids. `images`: a
    vision-language model's tokenization (finetune/data/vision/pairs.py), which expands the prompt's images."""

    def __init__(self, tokenizer, images=None):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._header = None
        self.images = images
        self.image_tokens = 0  # of the last prompt encoded

    def header_tokens(self) -> int:
        """Tokens of the assistant header the template adds as the generation prompt (0 for plain text)."""
        if self._header is None:
            probe = [{"role": "user", "content": "x" if self.images is None else [{"type": "text", "text": "x"}]}]
            header = _render(self.tokenizer, probe, True)[len(_render(self.tokenizer, probe, False)):]
            self._header = len(self.tokenizer(header, add_special_tokens=False)["input_ids"])
        return self._header

    def plain(self, prompt: str, responses: list[str]) -> tuple[list[int], list[list[int]]]:
        ids = self.tokenizer([prompt], add_special_tokens=True)["input_ids"][0]
        answers = self.tokenizer(responses, add_special_tokens=False)["input_ids"]
        return list(ids), [list(a) + [self.eos] for a in answers]

    def chat(self, prompt: list[dict], responses: list[list[dict]], parts: list[dict] = ()
             ) -> tuple[list[int], list[list[int]]]:
        """`parts`: the prompt's image parts (a vision-language model's templates read every content as parts)."""
        if self.images is not None:
            from finetune.data.vision.encode import parts_messages

            prompt, responses = parts_messages(prompt), [parts_messages(r) for r in responses]
        prompt_text = _render(self.tokenizer, prompt, True)
        wholes = [_render(self.tokenizer, prompt + response, False) for response in responses]
        for whole in wholes:
            if not whole.startswith(prompt_text):
                raise DataError(
                    "the chat template renders the prompt differently on its own (with the generation prompt) than "
                    "followed by the response, so the response cannot be split off exactly; use `chat_template: "
                    "chatml`, or a template whose generation prompt is the start of the assistant turn"
                )
        if self.images is not None:  # the images expanded into the family's image tokens, in every text
            (prompt_ids, *encoded), self.image_tokens = self.images([prompt_text, *wholes], list(parts))
        else:
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

    def encode(self, prompt, responses: list, parts: list[dict] = ()) -> tuple[list[int], list[list[int]]]:
        self.image_tokens = 0
        return self.chat(prompt, responses, parts) if isinstance(prompt, list) else self.plain(prompt, responses)


def fit(prompt_ids: list[int], responses: list[list[int]], recipe, header: int, bos, image_tokens: int = 0
        ) -> tuple[list[int] | None, str | None]:
    """excess_length_strategy for a prompt and its responses: (prompt ids, what happened), None when dropped. A
    prompt with images is never cut (a cut inside an image's tokens leaves its features and tokens disagreeing)."""
    longest = max(len(r) for r in responses)
    if len(prompt_ids) + longest <= recipe.sequence_len:
        return prompt_ids, None
    if recipe.excess_length_strategy == "error":
        images = f" ({image_tokens} of them image tokens)" if image_tokens else ""
        raise DataError(
            f"a preference record has {len(prompt_ids)} prompt tokens{images} and a {longest}-token response, over "
            f"sequence_len {recipe.sequence_len}; raise `sequence_len`, or set `excess_length_strategy: drop` or "
            "`truncate` (which cuts the prompt from its start)"
        )
    if image_tokens:
        from finetune.data.vision import IMAGE_REJECT

        return None, IMAGE_REJECT + "too_long_with_images"
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


def tokenize_preferences(recipe, tokenizer, files: list[tuple[str, str]], records: list | None = None,
                         processor=None) -> tuple[list, dict]:
    """Every record of every file -> Pair (or Unpaired for KTO), fitted to sequence_len; with the outcome counts.
    `records`: a list that receives the (shape, record) of each kept item, in step with the items (evaluation
    shows the held-out pairs' texts). `processor`: a vision-language model's, which expands the prompts' images."""
    from finetune.data.dedup import recipe_records
    from finetune.ingest.record_images import image_parts

    renderer = Renderer(tokenizer, _pair_images(recipe, processor))
    items, outcome, listed, margins, formats = [], Counter(), [], [], Counter()
    for index, path, number, (found, record) in recipe_records(files, recipe.dataset_exact_deduplication, outcome):
        _check_shape(recipe, path, number, found)
        parts = image_parts(record)
        if parts and processor is None:
            raise DataError(
                f"`{recipe.datasets[index].path}` holds preference records with images (the first: record {number}), "
                "but the model reads text only (its tokenizer comes without an image processor); set `base_model` to "
                "a vision-language model (e.g. HuggingFaceTB/SmolVLM-256M-Instruct), or train on records without "
                "images")
        outcome["records"] += 1
        formats["chat" if isinstance(record["prompt"], list) else "completion"] += 1  # conversations or plain text
        for prompt, responses, label in _pair_texts(record, recipe.method):
            item, what = _item(renderer, recipe, prompt, responses, label, parts)
            if what:
                outcome[what] += 1
            if item is None:
                if len(listed) < LISTED_DROPS:
                    listed.append(f"{path} record {number}: {what}")
                continue
            items.append(item)
            margins.append(record.get("margin") if recipe.method == "reward" else None)
            if records is not None:
                records.append((found, record))
    outcome_dict = dict(outcome)
    outcome_dict["dropped_listed"] = listed
    outcome_dict["formats"] = dict(formats)
    if not items:
        from finetune.data.vision import rejects_line

        raise DataError(
            f"no usable preference examples: {outcome['records']} records, {outcome['too_long']} over sequence_len "
            f"{recipe.sequence_len}, {outcome['response_too_long']} whose response alone leaves no room for the "
            f"prompt{rejects_line(outcome)}; raise `sequence_len` or set `excess_length_strategy: truncate`"
        )
    if recipe.method == "kto":
        check_labels(items)
    _with_margins(items, margins)
    return items, outcome_dict


def _pair_images(recipe, processor):
    if processor is None:
        return None
    from finetune.data.vision.pairs import PairImages

    return PairImages(processor, recipe.image_max_pixels, recipe.image_min_pixels)


def _check_shape(recipe, path: str, number: int, found: str) -> None:
    from finetune.recipe.methods import shapes_for

    if found not in shapes_for(recipe.method):
        raise DataError(
            f"`{path}` record {number} is a {found} record; `method: {recipe.method}` trains on "
            f"{' or '.join(shapes_for(recipe.method))} records ({{prompt, chosen, rejected}}"
            f"{'; one example: {prompt, completion, label} or {messages, label}' if recipe.method == 'kto' else ''}"
            ": docs/preference.md). "
            "Point the dataset at preference data, or set `method: sft` for this file"
        )


def _item(renderer: Renderer, recipe, prompt, responses: list, label, parts: list[dict]):
    """(Pair or Unpaired, what happened) for one prompt and its responses, or (None, why it was left out): too
    long, or (a vision-language model) an image the processor could not use, counted by its reason."""
    from finetune.data.vision import IMAGE_REJECT
    from finetune.ingest.images import ImageRejected

    try:
        prompt_ids, answers = renderer.encode(prompt, responses, parts)
    except ImageRejected as rejected:
        return None, IMAGE_REJECT + rejected.reason
    header = renderer.header_tokens() if isinstance(prompt, list) else 0
    image_tokens = renderer.image_tokens
    prompt_ids, what = fit(prompt_ids, answers, recipe, header, renderer.tokenizer.bos_token_id, image_tokens)
    if prompt_ids is None:
        return None, what
    if label is None:
        return Pair(prompt_ids, *answers, images=list(parts), image_tokens=image_tokens), what
    return Unpaired(prompt_ids, answers[0], label, images=list(parts), image_tokens=image_tokens), what


def check_labels(items: list[Unpaired]) -> None:
    labels = Counter(item.label for item in items)
    if len(labels) < 2:
        only = "desirable (label true)" if True in labels else "undesirable (label false)"
        raise DataError(
            f"every KTO example is {only}: KTO learns from the contrast between desirable and undesirable "
            "completions, so it needs both labels; add examples of the other label, or use pairs "
            "({prompt, chosen, rejected}), which KTO reads as one of each"
        )


def item_stats(items: list, images: bool = False) -> dict:
    """Counts the planner and the logs read: `examples` (pairs, or unpaired examples), `tokens` (every sequence
    the model reads: prompt + response, per response), `supervised_tokens` (response tokens); `images`: a
    vision-language model's image tokens (in `tokens`, never supervised) and images."""
    tokens = supervised = 0
    for item in items:
        for response in item.responses():
            tokens += len(item.prompt_ids) + len(response)
            supervised += len(response)
    stats = {"examples": len(items), "tokens": tokens, "supervised_tokens": supervised}
    if images:  # a vision-language model: the image tokens of every sequence (each holds its prompt), the images
        stats.update(image_tokens=sum(item.image_tokens * len(item.responses()) for item in items),
                     images=sum(len(item.images) for item in items))
    if items and isinstance(items[0], Unpaired):
        stats["desirable"] = sum(1 for item in items if item.label)
        stats["undesirable"] = len(items) - stats["desirable"]
    return stats


def to_dataset(items: list, images: bool = False):
    """`images`: each item's prompt image parts as JSON text (the collator loads them for every sequence)."""
    from datasets import Dataset

    if items and isinstance(items[0], Unpaired):
        columns = {"prompt_ids": [i.prompt_ids for i in items], "completion_ids": [i.completion_ids for i in items],
                   "label": [i.label for i in items]}
    else:
        columns = {"prompt_ids": [i.prompt_ids for i in items], "chosen_ids": [i.chosen_ids for i in items],
                   "rejected_ids": [i.rejected_ids for i in items]}
    if images:
        columns["images"] = [json.dumps(i.images) for i in items]
    if items and isinstance(items[0], Pair) and items[0].margin is not None:
        columns["margin"] = [i.margin for i in items]
    return Dataset.from_dict(columns)
