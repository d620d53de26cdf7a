"""GRPO reward models: is a folder one finetune can score with, and what its rewards are called.

A reward model is a `method: reward` run's output_dir (its run.json says so; the adapter or the model beside it), or
a folder trained elsewhere holding a *ForSequenceClassification with one output (config.json), or a
sequence-classification adapter (adapter_config.json, task_type SEQ_CLS). The scorer that reads one is
finetune/model/scorer.py; a GRPO run scores with it in finetune/train/grpo/reward_models.py.

A base module: pure Python (JSON files only), so the recipe's checks can use it before anything heavy is imported.
"""

from __future__ import annotations

import json
from pathlib import Path


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def reward_model_problem(folder) -> str | None:
    """Why `folder` is not a reward model finetune can score with, or None when it is."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"no folder at {folder}; point `model:` at a `method: reward` run's output_dir (train one first)"
    run = _json(folder / "run.json")
    if run and run.get("method"):
        if run["method"] == "reward":
            return None
        return (f"{folder} holds a `method: {run['method']}` run, not a reward model; train one with "
                "`method: reward` on preference pairs (docs/reward-models.md)")
    adapter = _json(folder / "adapter_config.json")
    if adapter is not None:
        if adapter.get("task_type") == "SEQ_CLS":
            return None
        return (f"{folder} holds a {adapter.get('task_type') or 'causal LM'} adapter, not a reward model's "
                "(task_type SEQ_CLS, its score head saved with it)")
    config = _json(folder / "config.json")
    if config is None:
        return f"{folder} holds no model (no run.json, config.json or adapter_config.json)"
    heads = [a for a in config.get("architectures") or [] if a.endswith("ForSequenceClassification")]
    outputs = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    if heads and outputs == 1:
        return None
    return (f"{folder} holds a {', '.join(config.get('architectures') or ['model'])} with {outputs} outputs, not a "
            "reward model (a *ForSequenceClassification with one output)")


def reward_model_name(folder) -> str:
    """A reward model's name in metrics and run.json: its folder's name (`runs/rm` -> `rm`)."""
    return Path(folder).name or str(folder)


def config_source(folder) -> str:
    """The folder (or hub id) whose config.json describes a reward model: the model's own, or its adapter's base."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return str(folder)
    run = _json(folder / "run.json") or {}
    adapter = _json(folder / "adapter_config.json") or {}
    return run.get("base_model_path") or adapter.get("base_model_name_or_path") or str(folder)


def trained_length(folder) -> int | None:
    """The sequence_len a reward run trained with (run.json), or None."""
    scoring = ((_json(Path(folder) / "run.json") or {}).get("reward") or {}).get("scoring") or {}
    return scoring.get("max_length")
