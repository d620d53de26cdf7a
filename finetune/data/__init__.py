"""Data stage: records -> tokenized, length-filtered, split, cached examples.

build_dataset(recipe, tokenizer) is the one entry point; the trainer only ever sees its output
(`input_ids`, `labels`), never a raw record.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from finetune.data.dedup import recipe_records
from finetune.data.cache import (cache_key, data_hash, drop_prepared, load_prepared, save_prepared,
                                 tokenizer_fingerprint)
from finetune.data.encode import encode_stream
from finetune.data.formats import Example
from finetune.data.vision import IMAGE_REJECT
from finetune.errors import DataError
from finetune.ingest.record_images import has_images
from finetune.ingest.records import require_records_file
from finetune.log import get_logger
from finetune.recipe.data import RECORD_TYPES


@dataclass
class Prepared:
    train: object  # datasets.Dataset
    eval: object | None
    stats: dict = field(default_factory=dict)
    key: str = ""
    data_hash: str = ""
    cache_path: str = ""
    reused: bool = False
    store: object = None  # preference methods: the token ids the rows of pair ids point into (preference_rows.py)
    # a vision-language model: the processor that counted the rows' image tokens; the collator makes their pixels
    processor: object = None

    def train_counts(self) -> dict:
        """stats["train"] with `examples` replaced by what the Trainer iterates: the packed rows with
        sample_packing, else the examples. Optimizer steps, and so the learning-rate plan, count these."""
        return {**self.stats["train"], "examples": len(self.train)}


def prepared_root(recipe) -> Path:
    return Path(recipe.dataset_prepared_path or os.path.join(recipe.cache_dir, "prepared"))


def record_files(recipe) -> list[tuple[str, str]]:
    """(shape, JSONL path) per dataset entry; raw sources (HTML, CSV, SQL...) are ingested first, and records
    that are not a plain JSONL/JSON file of our field names (parquet, arrow, folders, hub ids, `map:`) are read
    into canonical records first (finetune/ingest/records_source.py)."""
    from finetune.ingest.records_source import materialize_records, plain_records_file

    files = []
    for spec in recipe.datasets:
        if spec.type in RECORD_TYPES and plain_records_file(spec):
            require_records_file(spec.path)
            files.append((spec.type, spec.path))
        elif spec.type in RECORD_TYPES:
            files.append((spec.type, str(materialize_records(spec, recipe.cache_dir))))
        else:
            from finetune.ingest.source import materialize

            files.append(("auto", str(materialize(spec, recipe.cache_dir))))
    return files


def fit_length(example: Example, recipe) -> tuple[Example | None, str | None]:
    """Apply excess_length_strategy. Returns (example or None, what happened)."""
    if len(example.input_ids) <= recipe.sequence_len:
        return example, None
    if recipe.excess_length_strategy == "error":
        images = f" ({example.image_tokens} of them image tokens)" if example.images else ""
        raise DataError(
            f"an example has {len(example.input_ids)} tokens{images}, over sequence_len {recipe.sequence_len}; raise "
            "`sequence_len`, or set `excess_length_strategy: drop` or `truncate`"
        )
    if example.images:  # never cut: a cut inside an image's tokens leaves its features and its tokens disagreeing
        return None, IMAGE_REJECT + "too_long_with_images"
    if recipe.excess_length_strategy == "drop":
        return None, "too_long"
    n = recipe.sequence_len
    return Example(example.input_ids[:n], example.labels[:n]), "truncated"


def tokenize_all(recipe, tokenizer, files: list[tuple[str, str]], records: list | None = None, processor=None
                 ) -> tuple[list[Example], dict]:
    """Every record of `files` -> Examples, fitted to sequence_len. `records`: a list that receives the
    (shape, record) of each kept example, in step with the examples (evaluation prompts from the eval split).
    `processor`: a vision-language model's, which encodes its chats (finetune/data/vision/encode.py)."""
    from finetune.data.vision import chat_encoder

    examples, outcome, formats, per_file = [], Counter(), Counter(), Counter()

    def counted(index, item):
        formats[item[0]] += 1
        per_file[index] += 1  # by the entry's place in `datasets:`: one file listed twice is two entries
        return item

    shaped = (counted(i, _sft_record(path, item, (recipe.datasets[i].path, number) if processor is None else None))
              for i, path, number, item in recipe_records(files, recipe.dataset_exact_deduplication, outcome))
    chat = chat_encoder(recipe, processor)
    # batched tokenization, one tokenizer call per chunk of records; optionally over several processes
    for item, encoded in encode_stream(tokenizer, shaped, recipe.train_on_inputs, recipe.dataset_processes, chat):
        outcome["records"] += 1
        if not isinstance(encoded, Example):  # a record the vision encoder could not use, counted by its reason
            outcome[IMAGE_REJECT + encoded.reason] += 1
            continue
        example, what = fit_length(encoded, recipe)
        if example is not None and example.supervised_tokens == 0:
            example, what = None, "no_supervised_tokens"
        if what:
            outcome[what] += 1
        if example is not None:
            examples.append(example)
            if records is not None:
                records.append(item)
    if not examples:
        from finetune.data.vision import rejects_line

        raise DataError(
            f"no usable examples: {outcome['records']} records, {outcome['too_long']} over sequence_len "
            f"{recipe.sequence_len}, {outcome['no_supervised_tokens']} with no supervised tokens{rejects_line(outcome)}; "
            "check the data and `sequence_len` / `train_on_inputs`"
        )
    return examples, {**outcome, "formats": dict(formats), "per_file": dict(per_file)}


