"""Finding runs under folders, and what state each is in.

A run folder is an output_dir finetune wrote: it holds run.json (a finished run), or finetune's marks without
run.json (finetune/run_folder.py: OWNER_FILE, the output lock, a complete checkpoint): a run that crashed, was
stopped, or is still training. Which of the two is told by the output lock (finetune/train/output_lock.py): a
run holds output_dir/.finetune-lock while it trains and removes it when it ends, however it ends short of a kill;
a lock whose process still lives on this host is a run in progress.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.run_folder import LOCK_FILE, is_finetune_run
from finetune.train.output_lock import holder_alive

FINISHED, CRASHED, TRAINING = "finished", "crashed", "training"
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


def status(folder: Path, has_run_json: bool) -> tuple[str, str]:
    """(status, why) of a run folder."""
    lock = folder / LOCK_FILE
    if lock.is_file():
        try:
            holder = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            holder = {}
        if isinstance(holder, dict) and holder_alive(holder):
            return TRAINING, f"training now: process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if has_run_json:
        return FINISHED, "finished: run.json written"
    return CRASHED, ("no run.json: the run stopped before its end (crashed, killed or interrupted); "
                     "`finetune train` with the same recipe resumes from its last complete checkpoint")
