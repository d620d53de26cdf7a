"""TrainerCallbacks that keep a run safe: checkpoints on schedule, the non-finite guard, loss-spike
warnings and Ctrl-C. Used by finetune/train.py through the Trainer's public callback hooks only.

Order matters and train.py keeps it: guard, interrupt, checkpoints. The guard raises before a bad step
can be saved; the interrupt asks for a save; the checkpoint callback stages and finalizes every save.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import threading
from collections import deque
from contextlib import contextmanager

from transformers import TrainerCallback

from finetune import checkpoints
from finetune.errors import FinetuneError


class NonFiniteError(FinetuneError):
    """The loss or the gradient norm became NaN/inf."""


class Interrupted(FinetuneError):
    """Ctrl-C: the run stopped cleanly after saving (unless disabled)."""

    exit_code = 130


def warn(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[finetune] WARNING: {message}", file=sys.stderr, flush=True)


def _last_good(layout: checkpoints.Layout) -> str:
    newest = checkpoints.newest_complete(layout)
    if newest is None:
        return "No checkpoint had been written yet."
    return f"The last good checkpoint, `{newest}`, is intact; the next run resumes from it (`resume: auto`)."


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
            f"{_last_good(self.layout)} Usual causes: a learning rate too high (now {args.learning_rate:g}), fp16 "
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


class InterruptGuard(TrainerCallback):
    """Ctrl-C sets a flag; at the end of the current optimizer step the run saves (unless disabled) and stops.
    A second Ctrl-C aborts at once (KeyboardInterrupt), without saving."""

    def __init__(self, save: bool):
        self.save = save
        self.fired = False
        self.stopped_at: int | None = None

    def _handler(self, signum, frame):
        if self.fired:
            raise KeyboardInterrupt
        self.fired = True
        warn("interrupted: finishing this step" + (", then saving a checkpoint" if self.save else "")
             + " (Ctrl-C again to abort at once)")

    @contextmanager
    def catching_sigint(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def _any_rank_fired(self, args) -> bool:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.fired
        import torch

        flag = torch.tensor([1.0 if self.fired else 0.0], device=args.device)
        dist.all_reduce(flag)  # every rank stops at the same step, or a collective would hang
        return bool(flag.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_rank_fired(args):
            self.fired = True
            self.stopped_at = state.global_step
            control.should_training_stop = True
            control.should_save = control.should_save or self.save


class CheckpointCallback(TrainerCallback):
    """Asks the Trainer to save on schedule, then makes each save complete and moves it into place.

    The Trainer writes a save into output_dir/checkpoint-N (staging, see finetune/checkpoints.py); on_save
    writes the marker and renames it into checkpoints/ (rotated) and/or exports/ (kept).
    """

    def __init__(self, layout: checkpoints.Layout, fingerprint: dict, interval: int | None,
                 export_interval: int | None, max_checkpoints: int, interrupt: InterruptGuard):
        self.layout, self.fingerprint = layout, fingerprint
        self.interval, self.export_interval, self.max_checkpoints = interval, export_interval, max_checkpoints
        self.interrupt = interrupt
        self.saved: list[str] = []
        self.last_saved_step: int | None = None

    def _is_export(self, step: int) -> bool:
        return bool(self.export_interval) and step % self.export_interval == 0

    def _stage(self, state, control) -> None:
        if control.should_save and state.is_world_process_zero:
            checkpoints.prepare_staging(self.layout, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if (self.interval and step % self.interval == 0) or self._is_export(step):
            control.should_save = True
        self._stage(state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.interval is None and state.global_step != self.last_saved_step:
            control.should_save = True
        if self.interrupt.fired and not self.interrupt.save:
            control.should_save = False
        self._stage(state, control)

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank has written its part before rank 0 marks the folder complete
        step = state.global_step
        self.last_saved_step = step
        if not state.is_world_process_zero:
            return
        export = self._is_export(step)
        checkpoint = not export or bool(self.interval and step % self.interval == 0) or control.should_training_stop
        made = checkpoints.finalize(self.layout, step, self.fingerprint, checkpoint=checkpoint, export=export,
                                    max_checkpoints=self.max_checkpoints)
        self.saved.extend(str(p) for p in made)


def build_callbacks(recipe, layout: checkpoints.Layout, fingerprint: dict, precision: str) -> list:
    """[guard, interrupt, checkpoints]: the order their on_step_end must run in."""
    interrupt = InterruptGuard(recipe.save_on_interrupt)
    return [
        NonFiniteGuard(layout, recipe.on_nonfinite, recipe.max_skipped_steps, recipe.loss_spike_factor,
                       check_grads=precision != "fp16"),
        interrupt,
        CheckpointCallback(layout, fingerprint, recipe.checkpoint_interval, recipe.export_interval,
                           recipe.max_checkpoints, interrupt),
    ]


@contextmanager
def clear_write_errors(layout: checkpoints.Layout, what: str):
    """An OSError while writing (disk full, read-only, quota) becomes one clear message; the partial
    staging folder is removed and the previous complete checkpoint is left as it was."""
    try:
        yield
    except OSError as exc:
        checkpoints.remove_stale_staging(layout)
        raise checkpoints.CheckpointError(
            f"cannot write {what} to `{layout.output_dir}`: {exc.strerror or exc} "
            f"({getattr(exc, 'filename', None) or 'a file under output_dir'}). "
            f"{_last_good(layout)} Free some space (or fix the permissions) and run again."
        ) from None


def interrupted_message(interrupt: InterruptGuard, layout: checkpoints.Layout) -> str:
    newest = checkpoints.newest_complete(layout)
    saved = f"checkpoint saved at `{newest}`" if interrupt.save and newest else "no checkpoint saved"
    return (f"interrupted at step {interrupt.stopped_at}: {saved}. Run the same command again to resume "
            "(`resume: auto`).")
