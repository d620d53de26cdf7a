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
finetune/recipe/checks.py) live below every stage, for the recipe loader; they are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pydantic import BaseModel

from finetune.atomic import honour_umask
from finetune.errors import FinetuneError
from finetune.log import get_logger
from finetune.recipe import Recipe
from finetune.recipe.tags import TRAIN, fields_affecting
# the recipe-time checks and the read side of output_dir live below every stage, for the recipe loader
from finetune.recipe.checks import location_problems, resume_problem  # noqa: F401
from finetune.run_folder import MARKER, OWNER_FILE, STEP_PREFIX, Layout, complete_checkpoints, read_marker  # noqa: F401

STAGING_FLAG = ".finetune-staging"  # put in a staging folder before the Trainer writes into it

# Settings that must not change between a checkpoint and a run resuming from it: they change what a step is
# (the data, its order, the batch) or what the weights and optimizer state mean. Derived from the schema's
# `affects` metadata (finetune/recipe/schema.py), never listed by hand; the data itself enters as the data key.
FINGERPRINT_FIELDS = fields_affecting(Recipe, TRAIN)
# Not settings: what the run was fed and on how many processes. A change is a warning with `resume: PATH`
# (continuing from chosen weights on other data is legitimate), a refusal with `resume: auto`.
CONTEXT_KEYS = ("data", "world_size")


class CheckpointError(FinetuneError):
    """A checkpoint cannot be written, found or used."""


class NothingToTrain(FinetuneError):
    """The checkpoint to resume from already reached the run's last step. Not a mistake: exit 0."""

    exit_code = 0


