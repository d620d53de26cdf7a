"""Packer micro-benchmark: best-fit decreasing over 1M example lengths, and packed rows built from them.

Two length distributions (uniform 20..2047 and log-normal around ~150 tokens, as in chat data), rows of
2048 tokens. Reports seconds and packing efficiency (real tokens / token slots), and, for scale, the
packer against a plain first-fit-decreasing loop in Python on a 20k slice (same run).

Run: python benchmarks/bench_packing.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from finetune.data.packing import pack_dataset, pack_lengths, packing_efficiency


def python_first_fit_decreasing(lengths, capacity):
    rooms = []
    for length in sorted(lengths.tolist(), reverse=True):
        for i, room in enumerate(rooms):
            if room >= length:
                rooms[i] -= length
                break
        else:
            rooms.append(capacity - length)
    return len(rooms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=2048)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "uniform 20..2047": rng.integers(20, args.capacity, size=args.n),
        "log-normal (median ~150)": rng.lognormal(5.0, 0.8, size=args.n).clip(1, args.capacity).astype(np.int64),
    }
    for name, lengths in cases.items():
        started = time.perf_counter()
        bins = pack_lengths(lengths, args.capacity, seed=0)
        seconds = time.perf_counter() - started
        print(f"{name:26s} {args.n:,} examples -> {len(bins):,} rows in {seconds:.2f} s "
              f"({args.n / seconds / 1e6:.2f} M examples/s); efficiency {packing_efficiency(lengths, bins, args.capacity):.4f}")
    small = cases["log-normal (median ~150)"][:20_000]
    started = time.perf_counter()
    ours = len(pack_lengths(small, args.capacity, seed=0))
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    naive = python_first_fit_decreasing(small, args.capacity)
    naive_s = time.perf_counter() - started
    print(f"20k slice: ours {ours_s * 1e3:.0f} ms ({ours} rows) vs Python first-fit decreasing {naive_s * 1e3:.0f} ms "
          f"({naive} rows): {naive_s / ours_s:.0f}x")

    from datasets import Dataset

    lengths = cases["log-normal (median ~150)"][:200_000]
    ids = [rng.integers(0, 32000, size=n).tolist() for n in lengths]
    dataset = Dataset.from_dict({"input_ids": ids, "labels": ids})
    started = time.perf_counter()
    packed, stats = pack_dataset(dataset, args.capacity, seed=0)
    print(f"pack_dataset: 200k examples ({stats['tokens']:,} tokens) -> {stats['rows']:,} packed rows with labels and "
          f"position_ids in {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
