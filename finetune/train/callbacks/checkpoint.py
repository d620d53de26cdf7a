"""Checkpoints on schedule: ask the Trainer to save, then make each save complete and move it into place
(finetune/train/checkpoints.py has the layout and the completeness rules)."""

from __future__ import annotations

from contextlib import contextmanager

from transformers import TrainerCallback

from finetune.train import checkpoints
from finetune.train.callbacks.interrupt import InterruptGuard


class CheckpointCallback(TrainerCallback):
    """Asks the Trainer to save on schedule, then makes each save complete and moves it into place.

    The Trainer writes a save into output_dir/checkpoint-N (staging, see finetune/train/checkpoints.py); on_save
    writes the marker and renames it into checkpoints/ (rotated) and/or exports/ (kept).
    """

    def __init__(self, layout: checkpoints.Layout, fingerprint: dict, interval: int | None,
                 export_interval: int | None, max_checkpoints: int, interrupt: InterruptGuard,
                 before_save=None):
        self.layout, self.fingerprint = layout, fingerprint
        self.before_save = before_save  # called with the TrainingArguments; raises to refuse the save
        self.interval, self.export_interval, self.max_checkpoints = interval, export_interval, max_checkpoints
        self.interrupt = interrupt
        self.saved: list[str] = []
        self.last_saved_step: int | None = None

    def _is_export(self, step: int) -> bool:
        return bool(self.export_interval) and step % self.export_interval == 0

    def _stage(self, args, state, control) -> None:
        if control.should_save and self.before_save is not None:
            self.before_save(args)  # the non-finite guard: no checkpoint of weights a NaN step touched
        if control.should_save and state.is_world_process_zero:
            checkpoints.prepare_staging(self.layout, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if (self.interval and step % self.interval == 0) or self._is_export(step):
            control.should_save = True
        if self.interval and control.should_training_stop and not self.interrupt.fired:
            # the last step: a finished run keeps a checkpoint of it, so training longer (a higher max_steps or
            # num_epochs) continues from here instead of retraining the steps after the last interval
            control.should_save = True
        self._stage(args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.interval is None and state.global_step != self.last_saved_step:
            control.should_save = True
        if self.interrupt.fired and not self.interrupt.save:
            control.should_save = False
        self._stage(args, state, control)

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
            f"{checkpoints.last_good_message(layout)} Free some space (or fix the permissions) and run again."
        ) from None
