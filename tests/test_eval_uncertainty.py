"""Every base-vs-tuned claim of an evaluation report has its uncertainty: a seeded bootstrap interval over the items,
"no difference" when it spans 0, "too few to tell" below ten items; a GRPO claim that goes against the training's
own verdict says so; a report's numbers keep three significant digits (0.625, not 0.62)."""

from __future__ import annotations

import random

import pytest

from finetune.evaluation.uncertainty import MIN_ITEMS, claim, compared, mean_interval, paired_interval


def test_the_interval_is_seeded_and_brackets_the_mean():
    rng = random.Random(0)
    base = [rng.random() for _ in range(40)]
    tuned = [b + 0.2 + rng.gauss(0, 0.1) for b in base]
    one, two = paired_interval(base, tuned, seed=7), paired_interval(base, tuned, seed=7)
    assert one == two and one["items"] == 40
    assert one["low"] < one["mean"] < one["high"]
    assert one["mean"] == pytest.approx(sum(tuned) / 40 - sum(base) / 40)
    assert paired_interval(base, tuned, seed=8)["low"] != one["low"]  # another seed, another draw
    assert compared(one, higher_is_better=True) == "better" and compared(one, higher_is_better=False) == "worse"


def test_an_interval_that_spans_zero_is_no_difference_and_a_handful_of_items_too_few():
    rng = random.Random(1)
    base = [rng.random() for _ in range(30)]
    noise = paired_interval(base, [b + rng.gauss(0, 0.3) for b in base], seed=0)
    assert noise["low"] < 0 < noise["high"]
    said = claim("held-out reward", 0.5, 0.52, noise, higher_is_better=True)
    assert said.startswith("no difference on held-out reward (0.5 -> 0.52; tuned - base ")
    assert "over 30 items, 95% interval" in said
    few = paired_interval([0.1, 0.2, 0.3], [0.9, 0.8, 0.95], seed=0)
    assert few["low"] > 0 and compared(few, True) == "too few to tell" and MIN_ITEMS > 3
    assert claim("held-out loss", 1.0, 0.5, few, False).startswith("too few items to tell on held-out loss")


def test_a_weighted_mean_is_the_per_token_loss_difference():
    nll_base, nll_tuned, tokens = [10.0, 40.0, 6.0], [8.0, 20.0, 6.0], [5, 20, 3]
    interval = mean_interval([(t - b) / n for b, t, n in zip(nll_base, nll_tuned, tokens)], 0, weights=tokens)
    per_token = sum(nll_tuned) / sum(tokens) - sum(nll_base) / sum(tokens)
    assert interval["mean"] == pytest.approx(per_token)


def _grpo(base: float, tuned: float, interval: dict, training: str) -> dict:
    reasons = {"reward rising": "mean reward 0.200 -> 0.400", "flat": "mean reward 0.300 -> 0.300: no clear rise"}
    return {"sides": {"base": {"reward": base, "clipped_ratio": 0.25, "mean_length": 12.0},
                      "tuned": {"reward": tuned, "clipped_ratio": 0.5, "mean_length": 20.5}},
            "differences": {"reward": interval}, "prompts": interval["items"], "samples_per_prompt": 4,
            "source": "the recipe's eval split", "answers": [],
            "training_verdict": {"verdict": training, "reason": reasons[training], "reward_first": 0.2,
                                 "reward_last": 0.4}}


def test_a_grpo_claim_against_the_training_verdict_says_so():
    from finetune.evaluation.grpo import verdict_part

    rng = random.Random(2)
    base = [rng.random() for _ in range(20)]
    gain = paired_interval(base, [b + 0.3 for b in base], seed=0)
    noise = paired_interval(base, [b + rng.gauss(0, 0.3) for b in base], seed=0)
    said = verdict_part(_grpo(0.4, 0.7, gain, "flat"))
    assert said.startswith("tuned is better on held-out reward (0.4 -> 0.7; tuned - base +0.3")
    assert "against training's verdict `flat` (mean reward 0.300 -> 0.300: no clear rise)" in said
    said = verdict_part(_grpo(0.4, 0.41, noise, "reward rising"))
    assert said.startswith("no difference on held-out reward")
    assert "training's verdict was `reward rising` (0.200 -> 0.400 on its own prompts), which these 20" in said
    assert "against" not in verdict_part(_grpo(0.4, 0.7, gain, "reward rising"))  # they agree: nothing to add


def test_a_grpo_report_has_its_shares_lengths_and_source_and_a_dpo_one_three_digits():
    from finetune.evaluation.report import _fmt, markdown

    interval = paired_interval([0.1 * i for i in range(12)], [0.1 * i + 0.2 for i in range(12)], 0, unit="prompts")
    report = {"run": "out", "verdict": "v", "model": "m", "base": "b", "prompt_format": "raw (a grpo run)",
              "data_source": "the recipe's eval split", "grpo": _grpo(0.4, 0.6, interval, "flat")}
    md = markdown(report)
    assert "held-out data: the recipe's eval split" in md and "None" not in md
    assert "- answers cut at max_completion_length: base 0.250, tuned 0.500" in md
    assert "- mean answer length: base 12.0 tokens, tuned 20.5 tokens" in md
    assert "| held-out reward | 0.4 | 0.6 | +0.2 [+0.2, +0.2] over 12 prompts: better |" in md
    assert "| held-out clipped share | 0.25 | 0.5 |  |" in md
    assert "Training's own verdict: `flat`" in md
    assert _fmt(0.625) == "0.625" and _fmt(0.8583) == "0.8583"
