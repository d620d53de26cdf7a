"""output_dir on disk, the read side: where checkpoints live and when one is complete.

    output_dir/checkpoint-N/        staging: the Trainer writes here (an incomplete checkpoint by definition)
    output_dir/checkpoints/step-N/  temporary checkpoints, the newest `max_checkpoints` are kept
    output_dir/exports/step-N/      permanent exports every `export_interval` steps, never deleted

A checkpoint is complete when its MARKER exists and every file the marker lists has the size it records
(finetune/train/checkpoints.py writes them, marker last). Pure filesystem code, below every stage: the
recipe loader reads checkpoints too (`resume: PATH`), and asks whose folder output_dir is.

Whose folder: a run writes OWNER_FILE into output_dir before anything else (train/checkpoints.claim_output_dir),
so even a run that crashed before its first checkpoint or its run.json leaves a folder recognised as
finetune's; so does LOCK_FILE, which a run holds from its start (train/output_lock.py: one run per folder).
Folders written before OWNER_FILE existed are recognised by what only finetune writes: a complete
checkpoint, or a run.json with finetune's keys. Anything else in output_dir is someone else's (the recipe
check refuses such a folder: finetune/recipe/checks.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMPLETE"  # JSON: step, time, fingerprint, files {relative path: size}
STEP_PREFIX = "step-"
OWNER_FILE = ".finetune-run"  # JSON {"created": unix time}: the first file a run writes into its output_dir
LOCK_FILE = ".finetune-lock"  # JSON {pid, host, started, command}: held while a run trains (train/output_lock.py)
STOPPED_FILE = "stopped.json"  # JSON {kind, message, step, checkpoint, time}: why a run stopped (train/stop_record.py)
RESOLVED_RECIPE = "recipe.resolved.yml"  # the recipe a run trains with, written when it starts and again at its end
RUN_JSON_KEYS = ("recipe", "versions", "steps")  # run.json keys only finetune's run.json has together


@dataclass(frozen=True)
class Layout:
    output_dir: Path

    @property
    def checkpoints(self) -> Path:
        return self.output_dir / "checkpoints"

    @property
    def exports(self) -> Path:
        return self.output_dir / "exports"

    def staging(self, step: int) -> Path:
        # where transformers' Trainer writes (args.output_dir / f"checkpoint-{global_step}")
        return self.output_dir / f"checkpoint-{step}"


def read_marker(folder: Path) -> dict | None:
    """The marker of a complete checkpoint; None when the folder is incomplete or damaged."""
    try:
        data = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
        for name, size in data["files"].items():
            if (Path(folder) / name).stat().st_size != size:
                return None
        int(data["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def complete_checkpoints(layout: Layout) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint and export, oldest first (checkpoints before exports)."""
    found = []
    for rank, parent in enumerate((layout.exports, layout.checkpoints)):
        if not parent.is_dir():
            continue
        for folder in parent.glob(f"{STEP_PREFIX}*"):
            marker = read_marker(folder) if folder.is_dir() else None
            if marker is not None:
                found.append((int(marker["step"]), rank, folder))
    return [(step, folder) for step, _, folder in sorted(found)]


# --- whose folder is output_dir -------------------------------------------------------------------------


def _older_run(folder: Path) -> bool:
    """A finetune run folder written before OWNER_FILE: a complete checkpoint or finetune's run.json."""
    if complete_checkpoints(Layout(folder)):
        return True
    try:
        data = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(key in data for key in RUN_JSON_KEYS)


def is_finetune_run(folder: Path) -> bool:
    # the lock alone: a run that holds the folder and has not written its OWNER_FILE yet, or was killed before
    return (folder / OWNER_FILE).is_file() or (folder / LOCK_FILE).is_file() or _older_run(folder)


def foreign_entries(folder: Path) -> list[str]:
    """Names in `folder` that finetune did not write; [] for a missing or empty folder or a finetune run's."""
    if not folder.is_dir():
        return []
    names = sorted(entry.name for entry in folder.iterdir())
    if not names or is_finetune_run(folder):
        return []
    return names
