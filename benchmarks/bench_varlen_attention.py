"""Per-example attention for packed rows on CPU: one slice per example (the first form) vs unbind + split
(the current one), forward + backward, side by side in one run, on SmolLM2-135M's attention shapes.

Both forms make the same SDPA calls on the same values; they differ in the backward pass, where each slice
zero-fills a whole (batch, heads, seq, dim) gradient and adds it up, while split's backward is one cat.
The run also checks that both give the same output and q/k/v gradients, bit for bit, on every repeat.

Rows: 2 x 512 tokens packed with examples of the benchmark chat data's lengths (20-250 tokens), 9 query
heads over 3 key/value heads, head_dim 64, repeated for `--layers` (30, as in SmolLM2) per measurement.

Run: OMP_NUM_THREADS=2 python benchmarks/bench_varlen_attention.py [--repeats 5] [--layers 30]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_fast_paths import _sliced_attention  # noqa: E402  the oracle the tests hold the current form to

from finetune.model.varlen_attention import varlen_sdpa_forward  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, ROW, ROWS = 9, 3, 64, 512, 2


def packed_positions(seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    rows = []
    for _ in range(ROWS):
        row = []
        while len(row) < ROW:
            row += list(range(rng.randint(20, 250)))
        rows.append(row[:ROW])
    return torch.tensor(rows)


def step(fn, layers: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(ROWS, HEADS, ROW, HEAD_DIM, generator=gen).requires_grad_()
    k = torch.randn(ROWS, KV_HEADS, ROW, HEAD_DIM, generator=gen).requires_grad_()
    v = torch.randn(ROWS, KV_HEADS, ROW, HEAD_DIM, generator=gen).requires_grad_()
    grad = torch.randn(ROWS, ROW, HEADS, HEAD_DIM, generator=gen)
    started = time.perf_counter()
    for _ in range(layers):
        out = fn(q, k, v)
        out.backward(grad)
    return time.perf_counter() - started, (out.detach(), q.grad, k.grad, v.grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    module = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True, training=True)
    ratios = []
    for repeat in range(args.repeats):
        positions = packed_positions(repeat)
        sliced = lambda q, k, v: _sliced_attention(q, k, v, positions, HEADS // KV_HEADS)  # noqa: E731
        split = lambda q, k, v: varlen_sdpa_forward(module, q, k, v, None, position_ids=positions)[0]  # noqa: E731
        step(split, 1, repeat)  # warm-up
        order = [("sliced", sliced), ("split", split)] if repeat % 2 == 0 else [("split", split), ("sliced", sliced)]
        times, results = {}, {}
        for name, fn in order:
            times[name], results[name] = step(fn, args.layers, repeat)
        same = all(torch.equal(a, b) for a, b in zip(results["sliced"], results["split"]))
        ratios.append(times["sliced"] / times["split"])
        examples = sum(len([p for p in row if p == 0]) for row in positions.tolist())
        print(f"[{repeat}] {examples} examples in {ROWS} x {ROW}: one slice per example {times['sliced']:.3f} s, "
              f"unbind + split {times['split']:.3f} s ({args.layers} layers, forward + backward): "
              f"{ratios[-1]:.2f}x; bit-identical: {same}", flush=True)
        if not same:
            raise SystemExit("the two forms differ: the speedup is not exact")
    ratios.sort()
    print(f"unbind + split vs one slice per example: median {ratios[len(ratios) // 2]:.2f}x "
          f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x) over {args.repeats} repeats")


if __name__ == "__main__":
    main()