def claim_output_dir(output_dir: Path) -> None:
    """Create output_dir and mark it as a finetune run's (OWNER_FILE) before anything else is written into it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    owner = output_dir / OWNER_FILE
    if not owner.exists():
        owner.write_text(json.dumps({"created": time.time(), "pid": os.getpid()}) + "\n", encoding="utf-8")


def _fingerprint_value(value):
    """A section (`fsdp:`) counts by its own keys that affect training (`state_dict_type`: the checkpoint's layout),
    so changing one that does not (offload, resharding) still resumes."""
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in fields_affecting(type(value), TRAIN)}
    return value


def run_fingerprint(recipe, data_key: str, world_size: int) -> dict:
    """What a checkpoint must agree with to be resumed exactly (recorded in its marker)."""
    fields = {name: _fingerprint_value(getattr(recipe, name, None)) for name in FINGERPRINT_FIELDS}
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
    """`key: old -> new` for every key both fingerprints record (a key missing from an older marker is not a
    difference: it was never recorded)."""
    return [f"{key}: {saved[key]!r} -> {current[key]!r}"
            for key in sorted(set(saved) & set(current)) if saved[key] != current[key]]


def _refusal(folder: Path, step: int, changed: list[str], how: str) -> CheckpointError:
    settings = [line for line in changed if line.split(":", 1)[0] not in CONTEXT_KEYS]
    why = (" A resumed run continues the old one, so a step, the weights and the optimizer state (which carries "
           "the old learning rate and schedule) must mean the same; the new values would not apply." if settings
           else "")
    return CheckpointError(
        f"{how} found the checkpoint `{folder}` (step {step}), but it was written for other settings or data: "
        f"{'; '.join(changed)}.{why} Either put the setting{'s' if len(changed) > 1 else ''} back, use a new "
        "`output_dir` for the new run, or set `resume: false` to start over in this one (its checkpoints are "
        "then replaced)."
        + ("" if settings else f" To continue from these weights on the new data anyway, set `resume: {folder}`.")
    )


def _finished_at(output_dir: Path, step: int) -> int | None:
    """The step the run in output_dir finished at: run.json's `steps` (the last file a run writes), else the
    checkpoint's step when run.json exists without it; None when the run never finished (no run.json)."""
    try:
        record = json.loads((output_dir / "run.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return step
    done = record.get("steps") if isinstance(record, dict) else None
    return max(step, done) if isinstance(done, int) else step


def _check_not_finished(folder: Path, step: int, total_steps: int | None, output_dir: Path) -> None:
    """NothingToTrain when the run in output_dir already reached the last step. Decided from run.json, not from
    the newest checkpoint: with `checkpoint_interval` the last step has no checkpoint of its own, and resuming
    from the one before it would retrain the end and overwrite the final model. Without run.json the run died
    while saving its result: resuming trains what is left and writes the model and run.json."""
    done = _finished_at(output_dir, step)
    if total_steps is not None and done is not None and done >= total_steps:
        raise NothingToTrain(
            f"nothing left to train: the run in output_dir finished at step {done} and this run has {total_steps} "
            f"optimizer steps (newest checkpoint `{folder}`, step {step}); nothing was written. To train longer, "
            "raise `max_steps` or `num_epochs`; to train again, use a new `output_dir` or set `resume: false`."
        )


def find_resume(recipe, fingerprint: dict, total_steps: int | None = None) -> str | None:
    """The checkpoint to resume from, or None to start fresh. Reads only; never writes.

    Refused (CheckpointError) when a training setting changed since the checkpoint (`FINGERPRINT_FIELDS`); with
    `resume: auto` also when the data or the process count changed. NothingToTrain when the checkpoint is at or
    past `total_steps` and the run finished (run.json written). num_epochs / max_steps may change: a larger value
    trains longer, and the learning-rate schedule is re-planned over the new total from the checkpoint's step on.
    """
    if recipe.resume is False:
        return None
    if recipe.resume != "auto":
        folder = Path(recipe.resume)
        marker = read_marker(folder)
        if marker is None:
            raise CheckpointError(resume_problem(recipe.resume) or f"`{recipe.resume}` is not a complete checkpoint")
        saved, step = marker.get("fingerprint", {}), int(marker["step"])
        settings = {k: v for k, v in fingerprint.items() if k not in CONTEXT_KEYS}
        changed = _differences(saved, settings)
        if changed:
            raise _refusal(folder, step, changed, "`resume: <path>`")
        context = _differences(saved, {k: fingerprint[k] for k in CONTEXT_KEYS if k in fingerprint})
        if context:
            get_logger(__name__).warning(f"resuming from {recipe.resume}, written for other data or another "
                                         "process count (" + "; ".join(context) + "); the run will not match an "
                                         "uninterrupted one")
        _check_not_finished(folder, step, total_steps, Path(recipe.output_dir))
        return str(recipe.resume)
    found = complete_checkpoints(Layout(Path(recipe.output_dir)))
    if not found:
        return None
    step, folder = found[-1]
    changed = _differences(read_marker(folder).get("fingerprint", {}), fingerprint)
    if changed:
        raise _refusal(folder, step, changed, "`resume: auto`")
    _check_not_finished(folder, step, total_steps, Path(recipe.output_dir))
    return str(folder)


def weights_recipe(recipe, resume_from: str | None):
    """The recipe the model is built from. A full fine-tune resuming from a checkpoint builds from the checkpoint:
    from_pretrained reads the layout save_pretrained wrote, where transformers 5 saves a mixture of experts' fused
    expert tensors one expert at a time and fuses them back on load. The Trainer's own resume reads the checkpoint
    with load_state_dict(strict=False) (transformers 5.23), which skips every key so renamed: the experts would
    silently restart from the base's weights (transformers issue #48805; tests/test_families.py, resume on every MoE
    family). DeepSpeed and FSDP resume from their own state files, in the model's own names: nothing changes there."""
    if resume_from is None or recipe.adapter != "none" or recipe.deepspeed or getattr(recipe, "fsdp", None):
        return recipe
    folder = Path(resume_from)
    weights = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    if not (weights and (folder / "config.json").is_file()):
        return recipe
    return recipe.model_copy(update={"base_model": resume_from})


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
    honour_umask(staging)  # safetensors writes 0600 files (finetune/atomic.py)
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
