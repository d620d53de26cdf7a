"""The non-finite guard reads nothing from the device on an ordinary step with `on_nonfinite: stop`:
every host read a tensor can do (bool, item, int, float, tolist) is counted while the guard runs."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerControl

from finetune.train.callbacks.guard import NonFiniteError, NonFiniteGuard
from finetune.train.checkpoints import Layout


class Args:
    learning_rate = 1e-3


def state(step):
    return type("S", (), {"global_step": step})()


@pytest.fixture
def host_reads(monkeypatch):
    """A list that grows by one for every tensor read back to the host."""
    reads = []
    for name in ("__bool__", "item", "__int__", "__float__", "tolist", "__index__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *a, _original=original, _name=name, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


def model_with_grads(bad: bool) -> torch.nn.Module:
    model = torch.nn.Linear(4, 4)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan") if bad else 0.5)
    return model


def test_stop_mode_reads_nothing_per_step_and_still_names_the_bad_step(tmp_path, host_reads):
    guard = NonFiniteGuard(Layout(tmp_path), "stop", 3, spike_factor=None)
    quiet = TrainerControl()  # no log, eval or save asked for at these steps
    for step in range(5):  # steps 1..5; step 3's gradients are NaN, step 4's fine again
        guard.on_pre_optimizer_step(Args, state(step), quiet, model=model_with_grads(bad=step == 2))
        guard.on_step_end(Args, state(step + 1), quiet)
    assert host_reads == []
    with pytest.raises(NonFiniteError, match="stopped at step 3: the gradient norm \\(nan\\)"):
        guard.on_step_end(Args, state(5), TrainerControl(should_log=True))  # the host reads the loss anyway
    assert len(host_reads) == 2  # the step flag, and the norm for the message


def test_a_save_is_refused_after_a_bad_step_even_when_nothing_is_logged(tmp_path):
    guard = NonFiniteGuard(Layout(tmp_path), "stop", 3, spike_factor=None)
    guard.on_pre_optimizer_step(Args, state(0), TrainerControl(), model=model_with_grads(bad=True))
    guard.on_pre_optimizer_step(Args, state(1), TrainerControl(), model=model_with_grads(bad=False))
    with pytest.raises(NonFiniteError, match="step 1"):
        guard.verify(Args)  # what the checkpoint callback calls before it stages a save


def test_skip_mode_reads_one_flag_per_optimizer_step(tmp_path, host_reads):
    guard = NonFiniteGuard(Layout(tmp_path), "skip", 3, spike_factor=None)
    for step in range(4):
        guard.on_pre_optimizer_step(Args, state(step), TrainerControl(), model=model_with_grads(bad=False))
    assert host_reads == ["__bool__"] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stop_mode_does_not_synchronize_cuda(tmp_path):
    guard = NonFiniteGuard(Layout(tmp_path), "stop", 3, spike_factor=None)
    model = torch.nn.Linear(64, 64).cuda()
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
    try:
        for step in range(3):
            guard.on_pre_optimizer_step(Args, state(step), TrainerControl(), model=model)
            guard.on_step_end(Args, state(step + 1), TrainerControl())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    guard.verify(Args)  # finite: nothing raised
