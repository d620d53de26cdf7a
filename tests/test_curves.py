"""Learning-curve diagnosis on synthetic curves of each kind and on a real tiny run made to overfit."""

from __future__ import annotations

import json
import math

import pytest

from finetune.cli import main
from finetune.train.curves import diagnose, write_curves


def _history(train_fn, eval_fn=None, steps=100, eval_every=10):
    history = [{"step": s, "loss": train_fn(s)} for s in range(1, steps + 1)]
    if eval_fn:
        history += [{"step": s, "eval_loss": eval_fn(s)} for s in range(eval_every, steps + 1, eval_every)]
    return sorted(history, key=lambda e: e["step"])


def test_flat_high_training_loss_is_underfit():
    d = diagnose(_history(lambda s: 4.0 + 0.05 * math.sin(s), lambda s: 4.1))
    assert d["verdict"] == "underfit" and "barely moved" in d["reason"]


def test_still_falling_steeply_is_underfit():
    d = diagnose(_history(lambda s: 4.0 - 0.03 * s, lambda s: 4.1 - 0.03 * s))  # linear all the way down
    assert d["verdict"] == "underfit" and "still falling" in d["reason"]


def test_eval_minimum_then_rise_is_overfit_with_step_and_checkpoint(tmp_path):
    for step in (40, 60, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    d = diagnose(_history(lambda s: 3.0 * math.exp(-s / 15) + 0.1, lambda s: 1.0 + ((s - 50) / 40) ** 2),
                 output_dir=tmp_path)
    assert d["verdict"] == "overfit" and d["best_eval_step"] == 50
    assert d["checkpoint"] == str(tmp_path / "checkpoint-60")  # nearest, preferring one at/after the minimum
    # the gap's train side is the level the closing line prints: the mean of the last steps, not the last step
    assert d["gap"] == pytest.approx(d["final_eval_loss"] - d["train_loss_levels"]["last"], abs=1e-5)


def test_both_flattened_with_small_gap_is_well_fit():
    d = diagnose(_history(lambda s: 2.0 * math.exp(-s / 10) + 1.0, lambda s: 2.0 * math.exp(-s / 10) + 1.05))
    assert d["verdict"] == "well-fit" and d["gap"] == pytest.approx(0.05, abs=1e-3)
    assert "gap +0.050" in d["reason"]


def _noisy_and_still_drifting_down(s: int) -> float:
    # a per-step curve as a short run gives: noisy steps (+-0.15) around a fall that slows but keeps going
    return 2.0 * math.exp(-s / 12) + 1.6 - 0.006 * s + 0.15 * math.sin(2.7 * s)


def _with_epoch(history: list[dict], epoch_at_end: float, steps: int = 100) -> list[dict]:
    return [{**e, "epoch": round(epoch_at_end * e["step"] / steps, 4)} for e in history]


def test_a_run_stopped_early_in_its_first_epoch_with_the_loss_still_drifting_down_is_not_well_fit():
    history = _history(_noisy_and_still_drifting_down)
    # after three epochs the same curve is judged flattened: the noisy drift is not a clear fall
    assert diagnose(_with_epoch(history, 3.0))["verdict"] == "well-fit"
    d = diagnose(_with_epoch(history, 0.05))
    assert d["verdict"] == "underfit", d
    assert "5% of one epoch" in d["reason"] and "still trending down" in d["reason"]
    # early in the first epoch with a flat tail: well-fit, and the reason says how little data it saw ...
    flat = _history(lambda s: 2.0 * math.exp(-s / 10) + 1.0 + 0.1 * math.sin(2.7 * s))
    d = diagnose(_with_epoch(flat, 0.25))
    assert d["verdict"] == "well-fit" and "after 25% of one epoch" in d["reason"]
    # ... unless it saw too little of its data to call it fit (issue 43, item 6): its own verdict
    d = diagnose(_with_epoch(flat, 0.05))
    assert d["verdict"] == "too short" and "stopped after 5% of one epoch" in d["reason"], d


def test_no_logged_loss_says_how_to_fix():
    assert "logging_steps" in diagnose([{"step": 3, "train_runtime": 1.0}])["reason"]


def test_write_curves_writes_png_and_json_and_cli_rerenders(tmp_path, capsys):
    history = _history(lambda s: 2.0 * math.exp(-s / 10) + 1.0, lambda s: 2.0 * math.exp(-s / 10) + 1.05)
    d = write_curves(tmp_path, history)
    png = tmp_path / "loss_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and d["plot"] == str(png)
    assert json.loads((tmp_path / "diagnosis.json").read_text())["verdict"] == "well-fit"
    png.unlink()
    (tmp_path / "run.json").write_text(json.dumps({"log_history": history}))
    assert main(["curves", str(tmp_path)]) == 0
    assert png.is_file() and capsys.readouterr().out.startswith("well-fit")


def test_curves_on_a_folder_without_logs_is_a_user_error(tmp_path, capsys):
    assert main(["curves", str(tmp_path)]) == 2
    assert "run.json" in capsys.readouterr().err


def test_a_real_tiny_run_made_to_overfit_is_diagnosed_overfit(tmp_path):
    """Memorise 8 random sequences; held-out random sequences get worse as the model grows confident."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    vocab = 48
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    make = lambda n: [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, vocab, (n, 24))]  # noqa: E731
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=16, learning_rate=5e-3,
        lr_scheduler_type="constant", logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True, save_only_model=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=make(8), eval_dataset=make(8))
    trainer.train()
    d = write_curves(tmp_path, trainer.state.log_history)
    assert d["verdict"] == "overfit", d
    assert d["final_train_loss"] < 1.0 < d["gap"]  # memorised the training set; held-out loss climbed
    assert d["checkpoint"] == str(tmp_path / f"checkpoint-{d['best_eval_step']}")
    assert (tmp_path / "loss_curve.png").is_file()


def _noisy(fn, sd, steps=100, seed=0):
    import random

    rng = random.Random(seed)
    return lambda s: fn(s) + rng.gauss(0, sd)


def test_a_rising_training_loss_is_diverged_and_says_higher():
    d = diagnose(_history(lambda s: 0.944 + 0.0076 * s, steps=100))  # 0.944 -> ~1.70
    assert d["verdict"] == "diverged"
    assert "rose" in d["reason"] and "higher" in d["reason"] and "lower `learning_rate`" in d["reason"]


def test_a_loss_that_fell_fast_then_flattened_is_well_fit_not_underfit():
    """The quickstart's shape: 1.44 -> 0.35 in the first third, then flat with step-to-step noise."""
    d = diagnose(_history(_noisy(lambda s: 0.35 + 1.09 * math.exp(-s / 6), 0.04), steps=60))
    assert d["verdict"] == "well-fit", d
    assert "fell and flattened" in d["reason"] and "lower)" in d["reason"]


def test_a_noisy_curve_is_judged_by_its_trend_not_its_noise():
    well = diagnose(_history(_noisy(lambda s: 1.0 + 1.5 * math.exp(-s / 15), 0.25, seed=1), steps=200))
    assert well["verdict"] == "well-fit", well
    flat = diagnose(_history(_noisy(lambda s: 2.0, 0.25, seed=2), steps=200))
    assert flat["verdict"] == "underfit" and "barely moved" in flat["reason"]


def test_every_step_loss_is_used_over_the_sparse_logged_losses():
    """24 steps logged every 10 (3 logged points) still get a verdict from the 24 per-step losses."""
    losses = [0.5 + 2.0 * math.exp(-s / 4) for s in range(1, 25)]
    history = [{"step": s, "loss": sum(losses[s - 10:s]) / 10 if s >= 10 else losses[0],
                "step_losses": [[t, losses[t - 1]] for t in range(max(1, s - 9), s + 1)]} for s in (1, 10, 20)]
    history.append({"step": 24, "step_losses": [[t, losses[t - 1]] for t in range(21, 25)]})
    d = diagnose(history)
    assert d["verdict"] == "well-fit" and d["final_train_loss"] == pytest.approx(losses[-1])


def test_too_short_to_judge_only_when_it_is():
    short = diagnose(_history(lambda s: 2.0 - 0.1 * s, steps=5))
    assert short["verdict"] == "too short" and "too short to judge: 5" in short["reason"]
    assert diagnose(_history(lambda s: 0.5 + 2.0 * math.exp(-s / 2), steps=16))["verdict"] == "well-fit"
    # a loss that rose is diverged from 8 steps: that needs no trend
    assert diagnose(_history(lambda s: 1.0 + 0.2 * s, steps=8))["verdict"] == "diverged"


def test_eight_zig_zagging_steps_over_4_percent_of_an_epoch_are_too_short_not_well_fit():
    """Issue 43, item 6: 8 steps covering 4% of an epoch were "well-fit ... flattened", their gap (+0.516) from the
    last step's loss while the closing line's levels implied +0.214."""
    losses = [2.6, 1.9, 2.4, 1.6, 2.2, 1.5, 2.1, 1.4]
    history = [{"step": s, "loss": loss, "epoch": 0.005 * s} for s, loss in enumerate(losses, 1)]
    history.append({"step": 8, "eval_loss": 1.92, "epoch": 0.04})
    d = diagnose(history)
    assert d["verdict"] == "too short", d
    assert "8 training losses" in d["reason"] and "16 needed" in d["reason"]
    levels = d["train_loss_levels"]
    assert levels["last"] == pytest.approx((2.1 + 1.5 + 1.4) / 3, abs=1e-6)  # what the closing line prints
    assert d["gap"] == pytest.approx(1.92 - levels["last"], abs=1e-5)


def test_a_real_default_length_run_gets_a_verdict_from_every_step(make_recipe, tmp_path):
    """24 optimizer steps (2 micro-batches each) logged every 10: the curve has all 24 steps, and each
    interval's mean is exactly the loss the Trainer logged for it."""
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    summary = run_training(load_recipe(make_recipe("completion", n=48, adapter="lora", micro_batch_size=1,
                                                   gradient_accumulation_steps=2, logging_steps=10,
                                                   learning_rate=3e-3)))
    history = summary["log_history"]
    per_step = {s: loss for e in history for s, loss in e.get("step_losses", ())}
    assert sorted(per_step) == list(range(1, summary["steps"] + 1)) and summary["steps"] == 24
    for entry in history:
        if "loss" in entry and entry["step"] > 1:  # HF's logged loss: the mean over the steps since the last log
            interval = [per_step[s] for s in range(entry["step"] - 9, entry["step"] + 1)]
            assert sum(interval) / len(interval) == pytest.approx(entry["loss"], rel=1e-3)
    assert summary["curves"]["verdict"] in ("well-fit", "underfit", "overfit"), summary["curves"]
    assert "too short" not in summary["curves"]["reason"] and summary["curves"]["verdict"] != "too short"
