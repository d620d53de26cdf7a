"""What a run that stopped before its end leaves in output_dir: stopped.json, the reason in one line.

    {"kind": "interrupted" | "aborted" | "error", "message": the one-line reason, "step": the step it reached,
     "checkpoint": the newest complete checkpoint (its folder and step) or null, "time": unix time}

interrupted: Ctrl-C, the current step finished and a checkpoint saved (unless disabled): resumable from it.
aborted: a second Ctrl-C, stopped at once without saving. error: an exception (a fast path's kernel failing, a
non-finite loss under `on_nonfinite: stop`, out of memory...). A run killed outright (SIGKILL, the machine) writes
nothing: the runs page tells that case by the record's absence (finetune/runs/folders.py).

Written by the main process once the run has claimed output_dir (a mistake found before that leaves nothing, as
every check before training does), removed when a run starts in the folder, so the record is always about the last
run there. finetune/runs/ reads it; run_folder.STOPPED_FILE names it.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from finetune.atomic import write_text_atomic
from finetune.errors import FinetuneError
from finetune.redact import redact_text
from finetune.run_folder import STOPPED_FILE, Layout, complete_checkpoints

MAX_MESSAGE = 600  # characters of the reason kept: a CUDA out-of-memory message runs to several lines


def one_line(err: BaseException) -> str:
    """The reason as one line: a finetune message as it is (already one paragraph), another exception as its type and
    the first line of its message."""
    text = " ".join(str(err).split()) if isinstance(err, FinetuneError) else \
        f"{type(err).__name__}: {next((line.strip() for line in str(err).splitlines() if line.strip()), '')}"
    text = redact_text(text.rstrip(": "))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 5] + " [...]"


def _kind(err: BaseException) -> str:
    from finetune.train.callbacks.interrupt import Interrupted

    if isinstance(err, Interrupted):
        return "interrupted"
    return "aborted" if isinstance(err, KeyboardInterrupt) else "error"


def write_stop(layout: Layout, err: BaseException, step: int | None) -> Path:
    complete = complete_checkpoints(layout)
    checkpoint = {"path": str(complete[-1][1]), "step": complete[-1][0]} if complete else None
    message = one_line(err) if not isinstance(err, KeyboardInterrupt) else \
        "Ctrl-C twice: stopped at once, without saving a checkpoint"
    record = {"kind": _kind(err), "message": message, "step": step, "checkpoint": checkpoint, "time": time.time()}
    path = layout.output_dir / STOPPED_FILE
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def clear_stop(layout: Layout) -> None:
    """A run starts in the folder: an earlier run's record is no longer the folder's story."""
    (layout.output_dir / STOPPED_FILE).unlink(missing_ok=True)


@contextmanager
def recording_stops(layout: Layout, step: Callable[[], int | None], main: bool,
                    recorded: Callable[[], bool] = lambda: False):
    """Whatever stops the run inside this block is written to stopped.json (main process), then raised as it was;
    not once the run `recorded` itself: what is raised after its run.json (GRPO's exit for a run that got no
    reward) is in run.json and diagnosis.json, and the folder is a finished run's."""
    try:
        yield
    except BaseException as err:
        if main and layout.output_dir.is_dir() and not recorded():
            try:
                write_stop(layout, err, step())
            except OSError:  # a full disk: the error that stopped the run matters more than its record
                pass
        raise
