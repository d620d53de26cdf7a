"""`dataset_exact_deduplication`: each record trains once, across all of the recipe's datasets.

The records are compared in their canonical form (finetune/ingest/records.py), so a pair written as sharegpt turns
in one file and as messages in another is the same pair; two datasets that are the same file, or copies of it,
train every record once, as axolotl's key of the same name does. Only a 16-byte digest per record is kept.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator


def recipe_records(files: list[tuple[str, str]], dedup: bool, outcome: Counter) -> Iterator[tuple[int, str, int, tuple]]:
    """(dataset index, path, record number in its file, (shape, record)) for every record of `files`, in recipe
    order; with `dedup`, a record equal to an earlier one is left out and counted in outcome["duplicates"]."""
    from finetune.ingest.records import read_records

    seen: set[bytes] = set()
    for index, (shape, path) in enumerate(files):
        for number, item in enumerate(read_records(path, shape), start=1):
            if dedup:
                blob = json.dumps(item, sort_keys=True, ensure_ascii=False, default=str).encode()
                digest = hashlib.blake2b(blob, digest_size=16).digest()
                if digest in seen:
                    outcome["duplicates"] += 1
                    continue
                seen.add(digest)
            yield index, path, number, item
