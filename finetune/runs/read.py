"""One run folder -> the page's data for it. Every piece is read on its own and checked for its type, so an old or
partial run.json (or none: a crashed run) shows what it has and leaves the rest empty.

    summary     method, model, adapter, steps, tokens, wall time, eval loss before/after (run.json)
    diagnosis   the verdict on the curves (diagnosis.json, else run.json's `curves`)
    evaluation  `finetune eval`'s numbers, base and tuned (eval/report.json, else run.json's `evaluation`); a reward
                run's score histograms
    curves      every logged metric as (step, epoch, value) points (run.json's log_history, else the newest
                checkpoint's trainer_state.json); the train loss per optimizer step where the run recorded it
    settings    the resolved recipe, the settings resolved on the machine and the package versions, flattened
    samples     answers: the eval report's (base / tuned) and GRPO's completions.jsonl
"""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

from finetune.run_folder import RESOLVED_RECIPE, Layout, complete_checkpoints
from finetune.runs.folders import read_stop, status

MAX_SAMPLES = 200  # completions.jsonl lines kept per run (the newest): the page stays small
MAX_TEXT = 4000  # characters of one prompt or answer shown
# log-history keys that are not curves: bookkeeping, speeds (the throughput line says those), end-of-run totals
NOT_CURVES = ("epoch", "step", "step_losses", "total_flos")
NOT_CURVE_PARTS = ("per_second", "tflops", "runtime", "peak_rss", "model_preparation_time", "reference_pass_s")
RESOLVED = ("precision", "learning_rate", "attn_implementation", "compile", "device", "optimizer")
SIGNIFICANT = 6  # digits a float setting is shown with: 0.30000000000000004 reads 0.3


def _json(path: Path):
    """The JSON in `path`, or None when it is absent or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _number(value) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _text(value, limit: int = MAX_TEXT) -> str:
    """A prompt or an answer as text: a chat (a list of messages) one `role: content` line each."""
    if isinstance(value, list):
        value = "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                          for m in value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + " [...]"


def finite(value):
    """`value` with every NaN / infinity replaced by None: JSON.parse refuses them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _recipe(folder: Path, run: dict, fingerprint: dict) -> dict:
    """The recipe the run trained with: run.json's; a run without run.json: recipe.resolved.yml (written when it
    started); a folder from before that: its checkpoint's fingerprint (the settings a resume must agree with)."""
    recipe = _dict(run.get("recipe"))
    if recipe:
        return recipe
    try:
        import yaml

        return _dict(yaml.safe_load((folder / RESOLVED_RECIPE).read_text(encoding="utf-8"))) or fingerprint
    except (OSError, ValueError):  # yaml's errors are ValueErrors
        return fingerprint


def _checkpoint_state(folder: Path) -> tuple[list, dict]:
    """(log_history, fingerprint) of the newest checkpoint: complete ones first, then the Trainer's staging
    checkpoint-N folders (a run killed mid-save leaves one)."""
    complete = complete_checkpoints(Layout(folder))
    staging = sorted((int(p.name.split("-")[1]), p) for p in folder.glob("checkpoint-*")
                     if p.name.split("-")[1].isdigit())
    for step, path in [*reversed(complete), *reversed(staging)]:
        state = _dict(_json(path / "trainer_state.json"))
        history = state.get("log_history")
        if isinstance(history, list):
            return history, _dict(_dict(_json(path / "COMPLETE")).get("fingerprint"))
    return [], {}


def _curves(history: list, eval_loss_before: float | None = None) -> dict:
    """{metric: [[step, epoch, value], ...]}, each sorted by step; the eval loss before training (run.json's, not in
    the log history) is the eval loss curve's point at step 0."""
    metrics: dict[str, dict[int, tuple]] = {}
    if eval_loss_before is not None:
        metrics["eval_loss"] = {0: (0, 0.0, eval_loss_before)}
    per_step_loss = False
    for entry in history:
        if not isinstance(entry, dict) or _number(entry.get("step")) is None:
            continue
        step, epoch = int(entry["step"]), _number(entry.get("epoch"))
        for pair in entry.get("step_losses") or ():  # every optimizer step's loss (train/callbacks/step_loss.py)
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and _number(pair[0]) is not None:
                at = int(pair[0])
                at_epoch = epoch * at / step if epoch is not None and step else epoch
                metrics.setdefault("loss", {})[at] = (at, at_epoch, _number(pair[1]))
                per_step_loss = True
        for key, value in entry.items():
            if (key in NOT_CURVES or key.startswith("train_") or any(p in key for p in NOT_CURVE_PARTS)
                    or (key == "loss" and per_step_loss) or _number(value) is None):
                continue
            metrics.setdefault(key, {})[step] = (step, epoch, _number(value))
    return {key: [list(p) for _, p in sorted(points.items())] for key, points in metrics.items()}


