"""Ctrl-C: finish the current optimizer step, save a checkpoint (unless disabled), stop with exit code 130."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from transformers import TrainerCallback

from finetune.errors import FinetuneError
from finetune.train import checkpoints
from finetune.train.callbacks.guard import warn


class Interrupted(FinetuneError):
    """Ctrl-C: the run stopped cleanly after saving (unless disabled)."""

    exit_code = 130


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


def interrupted_message(interrupt: InterruptGuard, layout: checkpoints.Layout) -> str:
    newest = checkpoints.newest_complete(layout)
    saved = f"checkpoint saved at `{newest}`" if interrupt.save and newest else "no checkpoint saved"
    return (f"interrupted at step {interrupt.stopped_at}: {saved}. Run the same command again to resume "
            "(`resume: auto`).")
