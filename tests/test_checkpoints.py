"""Checkpoint files on disk: a checkpoint counts only when complete; rotation keeps the newest, never touches
exports; an interrupted write or delete is never resumed from; a write error leaves the previous one intact."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.train import checkpoints as ck
from finetune.recipe import load_recipe
from finetune.train import run_training

FP = {"data": "abc", "seed": 1}


def fake_checkpoint(layout: ck.Layout, step: int, parent: str = "checkpoints", complete: bool = True) -> Path:
    """A staged folder with two files, finalized like a real save (or left without its marker)."""
    staging = ck.prepare_staging(layout, step)
    (staging / "adapter_model.safetensors").write_bytes(b"w" * (100 + step))
    (staging / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if not complete:
        target = getattr(layout, parent) / f"step-{step}"
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
        return target
    return ck.finalize(layout, step, FP, checkpoint=parent == "checkpoints", export=parent == "exports",
                       max_checkpoints=10)[0]


class R:  # the recipe fields find_resume reads
    def __init__(self, output_dir, resume="auto"):
        self.output_dir, self.resume = str(output_dir), resume


def test_auto_resume_picks_the_newest_complete_checkpoint(tmp_path):
    layout = ck.Layout(tmp_path)
    fake_checkpoint(layout, 2)
    fake_checkpoint(layout, 4)
    fake_checkpoint(layout, 6, complete=False)  # killed before its marker: never chosen
    truncated = fake_checkpoint(layout, 8)
    (truncated / "adapter_model.safetensors").write_bytes(b"w" * 10)  # a file shorter than the marker says
    ck.prepare_staging(layout, 10)  # killed mid-write in the staging folder
    assert ck.find_resume(R(tmp_path), FP) == str(tmp_path / "checkpoints" / "step-4")
    fake_checkpoint(layout, 5, parent="exports")  # exports count too
    assert ck.find_resume(R(tmp_path), FP) == str(tmp_path / "exports" / "step-5")
    assert ck.find_resume(R(tmp_path, resume=False), FP) is None
    assert ck.find_resume(R(tmp_path / "empty"), FP) is None
    with pytest.raises(ck.CheckpointError, match=r"seed: 1 -> 2"):
        ck.find_resume(R(tmp_path), {**FP, "seed": 2})
    # the next run clears only what an interrupted run left in staging
    assert ck.remove_stale_staging(layout) == [tmp_path / "checkpoint-10"]


def test_rotation_keeps_the_newest_and_never_touches_exports(tmp_path):
    layout = ck.Layout(tmp_path)
    for step in (1, 2, 3):
        fake_checkpoint(layout, step)
    fake_checkpoint(layout, 1, parent="exports")
    half_deleted = fake_checkpoint(layout, 0, complete=False)
    ck.rotate(layout, keep=2)
    assert sorted(p.name for p in layout.checkpoints.iterdir()) == ["step-2", "step-3"]
    assert not half_deleted.exists()
    assert ck.read_marker(layout.exports / "step-1") is not None


def test_export_and_checkpoint_at_the_same_step_share_files(tmp_path):
    layout = ck.Layout(tmp_path)
    staging = ck.prepare_staging(layout, 6)
    (staging / "model.safetensors").write_bytes(b"x" * 1000)
    made = ck.finalize(layout, 6, FP, checkpoint=True, export=True, max_checkpoints=1)
    assert made == [layout.exports / "step-6", layout.checkpoints / "step-6"] and not staging.exists()
    assert all(ck.read_marker(p)["step"] == 6 for p in made)
    ck.delete_checkpoint(layout.checkpoints / "step-6")  # rotation later: the export keeps its bytes
    assert (layout.exports / "step-6" / "model.safetensors").read_bytes() == b"x" * 1000


def test_recipe_refuses_dangerous_output_dirs_and_bad_resume_paths(tmp_path, make_recipe):
    from finetune.errors import RecipeError

    recipe = make_recipe("completion", n=4)
    for value, needle in (("/", "filesystem root"), ("~/", "home folder"), (".", "recipe's own folder"),
                          ("..", "recipe's own folder")):
        with pytest.raises(RecipeError, match=needle):
            load_recipe(recipe, [f"output_dir={value}"])
    with pytest.raises(RecipeError, match="no checkpoint folder"):
        load_recipe(recipe, ["resume=nowhere/step-3"])
    fake_checkpoint(ck.Layout(tmp_path / "old"), 3, complete=False)
    with pytest.raises(RecipeError, match="not a complete checkpoint"):
        load_recipe(recipe, [f"resume={tmp_path / 'old' / 'checkpoints' / 'step-3'}"])
    assert load_recipe(recipe, ["output_dir=runs/a"]).output_dir == str(tmp_path / "runs" / "a")


def test_disk_full_while_saving_gives_a_clear_error_and_keeps_the_previous_checkpoint(
        make_recipe, tmp_path, monkeypatch):
    from transformers import Trainer

    original, calls = Trainer.save_model, []

    def save_then_fail(self, output_dir=None, _internal_call=False):
        calls.append(output_dir)
        original(self, output_dir, _internal_call)  # the files are written...
        if len(calls) == 2:  # ...but the disk fills up before the second checkpoint completes
            raise OSError(errno.ENOSPC, "No space left on device", str(output_dir))

    monkeypatch.setattr(Trainer, "save_model", save_then_fail)
    recipe = load_recipe(make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=3, micro_batch_size=2,
                                     checkpoint_interval=1, max_checkpoints=1))
    with pytest.raises(ck.CheckpointError) as err:
        run_training(recipe)
    message = str(err.value)
    out = tmp_path / "out"
    assert "No space left on device" in message and str(out / "checkpoints" / "step-1") in message
    assert "Traceback" not in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]
    assert ck.read_marker(out / "checkpoints" / "step-1")["step"] == 1
    assert not (out / "checkpoint-2").exists()  # the half-written save is gone
    weights = load_file(str(out / "checkpoints" / "step-1" / "adapter_model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_an_explicit_resume_path_refuses_changed_settings_and_a_finished_run_is_said_plainly(tmp_path, capsys):
    layout = ck.Layout(tmp_path)
    folder = fake_checkpoint(layout, 4)
    explicit = R(tmp_path, resume=str(folder))
    with pytest.raises(ck.CheckpointError, match=r"seed: 1 -> 2.*put the setting back.*new `output_dir`"):
        ck.find_resume(explicit, {**FP, "seed": 2})
    # other data with an explicit path: continuing from chosen weights on new data is allowed, with a warning
    assert ck.find_resume(explicit, {**FP, "data": "new"}, total_steps=10) == str(folder)
    assert "other data" in capsys.readouterr().err
    # a key an older marker never recorded is not a difference
    assert ck.find_resume(R(tmp_path), {**FP, "sample_packing": True}, total_steps=10) == str(folder)
    # at the last step, but the run died while saving its result (no run.json yet): resume and finish it
    assert ck.find_resume(R(tmp_path), FP, total_steps=4) == str(folder)
    (tmp_path / "run.json").write_text("{}")
    for resume in (R(tmp_path), explicit):
        with pytest.raises(ck.NothingToTrain, match=r"nothing left to train.*step 4.*4 optimizer steps"):
            ck.find_resume(resume, FP, total_steps=4)
    assert ck.NothingToTrain.exit_code == 0
    # checkpoint_interval left the last step without a checkpoint: run.json says the run finished at step 6
    (tmp_path / "run.json").write_text('{"steps": 6}')
    with pytest.raises(ck.NothingToTrain, match=r"finished at step 6 and this run has 6 optimizer steps"):
        ck.find_resume(R(tmp_path), FP, total_steps=6)
    assert ck.find_resume(R(tmp_path), FP, total_steps=8) == str(folder)  # raised max_steps: train longer
    # only the data changed: the refusal also names the explicit path that continues anyway
    with pytest.raises(ck.CheckpointError, match=r"set `resume: .*step-4`"):
        ck.find_resume(R(tmp_path), {**FP, "data": "new"}, total_steps=8)