def _sft_record(path: str, item: tuple[str, dict], text_only: tuple[str, int] | None = None) -> tuple[str, dict]:
    """The item, or DataError for a record SFT cannot train: pairs, KTO examples, and with a text-only model
    (`text_only`: the dataset's path and the record's number in what was read from it) a record with images."""
    if text_only is not None and item[0] == "chat" and has_images(item[1]):
        raise DataError(
            f"`{text_only[0]}` holds records with images (the first: record {text_only[1]}), but the model reads "
            "text only (its tokenizer comes without an image processor); set `base_model` to a vision-language "
            "model (e.g. HuggingFaceTB/SmolVLM-256M-Instruct), or train on records without images"
        )
    if item[0] == "unpaired":
        raise DataError(
            f"`{path}` holds unpaired (KTO) records ({{prompt, completion, label}}: a response marked good or bad), "
            "but the recipe trains `method: sft`, which would teach every response, the bad ones too; set "
            "`method: kto` (docs/preference.md), or point the dataset at SFT records"
        )
    if item[0] == "preference":
        raise DataError(
            f"`{path}` holds preference pairs ({{prompt, chosen, rejected}}), but the recipe trains `method: sft`; "
            "set `method: dpo` (or ipo, orpo, simpo: docs/preference.md), or point the dataset at SFT records"
        )
    return item


def source_counts(recipe, files: list[tuple[str, str]], per_file: dict) -> list[dict]:
    """Per `datasets:` entry: the records the data stage read, and where the entry was read into records first
    (a raw source, or records mapped from parquet, a folder, a hub id...), what that read, kept and dropped."""
    out = []
    for i, (spec, (_, path)) in enumerate(zip(recipe.datasets, files)):
        entry = {"path": spec.path, "records": per_file.get(i, 0)}
        report = Path(path).with_name(Path(path).name.removesuffix(".jsonl") + ".report.json")
        if path != spec.path and report.is_file():
            counts = json.loads(report.read_text(encoding="utf-8"))
            entry.update(read=counts.get("records_read", counts.get("records_in")),
                         kept=counts.get("records_mapped", counts.get("records_out")),
                         dropped=counts.get("dropped", {}))
        out.append(entry)
    return out


def split(examples: list[Example], recipe) -> tuple[list[Example], list[Example]]:
    """A seeded, reproducible eval split; the train part keeps file order (the Trainer shuffles)."""
    size = recipe.val_set_size
    n_eval = int(size) if size >= 1 else int(round(len(examples) * size))
    if n_eval == 0:
        return examples, []
    if n_eval >= len(examples):
        raise DataError(
            f"`val_set_size` {size} leaves no training examples out of {len(examples)}; lower it"
        )
    eval_idx = set(random.Random(recipe.seed).sample(range(len(examples)), n_eval))
    train = [ex for i, ex in enumerate(examples) if i not in eval_idx]
    held = [ex for i, ex in enumerate(examples) if i in eval_idx]
    return train, held


def split_stats(examples: list[Example], images: bool = False) -> dict:
    """Examples and tokens of a split; `images` (a vision-language model): its image tokens and images apart."""
    stats = {
        "examples": len(examples),
        "tokens": sum(len(ex.input_ids) for ex in examples),
        "supervised_tokens": sum(ex.supervised_tokens for ex in examples),
    }
    if images:
        stats.update(image_tokens=sum(ex.image_tokens for ex in examples),
                     images=sum(len(ex.images) for ex in examples))
    return stats


