"""Learning-curve verdicts of preference runs on synthetic log histories (the metrics PreferenceTrainer logs),
and a real DPO run that cannot learn."""

from __future__ import annotations

import json
import logging
import math
import random
import re

import pytest

from finetune.cli import main
from finetune.train.curves import diagnose, write_curves

LOG2 = math.log(2)


def _history(loss, accuracy, margin, chosen, rejected, steps=60, log_every=3, eval_every=None, seed=0):
    """A log history as PreferenceTrainer writes it: a loss every step, the preference metrics every
    `log_every` steps in the same entry, eval_-prefixed ones every `eval_every` steps. The rewards are
    0.1 x each side's log-prob change since step 0 (the reference)."""
    rng = random.Random(seed)
    history = []
    for s in range(1, steps + 1):
        entry = {"step": s, "loss": loss(s) + rng.gauss(0, 0.01)}
        if s % log_every == 0:
            entry.update({"rewards/accuracies": accuracy(s), "rewards/margins": margin(s),
                          "rewards/chosen": 0.1 * (chosen(s) - chosen(0)),
                          "rewards/rejected": 0.1 * (rejected(s) - rejected(0)),
                          "logps/chosen": chosen(s), "logps/rejected": rejected(s)})
        history.append(entry)
        if eval_every and s % eval_every == 0:
            history.append({"step": s, "eval_loss": loss(s) + 0.02, "eval_rewards/accuracies": accuracy(s),
                            "eval_rewards/margins": margin(s), "eval_logps/chosen": chosen(s),
                            "eval_logps/rejected": rejected(s)})
    return history


def _noise(sd, seed=1):
    rng = random.Random(seed)
    return lambda: rng.gauss(0, sd)


def test_accuracy_at_chance_and_loss_at_log2_is_nothing_learned():
    n = _noise(0.08)
    d = diagnose(_history(lambda s: LOG2, lambda s: min(1.0, max(0.0, 0.5 + n())), lambda s: 0.002 * n(),
                          lambda s: -150.0, lambda s: -152.0, eval_every=15))
    assert d["verdict"] == "nothing learned", d  # without the rule: "underfit" (the loss barely moved)
    assert "chance is 0.5" in d["reason"] and "log 2" in d["reason"] and "learning_rate" in d["reason"]
    assert d["preference"]["rewards/accuracies"]["last"] == pytest.approx(0.5, abs=0.1)


def test_loss_at_log2_with_accuracy_falling_is_nothing_learned_with_one_set_of_numbers():
    """Issue 33, item 2: DPO's loss 0.690 -> 0.691 and accuracy 0.67 -> 0.61 was called "well-fit" (0.61 is
    above the chance band, so it read as "learned"). A loss that stays at log 2 while accuracy falls or stays
    flat learned nothing; the verdict's loss levels are the ones the run's closing line prints."""
    d = diagnose(_history(lambda s: 0.690 + 0.001 * s / 60, lambda s: 0.67 - 0.06 * s / 60, lambda s: 0.001,
                          lambda s: -150.0, lambda s: -152.0))
    assert d["verdict"] == "nothing learned", d
    levels = d["train_loss_levels"]
    assert f"{levels['first']:.3f} -> {levels['last']:.3f}" in d["reason"], d
    assert re.search(r"rewards/accuracies 0\.6\d -> 0\.6\d", d["reason"]) and "learning_rate" in d["reason"], d
    # accuracy that rises clearly while the loss stays near log 2 (small beta: small margins) did learn
    d = diagnose(_history(lambda s: 0.690, lambda s: 0.55 + 0.3 * s / 60, lambda s: 0.001 * s,
                          lambda s: -150.0, lambda s: -152.0))
    assert d["verdict"] == "well-fit" and "moved little" in d["reason"], d


def test_rewards_that_still_tie_are_nothing_learned():
    """Policy == reference (e.g. LoRA whose updates do not change the log-probs): every reward is 0, accuracy
    (chosen > rejected) is 0, the loss is exactly log 2."""
    d = diagnose(_history(lambda s: LOG2, lambda s: 0.0, lambda s: 0.0, lambda s: -150.0, lambda s: -152.0))
    assert d["verdict"] == "nothing learned" and "still tie" in d["reason"], d


def test_eval_metrics_alone_are_read_when_no_training_ones_were_logged():
    history = [e for e in _history(lambda s: LOG2, lambda s: 0.5, lambda s: 0.0, lambda s: -150.0,
                                   lambda s: -152.0, eval_every=10)]
    for entry in history:  # only the loss and the eval split's metrics
        for key in [k for k in entry if k.startswith(("rewards/", "logps/"))]:
            del entry[key]
    d = diagnose(history)
    assert d["verdict"] == "nothing learned" and d["reason"].startswith("eval_rewards/accuracies ended at 0.50")


