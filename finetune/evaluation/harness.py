"""The lm-evaluation-harness bridge: local task folders, run on the adapter without merging, fully offline.

lm-eval's HFLM takes a model object (`pretrained=model`): the PeftModel as it is (the base is the same model
with its adapter disabled, or switched to the adapter the run continued: finetune/evaluation/subject.py), so no
merge is needed. Tasks are lm-eval task YAML files in a folder, with their
data in local files (`dataset_path: json`, `dataset_kwargs: {data_files: ...}`); a relative data file is
relative to the YAML file (lm-eval itself would read it relative to the current folder). finetune ships one
example task, `tiny_facts` (finetune/eval_tasks/tiny_facts/), always available by name.

lm-eval is an optional extra (`pip install finetune[eval]`): imported here only, when tasks are asked.
"""

from __future__ import annotations

from pathlib import Path

from finetune.errors import FinetuneError
from finetune.lm_eval_tasks import SHIPPED_TASKS, task_configs, unknown_task_message

BATCH_SIZE = 8  # requests per forward pass
NOT_METRICS = ("alias", "sample_len", "sample_count")  # lm-eval's bookkeeping beside the scores


def require_lm_eval() -> None:
    from finetune.recipe.checks import LM_EVAL_INSTALL, lm_eval_missing

    if lm_eval_missing():
        raise FinetuneError(f"lm-eval tasks were asked for, but lm-evaluation-harness is not installed: "
                            f"{LM_EVAL_INSTALL}; or run without --tasks / --tasks-dir")


def chosen_tasks(names: list[str], tasks_dir: str | None) -> list[dict]:
    """The configs of the tasks to run: `names` from the shipped tasks and `tasks_dir`, or every task in
    `tasks_dir` when no names are given."""
    require_lm_eval()
    local = {}
    if tasks_dir:
        local = task_configs(Path(tasks_dir))
        if not local:
            raise FinetuneError(
                f"no lm-eval task in `{tasks_dir}`: no YAML file there has a `task:` name. A task folder holds a "
                "task YAML (task, dataset_path: json, dataset_kwargs.data_files, output_type, doc_to_text, ...) "
                "and its local data file; see docs/evaluation.md, section \"Adding a local task\", or the example "
                f"in {SHIPPED_TASKS / 'tiny_facts'}"
            )
    available = {**task_configs(SHIPPED_TASKS), **local}
    wanted = list(names) or sorted(local)
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise FinetuneError(unknown_task_message(unknown, available, tasks_dir, "--tasks-dir"))
    return [available[name] for name in wanted]


def _metrics(results: dict) -> dict:
    """{task: {metric: value}} without stderr entries; lm-eval's "acc,none" keys become "acc"."""
    out = {}
    for task, values in results.get("results", {}).items():
        out[task] = {key.split(",")[0]: value for key, value in values.items()
                     if isinstance(value, (int, float)) and "stderr" not in key and key not in NOT_METRICS}
    return out


def run_tasks(models, side_names: list[str], configs: list[dict], limit: int | None, chat_template: bool) -> dict:
    """{"tasks": {task: {side: {metric: value}}}, "chat_template": on/off, ...}: each side through lm-eval."""
    import logging

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-request INFO lines drown the report
    per_side = {}
    for name in side_names:
        with models.side(name) as model:
            lm = HFLM(pretrained=model, tokenizer=models.tokenizer, batch_size=BATCH_SIZE)
            results = simple_evaluate(model=lm, tasks=[dict(c) for c in configs], limit=limit,
                                      apply_chat_template=chat_template, log_samples=False, bootstrap_iters=0,
                                      task_manager=TaskManager(include_defaults=False), verbosity="WARNING")
        per_side[name] = _metrics(results or {})
    tasks = sorted({task for side in per_side.values() for task in side})
    return {"tasks": {task: {name: per_side[name].get(task, {}) for name in side_names} for task in tasks},
            "chat_template": chat_template, "limit": limit, "adapter_merged": False}