def _plain(value) -> str:
    """A setting as text: strings as they are, floats to SIGNIFICANT digits, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return format(value, f".{SIGNIFICANT}g")
    return json.dumps(finite(value), ensure_ascii=False, default=str)


def flatten(value, prefix: str) -> dict[str, str]:
    """{"recipe.lora_r": "8", "recipe.datasets[0].path": "a.jsonl", ...}: one row per leaf, as text. A list of
    sections (datasets, GRPO's rewards) also has a row of its own, its length, so a run with an empty one (`[]`)
    and a run with entries meet on the same row."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}"))
        return out
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out = {prefix: f"{len(value)} item{'s' if len(value) != 1 else ''} (the {prefix}[i] rows)"}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: _plain(value)}


def _settings(run: dict, recipe: dict) -> dict[str, str]:
    out = flatten(recipe, "recipe") if recipe else {}
    for key in RESOLVED:
        if key in run:
            out.update(flatten(run[key], f"resolved.{key}"))
    if isinstance(run.get("plan"), dict):
        out.update(flatten(run["plan"], "resolved.plan"))
    if isinstance(run.get("versions"), dict):
        out.update(flatten(run["versions"], "versions"))
    return out


def _evaluation(folder: Path, run: dict) -> dict | None:
    """{"verdict": one line, "rows": [[metric, {side: value}, higher is better]]} of `finetune eval`."""
    from finetune.evaluation.report import REPORT_DIR, headline

    report = _json(folder / REPORT_DIR / "report.json")
    if not isinstance(report, dict):
        summary = _dict(run.get("evaluation"))
        if not summary:
            return None
        report = {**summary, "generation": {"summary": summary.get("generation")}}
    try:
        rows = [[name, {side: _number(v) for side, v in values.items()}, higher]
                for name, values, higher in headline(report)]
    except (KeyError, TypeError, AttributeError, ValueError):  # a report of another shape: its verdict alone
        rows = []
    out = {"verdict": str(report.get("verdict", "")), "rows": rows}
    histograms = _histograms(_dict(report.get("reward")).get("histograms"))
    if histograms:  # a reward run's held-out scores, chosen and rejected, per side
        out["histograms"] = histograms
    return out


def _histograms(found) -> dict:
    """{side: {"edges": [...], "chosen": [...], "rejected": [...]}} as numbers, sides of another shape left out."""
    out = {}
    for side, hist in _dict(found).items():
        hist = _dict(hist)
        lists = {key: hist.get(key) for key in ("edges", "chosen", "rejected")}
        if all(isinstance(v, list) for v in lists.values()) and len(lists["edges"]) == len(lists["chosen"]) + 1 \
                and len(lists["chosen"]) == len(lists["rejected"]):
            out[str(side)] = {key: [_number(v) for v in values] for key, values in lists.items()}
    return out


def _eval_samples(folder: Path) -> list[dict]:
    from finetune.evaluation.report import REPORT_DIR

    prompts = _dict(_dict(_json(folder / REPORT_DIR / "report.json")).get("generation")).get("prompts")
    out = []
    for row in prompts if isinstance(prompts, list) else ():
        if not isinstance(row, dict):
            continue
        # an answer that did not end within max_new_tokens was cut there (evaluation/generation.py: `ended`)
        answers = [{"label": side, "text": _text(_dict(row[side]).get("answer", "")),
                    "truncated": _dict(row[side]).get("ended") is False}
                   for side in ("base", "tuned", "gguf") if side in row]
        out.append({"source": "eval", "step": None, "prompt": _text(row.get("prompt", "")),
                    "reference": _text(row.get("reference", "")), "answers": answers})
    return out


