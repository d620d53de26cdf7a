"""Content-hash cache keys for tokenized data, and atomic save/load of prepared datasets.

The key covers everything that changes the tokens: the bytes of every data file (so editing a file in
place never reuses a stale cache), the tokenizer (vocabulary, merges, special tokens, chat template) and
every recipe field that changes tokenization, the split or the order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from finetune.atomic import temp_dir
from finetune.recipe import Recipe
from finetune.recipe.tags import TOKENS, fields_affecting

# Recipe fields that change what build_dataset produces, by value: the schema's `tokens` tag (finetune/recipe/schema.py).
# Anything else (learning rate, LoRA rank, ...) may change freely without re-tokenizing. The data files and the
# tokenizer (`content` tag) enter the key by their content hash instead.
TOKENIZATION_FIELDS = fields_affecting(Recipe, TOKENS)
CACHE_FORMAT = 1  # bump when the on-disk layout or the encoding logic changes


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update((backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))).encode())
    digest.update(repr(tokenizer.chat_template).encode())
    digest.update(repr((tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)).encode())
    digest.update(type(tokenizer).__name__.encode())
    return digest.hexdigest()


def data_hash(files: list[tuple[str, str]]) -> str:
    """One hash over (shape, file content) pairs, in recipe order."""
    digest = hashlib.sha256()
    for shape, path in files:
        digest.update(f"{shape}:{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def cache_key(recipe, files_hash: str, tokenizer_hash: str) -> str:
    fields = {name: getattr(recipe, name) for name in TOKENIZATION_FIELDS}
    blob = json.dumps(
        {"format": CACHE_FORMAT, "data": files_hash, "tokenizer": tokenizer_hash, "fields": fields},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load_prepared(root: str | os.PathLike, key: str):
    """(DatasetDict, stats) from the cache, or None when absent or incomplete."""
    from datasets import load_from_disk

    folder = Path(root) / key
    if not (folder / "stats.json").is_file():  # stats.json is written last: its presence marks completion
        return None
    return load_from_disk(str(folder / "data")), json.loads((folder / "stats.json").read_text())


def drop_prepared(root: str | os.PathLike, key: str) -> None:
    """Remove a cache entry (its rows are stale), so that the entry tokenized again takes its place."""
    shutil.rmtree(Path(root) / key, ignore_errors=True)


def save_prepared(root: str | os.PathLike, key: str, dataset_dict, stats: dict) -> None:
    """Write to a temporary folder, then rename: a crash never leaves a cache entry that looks complete."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(root / key)
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar

    disable_progress_bar()  # a bar per split for a sub-second save is noise
    try:
        dataset_dict.save_to_disk(str(tmp / "data"))
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2))
        final = root / key
        if final.exists():  # another process finished first; keep theirs
            shutil.rmtree(tmp)
            return
        try:
            os.replace(tmp, final)
        except OSError:  # lost a race with another node's main process on a shared filesystem
            if not (final / "stats.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        enable_progress_bar()
