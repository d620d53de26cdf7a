"""GRPO prompt records -> prompt token ids, each kept with its record (the reward functions read its columns).

A plain-text prompt is tokenized with the tokenizer's special tokens (its BOS), as an SFT instruction's prompt
is; a conversation is rendered through the chat template with the generation prompt (the assistant header)
and tokenized without special tokens (the template writes BOS). What the model sees when it generates is
exactly these ids.

A prompt gets sequence_len - max_completion_length tokens: longer ones are dropped (`drop`), stop the run
(`error`), or lose their start (`truncate`; the BOS stays). Every drop is counted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from finetune.errors import DataError

LISTED_DROPS = 20  # how many dropped records the stats name


@dataclass
class Prompt:
    prompt_ids: list[int]
    record: dict  # the canonical record: "prompt" and every other column, as the reward functions get them


def prompt_ids(tokenizer, prompt) -> list[int]:
    """The ids the model generates after: a string with special tokens; messages through the chat template."""
    if isinstance(prompt, str):
        return list(tokenizer([prompt], add_special_tokens=True)["input_ids"][0])
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])


def fit_prompt(ids: list[int], room: int, strategy: str, bos) -> tuple[list[int] | None, str | None]:
    """(ids, what happened) for a prompt that may have `room` tokens; None when dropped."""
    if len(ids) <= room:
        return ids, None
    if strategy == "error":
        raise DataError(
            f"a prompt has {len(ids)} tokens, over the {room} that sequence_len minus max_completion_length leaves; "
            "raise `sequence_len`, lower `max_completion_length`, or set `excess_length_strategy: drop` or `truncate`")
    if strategy == "drop":
        return None, "too_long"
    keep_bos = int(bos is not None and ids and ids[0] == bos)
    return ids[:keep_bos] + ids[len(ids) - (room - keep_bos):], "truncated"


def prompt_records(recipe, files: list[tuple[str, str]], outcome: Counter):
    """(path, record number, record) for every prompt record of `files`; DataError at the first record of another
    shape."""
    from finetune.data.dedup import recipe_records
    from finetune.ingest.records import PROMPT_SHAPE

    for _, path, number, (found, record) in recipe_records(files, recipe.dataset_exact_deduplication, outcome):
        if found != PROMPT_SHAPE:
            raise DataError(
                f"`{path}` record {number} is a {found} record; `method: grpo` trains on prompt records "
                "({\"prompt\": ..., and the columns your rewards read}: docs/grpo.md). Point the dataset at "
                "prompts, or set the method this file is for")
        yield path, number, record


def first_records(recipe, n: int) -> list[dict]:
    """The first n prompt records of the recipe's datasets, untokenized (what `finetune validate` runs the rewards
    on)."""
    from itertools import islice

    from finetune.data import record_files

    return [record for _, _, record in islice(prompt_records(recipe, record_files(recipe), Counter()), n)]


def tokenize_prompts(recipe, tokenizer, files: list[tuple[str, str]]) -> tuple[list[Prompt], dict]:
    """Every prompt record of every file -> Prompt, fitted to its room; with the outcome counts."""
    from finetune.recipe.methods import method_setting

    room = recipe.sequence_len - method_setting(recipe, "max_completion_length")
    items, outcome, listed = [], Counter(), []
    for path, number, record in prompt_records(recipe, files, outcome):
        outcome["records"] += 1
        ids, what = fit_prompt(prompt_ids(tokenizer, record["prompt"]), room, recipe.excess_length_strategy,
                               tokenizer.bos_token_id)
        if what:
            outcome[what] += 1
            if ids is None and len(listed) < LISTED_DROPS:
                listed.append(f"{path} record {number}: {what}")
        if ids is not None:
            items.append(Prompt(ids, record))
    if not items:
        raise DataError(f"no usable prompts: {outcome['records']} records, {outcome['too_long']} longer than the "
                        f"{room} tokens sequence_len leaves them; raise `sequence_len` or lower `max_completion_length`")
    return items, {**outcome, "dropped_listed": listed}


def template_note(stats: dict, tokenizer) -> str | None:
    """What to say when plain-text prompts meet a tokenizer with a chat template: they reach the model as written,
    without it. Not applied for them: a string prompt is TRL's "standard" format, sent as written (the oracle
    finetune's GRPO is held equal to), and a base model's tokenizer may carry a template it was never trained on;
    an instruct model wants its turns, which a conversation prompt gets."""
    plain = (stats.get("formats") or {}).get("completion", 0)  # plain-text prompts (data/__init__.py)
    if not plain or not getattr(tokenizer, "chat_template", None):
        return None
    return (f"{plain:,} of {stats.get('records', plain):,} prompts are plain text: they reach the model as written "
            "(its BOS, no chat template), as TRL sends a string prompt. This tokenizer has a chat template: an "
            "instruct model answers a prompt in its own turns, so give `prompt` as a conversation, "
            "[{\"role\": \"user\", \"content\": ...}], to have it rendered through the template with the assistant "
            "header (docs/grpo.md)")


def prompt_stats(items: list[Prompt]) -> dict:
    """`examples` (prompts) and `tokens` (prompt tokens); completions are counted as the run generates them."""
    return {"examples": len(items), "tokens": sum(len(p.prompt_ids) for p in items), "supervised_tokens": 0}


def to_dataset(items: list[Prompt]):
    from datasets import Dataset

    return Dataset.from_dict({"prompt_ids": [p.prompt_ids for p in items],
                              "record": [json.dumps(p.record, ensure_ascii=False) for p in items]})


def reward_columns(records: list[dict]) -> dict[str, list]:
    """The records' columns other than the prompt, as lists (TRL passes them to reward functions this way)."""
    names = [k for k in records[0] if k != "prompt"] if records else []
    return {name: [r.get(name) for r in records] for name in names}
