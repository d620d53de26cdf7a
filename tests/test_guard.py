"""The non-finite guard (stop | skip), the loss-spike warning and Ctrl-C, on real training runs of the tiny
model. A NaN is injected with a forward hook on one chosen step; Ctrl-C is a real SIGINT to this process."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from finetune.train.callbacks.guard import NonFiniteError, NonFiniteGuard
from finetune.train.callbacks.interrupt import Interrupted
from finetune.train.checkpoints import Layout, read_marker
from finetune.recipe import load_recipe
from finetune.train import run_training


class NaNAtStep(TrainerCallback):
    """Makes the logits NaN for the micro-batches of optimizer step `step` only."""

    def __init__(self, step: int):
        self.step, self.handle = step, None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            head = model.get_output_embeddings()
            self.handle = head.register_forward_hook(lambda mod, inp, out: out * float("nan"))

    def on_step_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


class SigintAtStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of an accumulation


def recipe(make_recipe, **settings):
    base = dict(n=12, adapter="lora", lora_r=2, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
                checkpoint_interval=1, max_checkpoints=5)
    return load_recipe(make_recipe("completion", **{**base, **settings}))


def adapter_at(out, step):
    return load_file(str(out / "checkpoints" / f"step-{step}" / "adapter_model.safetensors"))


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(make_recipe, tmp_path):
    with pytest.raises(NonFiniteError) as err:
        run_training(recipe(make_recipe), extra_callbacks=[NaNAtStep(3)])
    out = tmp_path / "out"
    message = str(err.value)
    assert "step 3" in message and "not finite" in message and str(out / "checkpoints" / "step-2") in message
    assert "learning_rate" in message and "on_nonfinite: skip" in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert all(torch.isfinite(v).all() for v in adapter_at(out, 2).values())
    assert not (out / "run.json").exists() and not (out / "checkpoint-3").exists()


def test_skip_drops_the_bad_update_and_carries_on(make_recipe, tmp_path, capsys):
    summary = run_training(recipe(make_recipe, on_nonfinite="skip"), extra_callbacks=[NaNAtStep(2)])
    out = tmp_path / "out"
    assert summary["steps"] == 4 and summary["nonfinite_skipped_steps"] == [2]
    assert "step 2: non-finite gradient norm; update skipped" in capsys.readouterr().err
    before, after, later = adapter_at(out, 1), adapter_at(out, 2), adapter_at(out, 3)
    assert all(torch.equal(before[k], after[k]) for k in before)  # step 2 changed nothing
    assert any(not torch.equal(after[k], later[k]) for k in after)  # step 3 trained again
    assert all(torch.isfinite(v).all() for v in load_file(str(out / "adapter_model.safetensors")).values())


def test_skip_gives_up_after_too_many_bad_steps_in_a_row(make_recipe, tmp_path):
    class AlwaysNaN(NaNAtStep):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if self.handle is None and state.global_step >= 1:
                self.handle = model.get_output_embeddings().register_forward_hook(lambda m, i, o: o * float("nan"))

        def on_step_end(self, args, state, control, **kwargs):
            pass

    with pytest.raises(NonFiniteError, match="2 steps in a row"):
        run_training(recipe(make_recipe, on_nonfinite="skip", max_skipped_steps=1, max_steps=6),
                     extra_callbacks=[AlwaysNaN(0)])


def test_loss_spike_is_warned_about(tmp_path, capsys):
    class Args:
        learning_rate = 1e-3

    guard = NonFiniteGuard(Layout(tmp_path), "stop", 3, spike_factor=3.0)
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.0, 1.8, 2.2, 9.0, 2.0], start=1):
        guard.on_log(Args, type("S", (), {"global_step": step})(), None, logs={"loss": loss})
    assert [s["step"] for s in guard.spikes] == [7]
    assert "loss spike at step 7: 9.0000 is 4.5x the median" in capsys.readouterr().err
    with pytest.raises(NonFiniteError, match="training loss"):
        guard.on_log(Args, type("S", (), {"global_step": 9})(), None, logs={"loss": float("inf")})


def test_ctrl_c_finishes_the_step_saves_and_exits_130(make_recipe, tmp_path):
    before = signal.getsignal(signal.SIGINT)  # default_int_handler; SIG_IGN under nohup or a background job
    with pytest.raises(Interrupted) as err:
        run_training(recipe(make_recipe, checkpoint_interval=100), extra_callbacks=[SigintAtStep(2)])
    out = tmp_path / "out"
    assert err.value.exit_code == 130
    assert "interrupted at step 2" in str(err.value) and str(out / "checkpoints" / "step-2") in str(err.value)
    assert read_marker(out / "checkpoints" / "step-2")["step"] == 2
    assert not (out / "run.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_ctrl_c_without_save_on_interrupt_saves_nothing(make_recipe, tmp_path):
    with pytest.raises(Interrupted, match="no checkpoint saved"):
        run_training(recipe(make_recipe, checkpoint_interval=None, save_on_interrupt=False),
                     extra_callbacks=[SigintAtStep(2)])
    assert not (tmp_path / "out" / "checkpoints").exists()
