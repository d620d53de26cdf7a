"""Checkpoints that survive anything: where they live, when one is complete, which one to resume.

    output_dir/checkpoint-N/        staging: the Trainer writes here (an incomplete checkpoint by definition)
    output_dir/checkpoints/step-N/  temporary checkpoints, the newest `max_checkpoints` are kept
    output_dir/exports/step-N/      permanent exports every `export_interval` steps, never deleted here

A checkpoint is complete when its COMPLETE marker exists and every file the marker lists has the size it
records. The marker is written last (after every file is fsynced) and the folder is then renamed into
checkpoints/ or exports/, so a run killed mid-write leaves only a staging folder, which is never loaded
and is removed by the next run. Deleting an old checkpoint removes its marker first, so a run killed
mid-delete leaves a folder that no longer looks complete.

Pure filesystem code: no torch, no transformers. The read side (Layout, reading a marker, the complete
checkpoints: finetune/run_folder.py) and the recipe-time checks (where a run may write, what `resume:` names:
finetune/recipe_checks.py) live below every stage, for the recipe loader; they are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from finetune.errors import FinetuneError
# the recipe-time checks and the read side of output_dir live below every stage, for the recipe loader
from finetune.recipe_checks import location_problems, resume_problem  # noqa: F401
from finetune.run_folder import MARKER, STEP_PREFIX, Layout, complete_checkpoints, read_marker  # noqa: F401

STAGING_FLAG = ".finetune-staging"  # put in a staging folder before the Trainer writes into it

# Settings that must not change between a checkpoint and a run resuming from it: they change what a
# step is (the data, its order, the batch) or what the weights and optimizer state mean.
FINGERPRINT_FIELDS = (
    "base_model", "adapter", "lora_r", "lora_alpha", "lora_target_modules", "lora_modules_to_save",
    "load_in_4bit", "load_in_8bit", "micro_batch_size", "gradient_accumulation_steps", "seed", "optimizer",
)


class CheckpointError(FinetuneError):
    """A checkpoint cannot be written, found or used."""


def run_fingerprint(recipe, data_key: str, world_size: int) -> dict:
    """What a checkpoint must agree with to be resumed exactly (recorded in its marker)."""
    fields = {name: getattr(recipe, name, None) for name in FINGERPRINT_FIELDS}
    fields.update(data=data_key, world_size=world_size)
    return json.loads(json.dumps(fields, default=str))


# --- completeness --------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return  # some filesystems refuse to open folders; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_marker(folder: Path, step: int, fingerprint: dict) -> None:
    """fsync every file in `folder`, then write the marker atomically: the last thing written."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MARKER, STAGING_FLAG)):
        _fsync_path(path)
        files[str(path.relative_to(folder))] = path.stat().st_size
    data = {"step": step, "time": time.time(), "fingerprint": fingerprint, "files": files}
    tmp = folder / f".{MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MARKER)
    _fsync_path(folder)


# --- resume -----------------------------------------------------------------------------------------


def _differences(saved: dict, current: dict) -> list[str]:
    return [f"{key}: {saved.get(key)!r} -> {current.get(key)!r}"
            for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]


def find_resume(recipe, fingerprint: dict) -> str | None:
    """The checkpoint to resume from, or None to start fresh. Reads only; never writes."""
    if recipe.resume is False:
        return None
    if recipe.resume != "auto":
        marker = read_marker(Path(recipe.resume))
        if marker is None:
            raise CheckpointError(resume_problem(recipe.resume) or f"`{recipe.resume}` is not a complete checkpoint")
        changed = _differences(marker.get("fingerprint", {}), fingerprint)
        if changed:
            print(f"[finetune] WARNING: resuming from {recipe.resume}, written with other settings ("
                  + "; ".join(changed) + "); the run will not match an uninterrupted one", file=sys.stderr,
                  flush=True)
        return str(recipe.resume)
    found = complete_checkpoints(Layout(Path(recipe.output_dir)))
    if not found:
        return None
    step, folder = found[-1]
    changed = _differences(read_marker(folder).get("fingerprint", {}), fingerprint)
    if changed:
        raise CheckpointError(
            f"`resume: auto` found the checkpoint `{folder}` (step {step}) in output_dir, but it was written for "
            f"other data or settings ({'; '.join(changed)}). Use another `output_dir`, set `resume: false` to "
            "start over in this one, or `resume: <path>` to continue from it anyway."
        )
    return str(folder)


# --- writing --------------------------------------------------------------------------------------


def prepare_staging(layout: Layout, step: int) -> Path:
    """The flagged staging folder for the Trainer to write step `step` into. Never emptied here: other ranks
    may already be writing into it; leftovers of a dead run were removed at start (remove_stale_staging)."""
    folder = layout.staging(step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAGING_FLAG).touch()
    return folder


def remove_stale_staging(layout: Layout) -> list[Path]:
    """Remove staging folders left by a run that died mid-write (only ours: they carry the flag)."""
    removed = []
    for folder in layout.output_dir.glob("checkpoint-*"):
        if (folder / STAGING_FLAG).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    for parent in (layout.checkpoints, layout.exports):
        for folder in parent.glob(".partial-*") if parent.is_dir() else ():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # exports share the bytes of the checkpoint they come from: no extra disk
    except OSError:
        shutil.copy2(src, dst)


def _move_into(folder: Path, parent: Path, step: int) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / f"{STEP_PREFIX}{step}"
    if read_marker(target) is not None:  # this step is already saved (e.g. epoch end == interval)
        shutil.rmtree(folder)
        return target
    if target.exists():
        delete_checkpoint(target)
    os.replace(folder, target)
    _fsync_path(parent)
    (target / STAGING_FLAG).unlink(missing_ok=True)
    return target


def finalize(layout: Layout, step: int, fingerprint: dict, checkpoint: bool, export: bool,
             max_checkpoints: int) -> list[Path]:
    """Mark the staged step complete and move it to checkpoints/ and/or exports/. Returns the new folders."""
    staging = layout.staging(step)
    write_marker(staging, step, fingerprint)
    made = []
    if export and checkpoint:
        layout.exports.mkdir(parents=True, exist_ok=True)
        partial = layout.exports / f".partial-{STEP_PREFIX}{step}"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(staging, partial, copy_function=_link_or_copy)
        made.append(_move_into(partial, layout.exports, step))
    elif export:
        return [_move_into(staging, layout.exports, step)]
    made.append(_move_into(staging, layout.checkpoints, step))
    rotate(layout, max_checkpoints)
    return made


def delete_checkpoint(folder: Path) -> None:
    (folder / MARKER).unlink(missing_ok=True)  # first: a half-deleted folder must not look complete
    shutil.rmtree(folder, ignore_errors=True)


def rotate(layout: Layout, keep: int) -> list[Path]:
    """Keep the newest `keep` complete temporary checkpoints; drop older ones and incomplete leftovers."""
    complete, removed = [], []
    for folder in layout.checkpoints.glob(f"{STEP_PREFIX}*"):
        marker = read_marker(folder)
        if marker is None:
            delete_checkpoint(folder)
            removed.append(folder)
        else:
            complete.append((int(marker["step"]), folder))
    for _, folder in sorted(complete)[:-keep]:
        delete_checkpoint(folder)
        removed.append(folder)
    return removed


def newest_complete(layout: Layout) -> Path | None:
    found = complete_checkpoints(layout)
    return found[-1][1] if found else None


def last_good_message(layout: Layout) -> str:
    newest = newest_complete(layout)
    if newest is None:
        return "No checkpoint had been written yet."
    return f"The last good checkpoint, `{newest}`, is intact; the next run resumes from it (`resume: auto`)."