def _to_dataset(examples: list[Example], images: bool = False):
    from datasets import Dataset

    columns = {"input_ids": [ex.input_ids for ex in examples], "labels": [ex.labels for ex in examples]}
    if images:  # each row's image parts as JSON text: the collator loads them (finetune/data/vision/collate.py)
        columns["images"] = [json.dumps(ex.images) for ex in examples]
    return Dataset.from_dict(columns)


def cache_entry(recipe, tokenizer, processor=None) -> tuple[list[tuple[str, str]], Prepared]:
    """(the record files, the cache entry for them as a Prepared): filled from the cache when it holds one
    (`reused`), else empty for store_entry to fill. A processor's image settings enter the key with the tokenizer."""
    from finetune.data.vision import images_changed, processor_fingerprint

    files = record_files(recipe)
    files_hash = data_hash(files)
    key = cache_key(recipe, files_hash, tokenizer_fingerprint(tokenizer) + processor_fingerprint(processor))
    root = prepared_root(recipe)
    prepared = Prepared(None, None, {}, key, files_hash, str(root / key))
    cached = load_prepared(root, key)
    if cached is not None and images_changed(*cached):  # an image edited or removed since: its rows' tokens are stale
        get_logger(__name__).info("data: an image the cached rows were tokenized from changed or went away since: "
                                  "tokenizing again")
        drop_prepared(root, key)
        cached = None
    if cached is not None:
        dd, prepared.stats = cached
        prepared.train, prepared.eval, prepared.reused = dd["train"], dd.get("eval"), True
        if "sources" in prepared.stats:  # the key is the content, not the names: say this recipe's paths
            prepared.stats["sources"] = [{**entry, "path": spec.path}
                                         for entry, spec in zip(prepared.stats["sources"], recipe.datasets)]
    return files, prepared


def store_entry(prepared: Prepared, dataset_dict, stats: dict) -> Prepared:
    """Save freshly tokenized splits under the entry's key; the entry now holds them."""
    from finetune.data.vision import image_files

    stats = {**stats, **image_files(dataset_dict)}  # what the rows' image tokens were counted from
    save_prepared(Path(prepared.cache_path).parent, prepared.key, dataset_dict, stats)
    prepared.train, prepared.eval, prepared.stats = dataset_dict["train"], dataset_dict.get("eval"), stats
    return prepared


def build_dataset(recipe, tokenizer, processor=None) -> Prepared:
    """Tokenize (or reuse the cache for) the recipe's datasets. Raises DataError for unusable data. `processor`:
    a vision-language model's (finetune/model/vision.py: load_processor), None for a text model."""
    from datasets import DatasetDict

    from finetune.data.vision import check_vision_method, image_stats
    from finetune.recipe.methods import is_grpo, reads_pairs

    check_vision_method(recipe, processor)
    if reads_pairs(recipe):  # preference methods and reward models: the pairs' token store
        return build_preference_dataset(recipe, tokenizer, processor)
    if is_grpo(recipe):
        return build_prompt_dataset(recipe, tokenizer)
    files, prepared = cache_entry(recipe, tokenizer, processor)
    prepared.processor = processor
    if prepared.reused:
        return pack_prepared(recipe, prepared)
    examples, outcome = tokenize_all(recipe, tokenizer, files, processor=processor)
    train, held = split(examples, recipe)
    vision = processor is not None
    stats = {
        "records": outcome.get("records", 0),
        "dropped_too_long": outcome.get("too_long", 0),
        "dropped_no_supervised_tokens": outcome.get("no_supervised_tokens", 0),
        "truncated": outcome.get("truncated", 0),
        "dropped_duplicates": outcome.get("duplicates", 0),
        "formats": outcome.get("formats", {}),  # records per shape: the prompt format inference must use
        "sources": source_counts(recipe, files, outcome.get("per_file", {})),
        "train": split_stats(train, vision),
        "eval": split_stats(held, vision),
        **image_stats(outcome, vision),
    }
    parts = {"train": _to_dataset(train, vision)}
    if held:
        parts["eval"] = _to_dataset(held, vision)
    return pack_prepared(recipe, store_entry(prepared, DatasetDict(parts), stats))


