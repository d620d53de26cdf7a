"""The encoder: records -> Examples (`input_ids`, and `labels` with IGNORE_INDEX on every token that is not
supervised: the prompt of an instruction, every non-assistant turn of a chat), unless train_on_inputs.

Completion: the text and EOS, all supervised. Instruction: the alpaca prompt and the response are tokenized
apart, exactly as at inference time, where the model sees the prompt's tokens and then generates; EOS ends
the response so the model learns to stop. Chat: the rendered conversation is tokenized once with offsets,
and a token is supervised when its first character lies inside an assistant turn (finetune/data/formats.py).
tests/oracle_encoder.py encodes one record at a time, the plain way; the tests hold this encoder to it.

Speed comes from one tokenizer call per batch (the Rust tokenizer encodes a batch in parallel threads)
and from computing the supervised-token mask with numpy over character offsets instead of a Python loop
per token. Big datasets can also be split over processes (`dataset_processes`).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from finetune.contract import IGNORE_INDEX
from finetune.data.formats import Example, alpaca_prompt, assistant_spans

CHUNK_RECORDS = 1000  # records per tokenizer call / per task sent to a worker process


def _batch_ids(tokenizer, texts: list[str], special: bool) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=special)["input_ids"] if texts else []


def encode_completions(tokenizer, records: list[dict], train_on_inputs: bool) -> list[Example]:
    eos = tokenizer.eos_token_id
    out = []
    for ids in _batch_ids(tokenizer, [r["text"] for r in records], special=True):
        ids = list(ids) + [eos]
        out.append(Example(ids, list(ids)))
    return out


def encode_instructions(tokenizer, records: list[dict], train_on_inputs: bool) -> list[Example]:
    eos = tokenizer.eos_token_id
    prompts = _batch_ids(tokenizer, [alpaca_prompt(r) for r in records], special=True)
    responses = _batch_ids(tokenizer, [r["output"] for r in records], special=False)
    out = []
    for prompt_ids, response_ids in zip(prompts, responses):
        response_ids = list(response_ids) + [eos]
        prompt_labels = list(prompt_ids) if train_on_inputs else [IGNORE_INDEX] * len(prompt_ids)
        out.append(Example(list(prompt_ids) + response_ids, prompt_labels + response_ids))
    return out


def supervised_mask(starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """True for each token whose first character lies inside an assistant span."""
    inside = np.zeros(starts.shape, dtype=bool)
    for lo, hi in spans:
        inside |= (starts >= lo) & (starts < hi)
    return inside


def encode_chats(tokenizer, records: list[dict], train_on_inputs: bool, roles=("assistant",), tools=None
                 ) -> list[Example]:
    """Chats: the turns of `roles` (the recipe's roles_to_train) supervised, or every token with train_on_inputs.
    A tool transcript renders the tools it was offered: its record's `tools` column, else `tools` (the recipe's)."""
    from finetune.data.tool_chat import check_transcripts, record_tools

    check_transcripts(tokenizer, records, tools)
    rendered = [assistant_spans(tokenizer, r["messages"], roles, record_tools(r, tools)) for r in records]
    texts = [text for text, _ in rendered]
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=not train_on_inputs)
    out = []
    for i, ids in enumerate(enc["input_ids"]):
        ids = list(ids)
        if train_on_inputs:
            out.append(Example(ids, list(ids)))
            continue
        starts = np.fromiter((start for start, _ in enc["offset_mapping"][i]), dtype=np.int64, count=len(ids))
        labels = np.where(supervised_mask(starts, rendered[i][1]), np.asarray(ids, dtype=np.int64), IGNORE_INDEX)
        out.append(Example(ids, labels.tolist()))
    return out


BATCH_ENCODERS = {"completion": encode_completions, "instruction": encode_instructions, "chat": encode_chats}


def encode_batch(tokenizer, shaped_records: list[tuple[str, dict]], train_on_inputs: bool, chat=None) -> list[Example]:
    """Encode (shape, record) pairs, in order, one tokenizer call per shape present. `chat`: what encodes the chats
    (the recipe's: chat_encoder in finetune/data/vision/__init__.py; a vision-language model's ImageEncoder gives
    back a record it cannot use as a Rejected, its reason counted); default: encode_chats."""
    encoders = {**BATCH_ENCODERS, "chat": chat or encode_chats}
    out: list[Example | None] = [None] * len(shaped_records)
    for shape, encoder in encoders.items():
        where = [i for i, (s, _) in enumerate(shaped_records) if s == shape]
        if where:
            for i, example in zip(where, encoder(tokenizer, [shaped_records[i][1] for i in where], train_on_inputs)):
                out[i] = example
    return out  # type: ignore[return-value]


_WORKER: dict = {}


def _init_worker(tokenizer, train_on_inputs: bool, chat) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # processes already split the work
    _WORKER.update(tokenizer=tokenizer, train_on_inputs=train_on_inputs, chat=chat)


def _encode_in_worker(chunk: list[tuple[str, dict]]) -> list[Example]:
    return encode_batch(_WORKER["tokenizer"], chunk, _WORKER["train_on_inputs"], _WORKER["chat"])


def encode_stream(tokenizer, shaped_records, train_on_inputs: bool, processes: int = 1, chat=None):
    """Yield Examples in record order, encoding chunks of CHUNK_RECORDS in up to `processes` processes."""
    def chunks():
        chunk = []
        for item in shaped_records:
            chunk.append(item)
            if len(chunk) == CHUNK_RECORDS:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    if processes <= 1:
        for chunk in chunks():
            yield from zip(chunk, encode_batch(tokenizer, chunk, train_on_inputs, chat))
        return
    import multiprocessing

    # spawn, not fork: the parent may hold torch / tokenizer threads, which fork does not copy safely
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(tokenizer, train_on_inputs, chat)) as pool:
        pending = list(chunks())
        for chunk, examples in zip(pending, pool.map(_encode_in_worker, pending)):
            yield from zip(chunk, examples)
