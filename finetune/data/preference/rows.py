"""What the Trainer iterates for preference tuning: rows of pair ids, and the store the ids point into.

A pair (or a KTO example) has one global id: the train split's come first, then the eval split's. The
Trainer's dataset holds only rows of ids (column `pairs`; `packed_pairs` when packed): one id a row unpacked, so `micro_batch_size`
counts pairs as it counts examples in SFT; several a row with `sample_packing`, best-fit-decreasing packed
(finetune/data/packing.py) into rows of 2 x sequence_len tokens, so any pair fits a row whole and a packed
row holds as many tokens as one unpacked pair at its longest. The collator (finetune/data/preference/collate.py)
turns ids into token tensors from the store, and into the reference log-probs computed for them.
"""

from __future__ import annotations

import json

import numpy as np

# the rows' column: its name says whether a row's items are packed into one token row or are a row each
UNPACKED, PACKED = "pairs", "packed_pairs"


class PairStore:
    """Token ids of every item of both splits, by global id (train first, then eval)."""

    def __init__(self, train, eval=None, seed: int = 0):
        parts = [train] + ([eval] if eval is not None else [])
        self.n_train = len(train)
        self.unpaired = "completion_ids" in train.column_names
        self.prompts = [ids for part in parts for ids in part["prompt_ids"]]
        if self.unpaired:
            self.responses = [[ids] for part in parts for ids in part["completion_ids"]]
            self.labels = [bool(label) for part in parts for label in part["label"]]
            self.kl_partner = _kl_partners([len(part) for part in parts], seed)
        else:
            self.responses = [[c, r] for part in parts for c, r in zip(part["chosen_ids"], part["rejected_ids"])]
            self.labels = self.kl_partner = None
        # `method: reward` with a `margin` column: each pair's (finetune/data/preference/pairs.py)
        self.margins = ([float(m) for part in parts for m in part["margin"]] if "margin" in train.column_names
                        else None)
        # a vision-language model: each item's prompt image parts (every sequence of the item holds that prompt)
        self.images = ([json.loads(text) for part in parts for text in part["images"]]
                       if "images" in train.column_names else None)

    def __len__(self) -> int:
        return len(self.prompts)

    def split_ids(self, split: str) -> range:
        return range(0, self.n_train) if split == "train" else range(self.n_train, len(self))

    def sequences(self, item: int) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, response ids) of each sequence the item is read as: chosen then rejected for a pair."""
        return [(self.prompts[item], response) for response in self.responses[item]]

    def kl_sequences(self, item: int) -> list[tuple[list[int], list[int]]]:
        """KTO: the item's prompt with its KL partner's completion."""
        return [(self.prompts[item], self.responses[self.kl_partner[item]][0])]

    def length(self, item: int) -> int:
        return sum(len(self.prompts[item]) + len(response) for response in self.responses[item])


def _kl_partners(split_sizes: list[int], seed: int) -> list[int]:
    """Global id -> the global id whose completion it is scored with for KTO's KL estimate: within each split,
    in a seeded random order, every example takes the completion of the one before it (the first the last's)."""
    partners, start = [], 0
    rng = np.random.default_rng(seed)
    for size in split_sizes:
        order = start + rng.permutation(size)
        partner = np.empty(size, dtype=np.int64)
        partner[order - start] = np.roll(order, 1)
        partners += partner.tolist()
        start += size
    return partners


def row_capacity(recipe, store: PairStore) -> int:
    """Tokens a packed row holds: a pair's two sequences at their longest, or one KTO example."""
    return recipe.sequence_len * (1 if store.unpaired else 2)


def preference_rows(store: PairStore, split: str, packed: bool, capacity: int, seed: int):
    """(Dataset of rows of ids, packing stats or None)."""
    from datasets import Dataset

    from finetune.data.packing import pack_lengths, packing_efficiency

    ids = np.asarray(store.split_ids(split), dtype=np.int64)
    if not packed:
        return Dataset.from_dict({UNPACKED: [[int(i)] for i in ids]}), None
    lengths = np.asarray([store.length(int(i)) for i in ids], dtype=np.int64)
    bins = pack_lengths(lengths, capacity, seed)
    rows = [[int(ids[j]) for j in row] for row in bins]
    stats = {"examples": int(ids.size), "rows": len(rows), "tokens": int(lengths.sum()), "sequence_len": capacity,
             "efficiency": round(packing_efficiency(lengths, bins, capacity), 4)}
    return Dataset.from_dict({PACKED: rows}), stats
