"""Finding runs under folders, and what state each is in.

A run folder is an output_dir finetune wrote: it holds run.json (a finished run), or finetune's marks without
run.json (finetune/run_folder.py: OWNER_FILE, the output lock, a complete checkpoint): a run that crashed, was
stopped, or is still training. A run that stopped on an error or Ctrl-C says so in stopped.json (its kind and the
one-line reason, finetune/train/stop_record.py): interrupted (Ctrl-C, a checkpoint saved) or crashed; a folder
with neither run.json nor that record was killed outright. Which of the two is told by the output lock (finetune/train/output_lock.py): a
run holds output_dir/.finetune-lock while it trains and removes it when it ends, however it ends short of a kill;
a lock whose process still lives on this host is a run in progress.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.run_folder import LOCK_FILE, STOPPED_FILE, Layout, complete_checkpoints, is_finetune_run
from finetune.train.output_lock import holder_alive

FINISHED, CRASHED, INTERRUPTED, TRAINING = "finished", "crashed", "interrupted", "training"
SKIP_DIRS = {"checkpoints", "exports", "eval", "node_modules", "__pycache__"}  # inside a run, or never runs


def is_run(folder: Path) -> bool:
    return (folder / "run.json").is_file() or is_finetune_run(folder)


def find_runs(folders: list[str | Path]) -> list[Path]:
    """Every run folder at or under `folders`, in path order, each once. A folder that does not exist is a
    mistake (one message); a folder with no run in it gives an empty list."""
    missing = [str(f) for f in folders if not Path(f).is_dir()]
    if missing:
        raise FinetuneError(f"`finetune runs`: no such folder: {', '.join(f'`{m}`' for m in missing)}. Give the "
                            "folders that hold your runs' output_dir (a run folder holds run.json or checkpoints).")
    found: dict[Path, None] = {}
    for top in folders:
        for root, dirs, _ in os.walk(Path(top).resolve(), followlinks=False):
            here = Path(root)
            if is_run(here):
                found[here] = None
                dirs[:] = []  # a run's own subfolders (checkpoints, eval) are not runs
                continue
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
    return sorted(found)


def read_stop(folder: Path) -> dict | None:
    """The run's stopped.json (finetune/train/stop_record.py): why it stopped; None when it has none."""
    try:
        stop = json.loads((folder / STOPPED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stop if isinstance(stop, dict) and isinstance(stop.get("message"), str) else None


def _resume(folder: Path) -> str:
    """What `finetune train` with the same recipe does next in this folder."""
    complete = complete_checkpoints(Layout(folder))
    if not complete:
        return "no checkpoint: `finetune train` with the same recipe starts it again from step 0"
    return (f"last complete checkpoint at step {complete[-1][0]}: `finetune train` with the same recipe resumes "
            "from it")


def status(folder: Path, has_run_json: bool, stop: dict | None = None) -> tuple[str, str]:
    """(status, why) of a run folder. `stop`: its stopped.json, when it has one: written by a later run than run.json
    (a run starting in the folder removes it), so it wins over run.json."""
    lock = folder / LOCK_FILE
    if lock.is_file():
        try:
            holder = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            holder = {}
        if isinstance(holder, dict) and holder_alive(holder):
            return TRAINING, f"training now: process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if stop is not None:
        at = f" at step {stop['step']}" if isinstance(stop.get("step"), int) else ""
        state = INTERRUPTED if stop.get("kind") in ("interrupted", "aborted") else CRASHED  # Ctrl-C: the user's stop
        said = stop["message"].rstrip(". ") if state == INTERRUPTED else f"stopped on an error{at}: {stop['message']}"
        earlier = "; run.json is an earlier run's" if has_run_json else ""
        # Ctrl-C's own line names the checkpoint it saved and how to resume: nothing to add
        resume = "" if "checkpoint saved at" in said else f"; {_resume(folder)}"
        return state, f"{said}{earlier}{resume}"
    if has_run_json:
        return FINISHED, "finished: run.json written"
    return CRASHED, ("no run.json and no stop record: the run was killed (SIGKILL, out of host memory, the machine "
                     f"went down) before its end; {_resume(folder)}")
