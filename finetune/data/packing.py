"""Sample packing: tokenized examples -> rows of at most `sequence_len` tokens, each holding whole examples.

The bin packer is best-fit decreasing (each example, longest first, goes into the open row with the least
room that still fits it), exact, but vectorised over runs of equal length: a row with `room` tokens free
takes `room // length` examples of one length in a row before anything else fits it better, so each
(length, room) pair is one numpy step, not one Python step per example. Ties are broken by a seeded
shuffle, so the packing is a pure function of (lengths, sequence_len, seed).

A packed row carries `input_ids`, `labels` and `position_ids` restarting at 0 at each example. The
position ids are what isolates the examples: transformers builds a block-diagonal causal mask from them
(sdpa / eager) or passes per-example lengths to flash-attn's variable-length kernel. The first label of
every example is -100: it would otherwise be the target of the previous example's last token. Alone, that
label is never a target either (causal LM losses shift by one), so the loss is unchanged.
"""

from __future__ import annotations

import hashlib

import numpy as np

from finetune.contract import IGNORE_INDEX
from finetune.errors import DataError


def packed_splits(recipe) -> tuple[bool, bool]:
    """(pack the train split, pack the eval split): the one reading of `sample_packing` /
    `eval_sample_packing` (unset: the same as sample_packing). The data stage packs by it; the run's
    resolved settings (finetune/train/settings.py) read it too."""
    eval_packing = recipe.sample_packing if recipe.eval_sample_packing is None else recipe.eval_sample_packing
    return recipe.sample_packing, eval_packing


