"""The non-finite guard: a NaN/inf loss or gradient norm stops the run (or skips the update), and loss spikes
are warned about. The checkpoint before a bad step is kept: the guard raises before that step can be saved."""

from __future__ import annotations

import math
import statistics
from collections import deque

from transformers import TrainerCallback

from finetune.errors import FinetuneError
from finetune.log import get_logger
from finetune.train import checkpoints


log = get_logger(__name__)


class NonFiniteError(FinetuneError):
    """The loss or the gradient norm became NaN/inf."""


def warn(message: str) -> None:
    log.warning(message)


class NonFiniteGuard(TrainerCallback):
    """NaN/inf gradient norm (checked before the optimizer step) or logged loss: stop, or skip the step.

    `skip` drops the update by clearing the gradients before optimizer.step() (torch optimizers leave a
    parameter without a gradient untouched); the learning-rate schedule still advances. With fp16 the
    GradScaler already skips overflowing steps, so only the logged loss is checked.
    """

    def __init__(self, layout: checkpoints.Layout, mode: str, max_skipped: int, spike_factor: float | None,
                 check_grads: bool = True, window: int = 20):
        self.layout, self.mode, self.max_skipped = layout, mode, max_skipped
        self.spike_factor, self.check_grads = spike_factor, check_grads
        self.recent: deque[float] = deque(maxlen=window)
        self.skipped_in_a_row = 0
        self.skipped_steps: list[int] = []
        self.spikes: list[dict] = []

    def _stop(self, step: int, what: str, args) -> None:
        raise NonFiniteError(
            f"training stopped at step {step}: the {what} is not finite. Nothing from this step was saved. "
            f"{checkpoints.last_good_message(self.layout)} Usual causes: a learning rate too high (now {args.learning_rate:g}), fp16 "
            "overflow (use bf16 where the GPU has it), or broken data. Lower `learning_rate` and run again, or set "
            "`on_nonfinite: skip` to drop such steps."
        )

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.check_grads or model is None:
            return
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        step = state.global_step + 1  # the step this update would complete
        if torch.isfinite(norm):
            self.skipped_in_a_row = 0
            return
        if self.mode == "stop":
            self._stop(step, f"gradient norm ({norm.item()})", args)
        self.skipped_in_a_row += 1
        self.skipped_steps.append(step)
        if self.skipped_in_a_row > self.max_skipped:
            self._stop(step, f"gradient norm, for {self.skipped_in_a_row} steps in a row,", args)
        for p in model.parameters():
            p.grad = None
        warn(f"step {step}: non-finite gradient norm; update skipped ({self.skipped_in_a_row} in a row)")

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        loss = logs.get("loss")
        if loss is None:
            return
        if not math.isfinite(loss):
            if self.mode == "stop":
                self._stop(state.global_step, f"training loss ({loss})", args)
            return
        if self.spike_factor and len(self.recent) >= 5:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.spike_factor * median:
                self.spikes.append({"step": state.global_step, "loss": loss, "median": median})
                warn(f"loss spike at step {state.global_step}: {loss:.4f} is {loss / median:.1f}x the median "
                     f"{median:.4f} of the last {len(self.recent)} logged losses")
        self.recent.append(loss)