def test_a_preference_run_that_learns_keeps_the_sft_verdicts():
    """Accuracy rising to 0.85 with the loss falling from log 2 and flattening: well-fit, as an SFT curve would be;
    the chosen answers' log-prob held while the rejected ones' fell: no displacement."""
    def grow(s):
        return 1 - math.exp(-s / 8)

    d = diagnose(_history(lambda s: 0.35 + (LOG2 - 0.35) * math.exp(-s / 8), lambda s: 0.5 + 0.35 * grow(s),
                          lambda s: 2.0 * grow(s), lambda s: -150.0 + 0.5 * grow(s), lambda s: -152.0 - 20 * grow(s),
                          eval_every=10))
    assert d["verdict"] == "well-fit", d
    assert d["preference"]["logps/chosen"]["last"] > d["preference"]["logps/chosen"]["first"]


def test_chosen_logp_falling_while_the_margin_grows_is_likelihood_displacement(tmp_path):
    def grow(s):
        return 1 - math.exp(-s / 8)

    history = _history(lambda s: 0.35 + (LOG2 - 0.35) * math.exp(-s / 8), lambda s: 0.5 + 0.4 * grow(s),
                       lambda s: 3.0 * grow(s), lambda s: -150.0 - 40 * grow(s), lambda s: -152.0 - 70 * grow(s))
    d = diagnose(history)
    assert d["verdict"] == "likelihood displacement", d  # without the rule: well-fit (the loss fell and flattened)
    assert re.search(r"fell from -1\d\d\.\d to -1\d\d\.\d", d["reason"])
    assert "rpo_alpha: 1.0" in d["reason"] and "rejected answers' from" in d["reason"]
    # a rising loss is still "diverged" first: that is the more urgent fix
    rising = _history(lambda s: LOG2 + 0.01 * s, lambda s: 0.5 + 0.4 * grow(s), lambda s: 3.0 * grow(s),
                      lambda s: -150.0 - 40 * grow(s), lambda s: -152.0 - 70 * grow(s))
    assert diagnose(rising)["verdict"] == "diverged"
    # the plot: loss beside accuracy, margin and log-prob panels (a wider figure); the CLI re-renders it
    d = write_curves(tmp_path, history)
    png = (tmp_path / "loss_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 11 * 110
    (tmp_path / "run.json").write_text(json.dumps({"log_history": history}))
    assert main(["curves", str(tmp_path)]) == 0


def test_a_preference_loss_that_moves_little_while_the_ranking_is_learned_is_not_underfit():
    """IPO's loss starts at 1 / (2 beta)^2 = 25 and falls slowly; KTO's is bounded by its weights and logs no
    accuracy: the SFT rule alone ("barely moved": underfit) would misjudge both."""
    def grow(s):
        return 1 - math.exp(-s / 8)

    ipo = _history(lambda s: 25.0 - 2.0 * grow(s), lambda s: 0.5 + 0.45 * grow(s), lambda s: 0.5 * grow(s),
                   lambda s: -150.0 + 2 * grow(s), lambda s: -152.0 - 5 * grow(s))
    d = diagnose(ipo)
    assert d["verdict"] == "well-fit" and "moved little" in d["reason"] and "rewards/accuracies" in d["reason"], d
    kto = [{k: v for k, v in e.items() if k != "rewards/accuracies"}
           for e in _history(lambda s: 0.5 - 0.02 * grow(s), lambda s: 0.5, lambda s: 0.3 * grow(s),
                             lambda s: -150.0 + 2 * grow(s), lambda s: -152.0 - 2 * grow(s))]
    d = diagnose(kto)
    assert d["verdict"] == "well-fit" and re.search(r"rewards/margins 0\.\d+ -> 0\.30", d["reason"]), d
    # the same loss with the ranking unchanged: still underfit
    flat = [{k: v for k, v in e.items() if k != "rewards/accuracies"}
            for e in _history(lambda s: 0.5 - 0.02 * grow(s), lambda s: 0.5, lambda s: 0.01,
                              lambda s: -150.0, lambda s: -152.0)]
    assert diagnose(flat)["verdict"] == "underfit"


def test_sft_histories_get_no_preference_section():
    d = diagnose([{"step": s, "loss": 2.0 * math.exp(-s / 10) + 1.0} for s in range(1, 61)])
    assert d["verdict"] == "well-fit" and "preference" not in d


def test_a_real_dpo_run_that_cannot_move_is_nothing_learned(tmp_path, tiny_model_dir, caplog):
    """A learning rate far too small for the log-probs to change: the curves say so, and why."""
    from test_plan_preference import _dpo_recipe

    from finetune.recipe import load_recipe
    from finetune.train.run import run_training

    recipe = load_recipe(_dpo_recipe(tmp_path, tiny_model_dir, n=40, micro_batch_size=4,
                                     gradient_accumulation_steps=1, num_epochs=1, learning_rate=1e-12))
    with caplog.at_level(logging.INFO, logger="finetune"):
        summary = run_training(recipe)
    assert summary["steps"] == 10
    diagnosis = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert diagnosis["verdict"] == "nothing learned", diagnosis
    # the closing line gives the loss levels the verdict read, not two other numbers
    done = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("done:"))
    levels = diagnosis["train_loss_levels"]
    assert f"train loss {levels['first']:.4f} -> {levels['last']:.4f}" in done, done