def _place(bin_of, items, bins, per_bin):
    """Put `items` (in order) into `bins`, `per_bin` to a bin; returns how many items each used bin took."""
    take = np.minimum(len(items), len(bins) * per_bin)
    bin_of[items[:take]] = np.asarray(bins)[np.arange(take) // per_bin]
    return take


def pack_lengths(lengths, capacity: int, seed: int = 0) -> list[np.ndarray]:
    """Best-fit-decreasing bins of example indices; each bin's lengths sum to at most `capacity`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return []
    if lengths.min() <= 0 or lengths.max() > capacity:
        raise DataError(f"cannot pack examples of length {lengths.min()}..{lengths.max()} into rows of {capacity} "
                        "tokens; every example must be 1..sequence_len tokens")
    order = np.random.default_rng(seed).permutation(lengths.size)
    order = order[np.argsort(-lengths[order], kind="stable")]  # longest first; equal lengths in seeded order
    sizes, starts, counts = np.unique(-lengths[order], return_index=True, return_counts=True)
    bin_of = np.empty(lengths.size, dtype=np.int64)
    rooms = np.zeros(capacity + 1, dtype=np.int64)  # rooms[r] = number of open bins with r tokens free
    by_room: dict[int, list[int]] = {}  # r -> ids of the bins with r tokens free (a stack)
    n_bins = 0

    def move(bin_ids, room):
        if room > 0:
            by_room.setdefault(room, []).extend(bin_ids)
            rooms[room] += len(bin_ids)

    for neg_size, start, count in zip(sizes.tolist(), starts.tolist(), counts.tolist()):
        size, items = -neg_size, order[start:start + count]
        while len(items):
            fits = np.flatnonzero(rooms[size:])
            if fits.size:  # the tightest open bins that fit: each takes room // size of these examples
                room = size + int(fits[0])
                stack = by_room[room]
                per_bin = room // size
                n_used = min(len(stack), -(-len(items) // per_bin))
                bins = stack[len(stack) - n_used:]
                del stack[len(stack) - n_used:]
                rooms[room] -= n_used
            else:  # open new bins
                per_bin = capacity // size
                n_used = -(-len(items) // per_bin)
                bins, room = list(range(n_bins, n_bins + n_used)), capacity
                n_bins += n_used
            take = _place(bin_of, items, bins, per_bin)
            last_count = take - (n_used - 1) * per_bin  # the last bin may take fewer
            move(bins[:-1], room - per_bin * size)
            move(bins[-1:], room - last_count * size)
            items = items[take:]
    # examples of each bin, in placement order (longest first)
    placed = order[np.argsort(bin_of[order], kind="stable")]
    bounds = np.cumsum(np.bincount(bin_of, minlength=n_bins))[:-1]
    return np.split(placed, bounds)


def packing_efficiency(lengths, bins: list[np.ndarray], capacity: int) -> float:
    """Real tokens / token slots (rows x sequence_len)."""
    return float(np.sum(lengths)) / (len(bins) * capacity) if bins else 0.0


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of an Arrow list column."""
    import pyarrow as pa

    chunked = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    array = chunked.combine_chunks()
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy(zero_copy_only=False)
    return values[offsets[0]:], offsets - offsets[0]


def packed_columns(input_ids, labels, lengths, bins) -> dict[str, np.ndarray]:
    """Gather flat token arrays into packed rows. Returns flat values and row offsets per column."""
    ids_values, ids_offsets = input_ids
    label_values, _ = labels
    example_order = np.concatenate(bins)
    lengths = np.asarray(lengths, dtype=np.int64)
    ex_len = lengths[example_order]
    # token index of every token, example after example in packed order
    ex_start_out = np.concatenate([[0], np.cumsum(ex_len)[:-1]])
    within = np.arange(ex_len.sum(), dtype=np.int64) - np.repeat(ex_start_out, ex_len)
    gather = np.repeat(ids_offsets[example_order], ex_len) + within
    new_labels = label_values[gather]
    new_labels[ex_start_out] = IGNORE_INDEX  # never the target of the previous example's last token
    examples_per_row = np.array([len(b) for b in bins], dtype=np.int64)
    row_offsets = np.concatenate([[0], np.cumsum(ex_len)[np.cumsum(examples_per_row) - 1]])
    return {"input_ids": ids_values[gather], "labels": new_labels, "position_ids": within,
            "offsets": row_offsets}


def packed_images(images: list[str], bins: list[np.ndarray]) -> list[str]:
    """The image parts of each packed row (JSON), in the order its examples sit in it: the order the model meets
    their image tokens, which is the order it assigns the images' features."""
    import json

    return [json.dumps([part for i in row for part in json.loads(images[i])]) for row in bins]


def pack_dataset(dataset, sequence_len: int, seed: int):
    """A datasets.Dataset of examples -> (packed Dataset, stats)."""
    import pyarrow as pa
    from datasets import Dataset

    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    ids = _flat(table.column("input_ids"))
    labels = _flat(table.column("labels"))
    lengths = np.diff(ids[1])
    bins = pack_lengths(lengths, sequence_len, seed)
    cols = packed_columns(ids, labels, lengths, bins)
    offsets = pa.array(cols["offsets"].astype(np.int32))
    columns = {name: pa.ListArray.from_arrays(offsets, pa.array(cols[name].astype(np.int32, copy=False)))
               for name in ("input_ids", "labels", "position_ids")}
    if "images" in table.column_names:  # a vision-language model's rows: each row's images, example after example
        columns["images"] = pa.array(packed_images(table.column("images").to_pylist(), bins))
    packed = pa.table(columns)
    stats = {
        "examples": int(lengths.size),
        "rows": len(bins),
        "tokens": int(lengths.sum()),
        "sequence_len": sequence_len,
        "efficiency": round(packing_efficiency(lengths, bins, sequence_len), 4),
    }
    # a fingerprint from the source's saves datasets hashing every token again
    source = f"{getattr(dataset, '_fingerprint', '')}-packed-{sequence_len}-{seed}"
    fingerprint = hashlib.sha256(source.encode()).hexdigest()[:16]
    return Dataset(packed, fingerprint=fingerprint), stats
