"""Exact resume: a run SIGKILLed in the middle of a step (mid-epoch, with gradient accumulation, LoRA dropout
drawing from the RNG) and resumed from its last checkpoint ends with the same per-step losses, gradient norms
and final weights as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.run_folder import LOCK_FILE
from finetune.train.checkpoints import MARKER, read_marker
from finetune.recipe import load_recipe
from finetune.train import run_training

KILLER = Path(__file__).parent / "kill_during_training.py"

# 14 chat examples of different lengths, micro batch 2 -> 7 micro-batches an epoch; accumulation 2 -> 4 optimizer
# steps an epoch (the 4th has one micro-batch); 2 epochs = 8 steps. Checkpoint at step 5 (mid epoch 2: one step
# and 2 micro-batches into it); the kill comes after the first micro-batch of step 7.
# fp32 and no compile on any machine: these tests prove what resuming restores (weights, optimizer, schedule, data
# order, RNG), to 1e-6; on a GPU, `auto` would add bf16 and compiled kernels whose rounding is not the question here
SETTINGS = dict(n=14, micro_batch_size=2, gradient_accumulation_steps=2, num_epochs=2, adapter="lora", lora_r=4,
                lora_dropout=0.1, checkpoint_interval=5, max_checkpoints=1, logging_steps=1, precision="fp32",
                compile=False)
PACKED = dict(sample_packing=True, sequence_len=96, n=40)


def per_step(summary: dict) -> list[tuple]:
    return [(e["step"], e["loss"], e["grad_norm"]) for e in summary["log_history"] if "loss" in e]


def adapter(folder: Path) -> dict:
    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.parametrize("variant", ["unpacked", "packed"])
def test_sigkill_mid_step_then_resume_matches_uninterrupted_run(make_recipe, tmp_path, variant):
    settings = {**SETTINGS, **(PACKED if variant == "packed" else {})}
    if variant == "packed":
        from finetune.recipe import Recipe

        if "sample_packing" not in Recipe.model_fields:
            pytest.skip("sample_packing is not in the recipe yet")
    reference = run_training(load_recipe(make_recipe("chat", output_dir="reference", **settings)))
    total = reference["steps"]
    kill_at = total - 1
    assert total >= 6, reference["plan"]

    recipe = make_recipe("chat", output_dir="out", **{**settings, "checkpoint_interval": total - 3})
    proc = subprocess.run([sys.executable, str(KILLER), str(recipe), str(kill_at)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "run.json").exists() and not (out / "adapter_model.safetensors").exists()
    assert (out / LOCK_FILE).is_file()  # the killed run's lock stays behind; it must not block the resume
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved == [f"step-{total - 3}"] and read_marker(out / "checkpoints" / saved[0])["step"] == total - 3

    first = adapter(out / "checkpoints" / f"step-{total - 3}")
    resumed = run_training(load_recipe(recipe))  # resume: auto (the default)
    assert resumed["resumed_from"] == str(out / "checkpoints" / f"step-{total - 3}")
    assert not (out / LOCK_FILE).exists()
    assert resumed["steps"] == total
    ref_steps, res_steps = per_step(reference), per_step(resumed)
    assert [s for s, *_ in res_steps] == list(range(1, total + 1))
    for (step, loss_a, norm_a), (_, loss_b, norm_b) in zip(ref_steps, res_steps):
        assert loss_b == pytest.approx(loss_a, abs=1e-6), step
        assert norm_b == pytest.approx(norm_a, abs=1e-6), step
    final_ref, final_res = adapter(tmp_path / "reference"), adapter(out)
    assert final_ref.keys() == final_res.keys()
    worst = max((final_ref[k] - final_res[k]).abs().max().item() for k in final_ref)
    assert worst <= 1e-6, worst
    # the adapters moved: equal final weights are not equal because nothing trained
    assert any(not torch.equal(first[k], final_res[k]) for k in first)
    # the finished run keeps a checkpoint of its last step (rotation dropped the interval one), the final weights
    last = adapter(out / "checkpoints" / f"step-{total}")
    assert all(torch.equal(last[k], final_res[k]) for k in last)


def test_resume_false_starts_over_and_a_changed_recipe_is_refused(make_recipe, tmp_path):
    from finetune.train.checkpoints import CheckpointError

    recipe = make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=2, checkpoint_interval=1)
    first = run_training(load_recipe(recipe))
    assert first["resumed_from"] is None and len(first["checkpoints_written"]) == 2
    assert (tmp_path / "out" / "checkpoints" / "step-2" / MARKER).is_file()

    # different data in the same output_dir: auto refuses to mix runs, names the difference and the ways out
    changed = make_recipe("completion", n=8, adapter="lora", lora_r=4, max_steps=2, checkpoint_interval=1)
    with pytest.raises(CheckpointError, match=r"lora_r: 2 -> 4.*resume: false"):
        run_training(load_recipe(changed))
    fresh = run_training(load_recipe(changed, ["resume=false"]))
    assert fresh["resumed_from"] is None and fresh["steps"] == 2


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_changed_training_setting_is_refused_and_a_finished_run_has_nothing_left(make_recipe, tmp_path, capsys,
                                                                                    umask_022):
    """Issue 14.4: the README's second launch line (`--set learning_rate=5e-4` after the quickstart) and a
    switch to sample_packing used to resume the finished run silently, train 0 steps and write run.json with
    settings that never applied."""
    from finetune.cli import main

    recipe = make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=2, micro_batch_size=2)
    assert main(["train", str(recipe)]) == 0
    run_json = tmp_path / "out" / "run.json"
    before = run_json.read_text()
    assert json.loads(before)["steps"] == 2 and json.loads(before)["learning_rate"] == 1e-3
    # issue 14.5: the adapter and its checkpoint are ordinary files (safetensors alone would leave them 0600)
    out = tmp_path / "out"
    for path in (out / "adapter_model.safetensors", out / "checkpoints" / "step-2" / "adapter_model.safetensors"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    capsys.readouterr()

    for override, change in (("learning_rate=5e-4", "learning_rate: 0.001 -> 0.0005"),
                             ("sample_packing=true", "sample_packing: False -> True")):
        assert main(["train", str(recipe), "--set", override]) == 2
        err = capsys.readouterr().err
        assert change in err and "new `output_dir`" in err and "resume: false" in err and "put the setting" in err
        assert "Traceback" not in err
    # the same recipe again: finished, said plainly, nothing written
    assert main(["train", str(recipe)]) == 0
    err = capsys.readouterr().err
    assert "nothing left to train" in err and "step 2" in err
    assert run_json.read_text() == before

    # a larger max_steps is "train longer": it resumes from step 2 and runs one more step
    longer = run_training(load_recipe(recipe, ["max_steps=3"]))
    assert longer["resumed_from"].endswith("step-2") and longer["steps"] == 3
    assert json.loads(run_json.read_text())["learning_rate"] == 1e-3


def test_training_longer_continues_from_the_finished_step_not_the_last_interval_checkpoint(make_recipe, tmp_path):
    """Issue 25.8: with `checkpoint_interval`, the last step had no checkpoint of its own, so raising max_steps
    resumed from the interval checkpoint before it, retrained the steps after it under the new schedule and
    replaced the finished model. A finished run keeps a resumable checkpoint of its last step."""
    recipe = make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=3, micro_batch_size=2,
                         checkpoint_interval=2)
    done = run_training(load_recipe(recipe))
    assert done["steps"] == 3
    assert "step-3" in [p.name for p in (tmp_path / "out" / "checkpoints").iterdir()]  # (rotation keeps the newest)
    longer = run_training(load_recipe(recipe, ["max_steps=4"]))
    assert longer["resumed_from"].endswith("step-3") and longer["steps"] == 4  # one new step, none retrained