def _grpo_samples(folder: Path) -> list[dict]:
    path = folder / "completions.jsonl"  # finetune/train/grpo/setup.py SAMPLES_FILE
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            tail = deque(lines, maxlen=MAX_SAMPLES)
    except OSError:
        return []
    out = []
    for line in tail:
        try:
            sample = json.loads(line)
        except ValueError:
            continue  # a line cut short by a run that is still writing
        if not isinstance(sample, dict) or not isinstance(sample.get("completions"), list):
            continue
        rewards = sample.get("rewards") if isinstance(sample.get("rewards"), list) else []
        cut = sample.get("truncated") if isinstance(sample.get("truncated"), list) else []  # at max_completion_length
        answers = [{"label": f"completion {i + 1}", "text": _text(c),
                    "reward": _number(rewards[i]) if i < len(rewards) else None,
                    "truncated": i < len(cut) and cut[i] is True}
                   for i, c in enumerate(sample["completions"])]
        out.append({"source": "grpo", "step": _number(sample.get("step")), "prompt": _text(sample.get("prompt", "")),
                    "reference": None, "answers": answers})
    return out


def _summary(run: dict, recipe: dict, history: list, folder: Path, stop: dict | None) -> dict:
    plan = _dict(run.get("plan"))
    steps, checkpoint = _number(run.get("steps")), None
    if steps is None or stop is not None:  # stopped before its end: the step it resumes from, its checkpoint's
        complete = complete_checkpoints(Layout(folder))
        checkpoint = complete[-1][0] if complete else None
        steps = checkpoint
    if steps is None and history:
        steps = max((int(e["step"]) for e in history if isinstance(e, dict) and _number(e.get("step")) is not None),
                    default=None)
    per_step = _number(plan.get("tokens_per_step"))
    return {
        "method": run.get("method") or recipe.get("method") or ("sft" if recipe else None),
        "model": recipe.get("base_model"),
        "adapter": recipe.get("adapter"),
        "steps": steps,
        "total_steps": _number(plan.get("total_steps")) or _number(recipe.get("max_steps")),
        "checkpoint_step": checkpoint,  # a run that stopped: where `finetune train` resumes (None: no checkpoint)
        "reached_step": _number(_dict(stop).get("step")),  # ... and the step it had reached when it stopped
        "logging_steps": _number(recipe.get("logging_steps")),  # how often lr, grad_norm... are logged
        "tokens_per_step": per_step,  # the plan's mean tokens per optimizer step: the tokens axis
        "tokens": round(steps * per_step) if steps is not None and per_step is not None else None,
        "generated_tokens": _number(_dict(run.get("grpo")).get("generated_tokens")),  # GRPO's completions
        "wall_time_s": _number(run.get("wall_time_s")),
        "eval_loss_before": _number(run.get("eval_loss_before")),
        "final_eval_loss": _number(run.get("final_eval_loss")),
        "final_train_loss": _number(run.get("final_train_loss")),
    }


def read_run(folder: Path, name: str) -> dict:
    """The page's data for the run in `folder`, shown as `name`."""
    folder = Path(folder)
    run_json = _json(folder / "run.json")
    run, stop = _dict(run_json), read_stop(folder)
    state, why = status(folder, run_json is not None, stop)
    if (folder / "run.json").is_file() and not isinstance(run_json, dict):
        why += "; run.json is not a JSON object (damaged?): shown from the other files"
    history = run.get("log_history") if isinstance(run.get("log_history"), list) else []
    fingerprint = {}
    if not history:
        history, fingerprint = _checkpoint_state(folder)
    recipe = _recipe(folder, run, fingerprint)
    diagnosis = _dict(_json(folder / "diagnosis.json")) or _dict(run.get("curves"))
    return finite({
        "name": name,
        "path": str(folder),
        "status": state,
        "status_reason": why,
        "stop": {"kind": str(stop.get("kind", "")), "message": stop["message"]} if stop else None,
        "summary": _summary(run, recipe, history, folder, stop),
        "diagnosis": {"verdict": str(diagnosis.get("verdict", "")), "reason": str(diagnosis.get("reason", ""))}
                     if diagnosis.get("verdict") else None,
        "evaluation": _evaluation(folder, run),
        "curves": _curves(history, _number(run.get("eval_loss_before"))),
        "settings": _settings(run, recipe),
        "samples": _eval_samples(folder) + _grpo_samples(folder),
    })