def pack_prepared(recipe, prepared: Prepared) -> Prepared:
    """Pack the splits the recipe asks to pack (packing is cheap, so the cache keeps unpacked examples)."""
    from finetune.data.packing import pack_dataset, packed_splits

    train_packing, eval_packing = packed_splits(recipe)
    packing = {}
    if train_packing:
        prepared.train, packing["train"] = pack_dataset(prepared.train, recipe.sequence_len, recipe.seed)
    elif recipe.group_by_length:  # the Trainer's length-grouped sampler reads this column instead of every row
        prepared.train = prepared.train.add_column("length", [len(ids) for ids in prepared.train["input_ids"]])
    if eval_packing and prepared.eval is not None:
        prepared.eval, packing["eval"] = pack_dataset(prepared.eval, recipe.sequence_len, recipe.seed)
    elif recipe.group_by_length and prepared.eval is not None:  # the eval sampler groups too; with a processor as the
        # Trainer's processing_class it could not infer lengths (it would look for its first input, pixel_values)
        prepared.eval = prepared.eval.add_column("length", [len(ids) for ids in prepared.eval["input_ids"]])
    prepared.stats = {**prepared.stats, "packing": packing}
    return prepared


def build_preference_dataset(recipe, tokenizer, processor=None) -> Prepared:
    """Preference methods: tokenized pairs (KTO: unpaired examples), cached like SFT examples; the Trainer's
    datasets are rows of pair ids into `Prepared.store` (finetune/data/preference/rows.py). `processor`: a
    vision-language model's, which expands the prompts' images (finetune/data/vision/pairs.py)."""
    from datasets import DatasetDict

    from finetune.data.preference.pairs import item_stats, to_dataset, tokenize_preferences
    from finetune.data.vision import image_stats

    files, prepared = cache_entry(recipe, tokenizer, processor)
    prepared.processor = processor
    if prepared.reused:
        return preference_prepared(recipe, prepared)
    items, outcome = tokenize_preferences(recipe, tokenizer, files, processor=processor)
    vision = processor is not None
    train, held = split(items, recipe)
    stats = {
        "records": outcome.get("records", 0),
        "dropped_too_long": outcome.get("too_long", 0),
        "dropped_response_too_long": outcome.get("response_too_long", 0),
        "truncated": outcome.get("truncated", 0),
        "dropped_duplicates": outcome.get("duplicates", 0),
        "dropped_listed": outcome["dropped_listed"],
        "formats": outcome["formats"],  # records per kind: conversations (chat) or plain text (completion)
        "train": item_stats(train, vision),
        "eval": item_stats(held, vision),
        **image_stats(Counter(outcome), vision),
    }
    dd = DatasetDict({"train": to_dataset(train, vision), **({"eval": to_dataset(held, vision)} if held else {})})
    return preference_prepared(recipe, store_entry(prepared, dd, stats))


def preference_prepared(recipe, prepared: Prepared) -> Prepared:
    """The token store and the rows of ids the Trainer iterates, packed where the recipe packs."""
    from finetune.data.packing import packed_splits
    from finetune.data.preference.rows import PairStore, preference_rows, row_capacity

    store = PairStore(prepared.train, prepared.eval, recipe.seed)
    train_packing, eval_packing = packed_splits(recipe)
    capacity = row_capacity(recipe, store)
    packing = {}
    prepared.train, packed = preference_rows(store, "train", train_packing, capacity, recipe.seed)
    if packed:
        packing["train"] = packed
    if prepared.eval is not None:
        prepared.eval, packed = preference_rows(store, "eval", eval_packing, capacity, recipe.seed)
        if packed:
            packing["eval"] = packed
    prepared.store = store
    prepared.stats = {**prepared.stats, "packing": packing}
    return prepared


def build_prompt_dataset(recipe, tokenizer) -> Prepared:
    """GRPO: tokenized prompts, each with its record (the rewards read its columns), cached like SFT examples; the
    Trainer iterates prompts, and the run generates their completions."""
    from datasets import DatasetDict

    from finetune.data.grpo.prompts import prompt_stats, to_dataset, tokenize_prompts

    files, prepared = cache_entry(recipe, tokenizer)
    if prepared.reused:
        return prepared
    items, outcome = tokenize_prompts(recipe, tokenizer, files)
    train, held = split(items, recipe)
    stats = {
        "records": outcome.get("records", 0),
        "dropped_too_long": outcome.get("too_long", 0),
        "truncated": outcome.get("truncated", 0),
        "dropped_duplicates": outcome.get("duplicates", 0),
        "dropped_listed": outcome["dropped_listed"],
        # the prompts' kinds, as SFT names record shapes: conversations (chat) or text (completion); a served model
        # is prompted the same way (finetune/model/prompt_format.py)
        "formats": dict(Counter("chat" if isinstance(p.record["prompt"], list) else "completion" for p in items)),
        "train": prompt_stats(train),
        "eval": prompt_stats(held),
        "packing": {},
    }
    dd = DatasetDict({"train": to_dataset(train), **({"eval": to_dataset(held)} if held else {})})
    return store_entry(prepared, dd, stats)


__all__ = ["Prepared", "build_dataset"]
