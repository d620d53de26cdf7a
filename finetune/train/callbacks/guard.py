"""The non-finite guard: a NaN/inf loss or gradient norm stops the run (or skips the update), and loss spikes
are warned about. The checkpoint before a bad step is kept: the guard raises before anything after it is saved.

No host synchronisation per step with `stop` (the default): the gradient norm's finiteness stays on the device,
where the first bad step and its norm are recorded; the flag is read only when the host needs it anyway (a log,
an evaluation, a checkpoint, the end of training). A bad step found late still names its own step.
"""

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

    `stop` records the first non-finite step on the device and raises at the next log, evaluation, save
    (`verify`, called by the checkpoint callback before it stages one) or at the end of training.
    `skip` must decide before optimizer.step() whether to drop the update, so it reads one flag per optimizer
    step: it clears the gradients (torch optimizers leave a parameter without a gradient untouched; zeroed
    gradients would not do, Adam's moments and weight decay still move it); the learning-rate schedule still
    advances. With fp16 the GradScaler already skips overflowing steps, so only the logged loss is checked.
    """

    def __init__(self, layout: checkpoints.Layout, mode: str, max_skipped: int, spike_factor: float | None,
                 check_grads: bool = True, window: int = 20):
        self.layout, self.mode, self.max_skipped = layout, mode, max_skipped
        self.spike_factor, self.check_grads = spike_factor, check_grads
        self.recent: deque[float] = deque(maxlen=window)
        self.skipped_in_a_row = 0
        self.skipped_steps: list[int] = []
        self.spikes: list[dict] = []
        self._first_bad_step = self._first_bad_norm = None  # device tensors (`stop`); 0: no bad step yet

    def _stop(self, step: int, what: str, args) -> None:
        raise NonFiniteError(
            f"training stopped at step {step}: the {what} is not finite. Nothing from this step was saved. "
            f"{checkpoints.last_good_message(self.layout)} Usual causes: a learning rate too high (now {args.learning_rate:g}), fp16 "
            "overflow (use bf16 where the GPU has it), or broken data. To resume from that checkpoint, keep the "
            "settings and set `on_nonfinite: skip` to drop such steps; a lower `learning_rate` (or any other "
            "training setting) means starting over: `--set resume=false` or a new `output_dir`."
        )

    def _grad_norm(self, model):
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.check_grads or model is None:
            return
        norm = self._grad_norm(model)
        if norm is None:
            return
        step = state.global_step + 1  # the step this update would complete
        if self.mode == "stop":
            self._record(norm, step)
        else:
            self._skip_if_bad(norm, step, model, args)

    def _record(self, norm, step: int) -> None:
        """Keep the first non-finite step and its norm on the device: no host read."""
        import torch

        if self._first_bad_step is None:
            self._first_bad_step = torch.zeros((), dtype=torch.long, device=norm.device)
            self._first_bad_norm = torch.zeros((), dtype=norm.dtype, device=norm.device)
        first = (self._first_bad_step == 0) & ~torch.isfinite(norm)
        self._first_bad_step = torch.where(first, step, self._first_bad_step)
        self._first_bad_norm = torch.where(first, norm, self._first_bad_norm)

    def verify(self, args) -> None:
        """Raise NonFiniteError if a recorded step had a non-finite gradient norm (one host read)."""
        if self._first_bad_step is None:
            return
        step = int(self._first_bad_step)
        if step:
            self._stop(step, f"gradient norm ({self._first_bad_norm.item()})", args)

    def _skip_if_bad(self, norm, step: int, model, args) -> None:
        import torch

        if torch.isfinite(norm):  # the one host read per optimizer step that `skip` needs
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        self.skipped_steps.append(step)
        if self.skipped_in_a_row > self.max_skipped:
            self._stop(step, f"gradient norm, for {self.skipped_in_a_row} steps in a row,", args)
        for p in model.parameters():
            p.grad = None
        warn(f"step {step}: non-finite gradient norm; update skipped ({self.skipped_in_a_row} in a row)")

    def on_step_end(self, args, state, control, **kwargs):
        # the host reads the loss to log it, the weights to evaluate or save them: check first, at no extra cost
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            self.verify(args)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.verify(args)  # an epoch's end may evaluate (eval_strategy epoch) or save: once an epoch, at no cost

    def on_train_end(self, args, state, control, **kwargs):
        self.verify(args)  # before the trained model is saved

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        loss = logs.get("loss")
        if loss is None:
            return
        if not math.isfinite(loss):
            if self.mode == "stop":
                self.verify(args)  # a non-finite gradient norm names the step where it began
                self._stop(state.global_step, f"training loss ({loss})", args)
            return
        if self.spike_factor and len(self.recent) >= 5:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.spike_factor * median:
                self.spikes.append({"step": state.global_step, "loss": loss, "median": median})
                warn(f"loss spike at step {state.global_step}: {loss:.4f} is {loss / median:.1f}x the median "
                     f"{median:.4f} of the last {len(self.recent)} logged losses")
        self.recent.append(loss)
