"""Learning-curve verdicts of reward runs on synthetic log histories (the metrics RewardTrainer logs): nothing
learned, margins exploding, scores drifting, and a run that learned; and the reward panels in the plot."""

from __future__ import annotations

import math
import random

import pytest

from finetune.train.curves import diagnose, write_curves

LOG2 = math.log(2)


def _history(loss, accuracy, margin, mean, steps=60, log_every=3, seed=0):
    """A log history as RewardTrainer writes it: a loss every step, the reward metrics every `log_every` steps in the
    same entry, and an eval every 15 steps."""
    rng = random.Random(seed)
    history = []
    for s in range(1, steps + 1):
        entry = {"step": s, "loss": loss(s) + rng.gauss(0, 0.01)}
        if s % log_every == 0:
            entry.update({"accuracy": accuracy(s), "margin": margin(s), "mean_reward": mean(s),
                          "chosen_reward": mean(s) + margin(s) / 2, "rejected_reward": mean(s) - margin(s) / 2})
        history.append(entry)
        if s % 15 == 0:
            history.append({"step": s, "eval_loss": loss(s) + 0.02, "eval_accuracy": accuracy(s) - 0.05,
                            "eval_margin": margin(s), "eval_mean_reward": mean(s)})
    return history


def test_accuracy_at_chance_is_nothing_learned():
    rng = random.Random(1)
    d = diagnose(_history(lambda s: LOG2 - 0.0005 * s, lambda s: 0.5 + rng.gauss(0, 0.05), lambda s: 0.01,
                          lambda s: 0.0))
    assert d["verdict"] == "nothing learned", d  # without the rule: underfit (the loss barely moved)
    assert "chance is 0.5" in d["reason"] and "learning_rate" in d["reason"]
    assert d["reward_model"]["accuracy"]["last"] == pytest.approx(0.5, abs=0.1)


def test_a_high_accuracy_that_stays_high_while_the_loss_falls_is_learning():
    d = diagnose(_history(lambda s: LOG2 * math.exp(-s / 20) + 0.1, lambda s: 0.95, lambda s: 0.05 * s,
                          lambda s: 0.0))
    assert d["verdict"] not in ("nothing learned", "margins exploding", "scores drifting"), d


def test_margins_past_what_the_loss_needs_are_exploding():
    d = diagnose(_history(lambda s: 0.6 * math.exp(-s / 8) + 0.01, lambda s: min(1.0, 0.6 + s / 30),
                          lambda s: 0.4 * s, lambda s: 0.1))
    assert d["verdict"] == "margins exploding", d
    assert "learning_rate" in d["reason"] and "normalize: true" in d["reason"] and "eval_accuracy" in d["reason"]


def test_scores_moving_as_a_whole_are_drifting_with_the_centering_hint():
    d = diagnose(_history(lambda s: 0.6 * math.exp(-s / 15) + 0.1, lambda s: min(1.0, 0.6 + s / 60),
                          lambda s: 1.0 + s / 60, lambda s: -0.3 * s))
    assert d["verdict"] == "scores drifting", d
    assert "center_rewards_coefficient" in d["reason"]


def test_the_plot_adds_accuracy_margin_and_score_panels(tmp_path):
    history = _history(lambda s: LOG2 * math.exp(-s / 20) + 0.1, lambda s: 0.9, lambda s: 0.05 * s, lambda s: 0.0)
    write_curves(tmp_path, history)
    from PIL import Image

    assert Image.open(tmp_path / "loss_curve.png").size[0] > 1000  # the 2 x 2 layout, not the loss alone (770)
