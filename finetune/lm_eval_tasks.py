"""lm-eval task folders: which tasks exist, by name. finetune's shipped tasks (finetune/eval_tasks/) and a
folder of the user's; read with lm-eval's own YAML loader (finetune.compat), never imported at startup.

The evaluation runs exactly these (finetune/evaluation/harness.py: lm-eval's TaskManager without its defaults,
offline), so the recipe check (finetune/recipe/checks.py) asks the same question at validate: a task name that
is not here would let the run train, then fail at its evaluation.
"""

from __future__ import annotations

from pathlib import Path

from finetune.errors import FinetuneError

SHIPPED_TASKS = Path(__file__).resolve().parent / "eval_tasks"


def _absolute_data_files(config: dict, folder: Path) -> dict:
    """The task's local data files made absolute, relative to the YAML's folder."""
    kwargs = dict(config.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")

    def resolve(value):
        if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
            return str((folder / value).resolve())
        return value

    if isinstance(files, dict):
        kwargs["data_files"] = {split: ([resolve(v) for v in f] if isinstance(f, list) else resolve(f))
                                for split, f in files.items()}
    elif files is not None:
        kwargs["data_files"] = [resolve(v) for v in files] if isinstance(files, list) else resolve(files)
    return {**config, "dataset_kwargs": kwargs} if kwargs else config


def task_configs(folder: Path) -> dict[str, dict]:
    """{task name: its config} for every task YAML (a file with a `task:` name) under `folder`."""
    from finetune.compat import lm_eval_load_yaml

    found = {}
    for path in sorted(folder.rglob("*.y*ml")):
        try:
            config = lm_eval_load_yaml(path)
        except Exception as exc:  # a broken YAML or a !function that does not import: say which file
            raise FinetuneError(f"cannot read the lm-eval task file `{path}`: {exc}") from None
        if isinstance(config, dict) and isinstance(config.get("task"), str):
            found[config["task"]] = _absolute_data_files(config, path.parent)
    return found


def unknown_task_message(unknown: list[str], available, tasks_dir: str | None, folder_option: str) -> str:
    where = f" or in `{tasks_dir}`" if tasks_dir else f" (set {folder_option} to a folder of your own tasks)"
    return (f"unknown lm-eval task {', '.join(unknown)}: not among finetune's tasks{where}; available: "
            f"{', '.join(sorted(available))}. Benchmarks run offline from task folders (docs/evaluation.md, "
            "\"Adding a local task\")")


def task_problem(names: list[str], tasks_dir: str | None) -> str | None:
    """What is wrong with asking for `names` (and `tasks_dir`'s tasks), or None: a task name found nowhere, a task
    file that does not read, a folder with no task. lm-eval must be installed (the caller checks)."""
    try:
        local = task_configs(Path(tasks_dir)) if tasks_dir and Path(tasks_dir).is_dir() else {}
        available = {**task_configs(SHIPPED_TASKS), **local}
    except FinetuneError as exc:
        return str(exc)
    if tasks_dir and Path(tasks_dir).is_dir() and not local:
        return (f"no lm-eval task in `{tasks_dir}`: no YAML file there has a `task:` name (docs/evaluation.md, "
                "\"Adding a local task\")")
    unknown = [name for name in names if name not in available]
    return unknown_task_message(unknown, available, tasks_dir, "eval.tasks_dir") if unknown else None
