"""output_dir on disk, the read side: where checkpoints live and when one is complete.

    output_dir/checkpoint-N/        staging: the Trainer writes here (an incomplete checkpoint by definition)
    output_dir/checkpoints/step-N/  temporary checkpoints, the newest `max_checkpoints` are kept
    output_dir/exports/step-N/      permanent exports every `export_interval` steps, never deleted

A checkpoint is complete when its MARKER exists and every file the marker lists has the size it records
(finetune/train/checkpoints.py writes them, marker last). Pure filesystem code, below every stage: the
recipe loader reads checkpoints too (`resume: PATH`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMPLETE"  # JSON: step, time, fingerprint, files {relative path: size}
STEP_PREFIX = "step-"


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
