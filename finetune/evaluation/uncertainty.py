"""How sure a base-vs-tuned claim is: a bootstrap interval over the items evaluated (prompts, pairs, examples), seeded.

    d = paired_interval(base, tuned, seed=recipe.seed)             # one value per item and side, the same items
    d = paired_interval(base, tuned, seed, weights=tokens)         # a weighted mean (held-out loss: per token)
    compared(d, higher_is_better=True)   -> "better" | "worse" | "no difference"
    span(d)                              -> "+0.093 [+0.012, +0.171] over 8 prompts"

The difference is tuned minus base, the mean over the items. Its interval is the percentile bootstrap (Efron &
Tibshirani 1993, ch. 13): the items are drawn again with replacement RESAMPLES times, the mean difference taken
each time, and the middle LEVEL of those means kept. Pairing keeps what the two sides share (a hard prompt is hard
for both), so the interval is of the difference itself. An interval that spans 0 is "no difference": these items
cannot tell the two models apart. Below MIN_ITEMS items the percentile bootstrap is too narrow to trust (it cannot
see the spread a handful of items hide), so no claim is made: "too few to tell". The same seed gives the same
interval.
"""

from __future__ import annotations

import math

RESAMPLES = 2000
LEVEL = 0.95
MIN_ITEMS = 10  # fewer items than this: too few to tell, whatever the interval
CHUNK = 250  # resamples drawn at once: RESAMPLES x items indices would be large for thousands of examples


def mean_interval(values: list[float], seed: int, weights: list[float] | None = None, unit: str = "items") -> dict:
    """{mean, low, high, items, unit, level, resamples, seed}: a (weighted) mean of `values` and its bootstrap
    interval; non-finite values are left out. `mean` is None when nothing is left."""
    import numpy as np

    pairs = [(float(v), 1.0 if weights is None else float(w))
             for v, w in zip(values, weights if weights is not None else values) if math.isfinite(float(v))]
    out = {"items": len(pairs), "unit": unit, "level": LEVEL, "resamples": RESAMPLES, "seed": seed}
    if not pairs:
        return {**out, "mean": None, "low": None, "high": None}
    x, w = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, RESAMPLES, CHUNK):
        draw = rng.integers(0, len(x), size=(min(CHUNK, RESAMPLES - start), len(x)))
        means.append((x[draw] * w[draw]).sum(axis=1) / w[draw].sum(axis=1))
    means = np.sort(np.concatenate(means))
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {**out, "mean": float((x * w).sum() / w.sum()), "low": float(low), "high": float(high)}


def paired_interval(base: list[float], tuned: list[float], seed: int, weights: list[float] | None = None,
                    unit: str = "items") -> dict:
    """The mean of tuned - base over the same items, with its bootstrap interval (mean_interval of the differences)."""
    if len(base) != len(tuned):
        raise ValueError(f"paired_interval: {len(base)} base values and {len(tuned)} tuned ones; pair them per item")
    return mean_interval([t - b for b, t in zip(base, tuned)], seed, weights, unit)


def compared(interval: dict, higher_is_better: bool) -> str:
    """"better" / "worse" when the whole interval is on one side of 0, else "no difference"; "too few to tell"
    below MIN_ITEMS items."""
    if interval["items"] < MIN_ITEMS:
        return "too few to tell"
    if interval.get("mean") is None or interval["low"] <= 0 <= interval["high"]:
        return "no difference"
    up = interval["low"] > 0
    return "better" if up == higher_is_better else "worse"


def span(interval: dict, digits: int = 3) -> str:
    """`+0.093 [+0.012, +0.171] over 8 prompts` (the interval's level is LEVEL, said once where it is explained)."""
    if interval.get("mean") is None:
        return f"no values over {interval['items']} {interval['unit']}"
    fmt = f"{{:+.{digits}g}}"
    return (f"{fmt.format(interval['mean'])} [{fmt.format(interval['low'])}, {fmt.format(interval['high'])}] over "
            f"{interval['items']} {interval['unit']}")


def claim(metric: str, base: float, tuned: float, interval: dict, higher_is_better: bool) -> str:
    """`tuned is better on held-out reward (0.858 -> 0.951; tuned - base +0.093 [+0.012, +0.171] over 8 prompts)`, or
    `no difference on ...` when the interval spans 0."""
    word = compared(interval, higher_is_better)
    head = {"no difference": f"no difference on {metric}",
            "too few to tell": f"too few {interval['unit']} to tell on {metric}"}.get(word, f"tuned is {word} on {metric}")
    few = f"; {MIN_ITEMS} or more needed" if word == "too few to tell" else ""
    return f"{head} ({base:.4g} -> {tuned:.4g}; tuned - base {span(interval)}, {LEVEL:.0%} interval{few})"
