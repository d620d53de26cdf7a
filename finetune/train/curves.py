"""loss_curve.png and the verdict on a run: underfit, overfit or well-fit, with the generalization gap.

    underfit   training loss flat (fell < 10% from its start), or still falling steeply at the end
               (the last quarter of training took > 10% off the loss): train longer or with a higher LR
    overfit    eval loss reached a minimum and then rose (> 2% and > 0.01 above it): the step of the
               minimum and the checkpoint nearest it are reported
    well-fit   both curves flattened; the gap (final eval - final train loss) is small

Thresholds are deliberately simple and stated; the plot is the evidence. Plotting uses matplotlib's
Agg canvas directly, so it runs headless and never touches the global backend.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FLAT_DROP = 0.10  # a training loss that fell less than this fraction overall is flat
STEEP_TAIL = 0.10  # ... and one that fell more than this fraction in its last quarter is still learning
RISE_REL, RISE_ABS = 0.02, 0.01  # eval loss this far above its minimum has turned up


def loss_series(log_history: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(train, eval) as (step, loss) pairs from HF Trainer's state.log_history."""
    train = [(int(e["step"]), float(e["loss"])) for e in log_history if "loss" in e and "step" in e]
    evals = [(int(e["step"]), float(e["eval_loss"])) for e in log_history if "eval_loss" in e and "step" in e]
    return train, evals


def _smooth(values: list[float]) -> list[float]:
    """Trailing moving average over ~a tenth of the points (training loss is noisy per step)."""
    window = max(1, len(values) // 10)
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def _train_shape(train: list[tuple[int, float]]) -> tuple[str | None, str]:
    """('underfit', why) when the training curve says so, else (None, how it looks)."""
    if len(train) < 4:
        return None, f"only {len(train)} training loss points"
    smooth = _smooth([loss for _, loss in train])
    first, last = smooth[0], smooth[-1]
    drop = (first - last) / first if first > 0 else 0.0
    if drop < FLAT_DROP:
        return "underfit", f"training loss barely moved ({first:.3f} -> {last:.3f}, {100 * drop:.0f}% lower)"
    tail_start = smooth[int(len(smooth) * 0.75)]
    tail_drop = (tail_start - last) / tail_start if tail_start > 0 else 0.0
    if tail_drop > STEEP_TAIL:
        return "underfit", (f"training loss still falling steeply at the end ({100 * tail_drop:.0f}% lower over "
                            "the last quarter): train longer or raise the learning rate")
    return None, f"training loss flattened ({first:.3f} -> {last:.3f})"


def _checkpoint_near(output_dir: Path, step: int) -> str | None:
    """The saved checkpoint-N folder closest to `step` (at or after it first), if any."""
    found = []
    for path in [*output_dir.glob("checkpoint-*"), *output_dir.glob("*/checkpoint-*")]:  # also checkpoints/
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    if not found:
        return None
    return str(min(found, key=lambda pair: (abs(pair[0] - step), pair[0] < step))[1])


def diagnose(log_history: list[dict], output_dir: str | Path | None = None) -> dict:
    """The verdict on a run's curves. Keys: verdict, reason, gap, final/best losses and steps, checkpoint."""
    train, evals = loss_series(log_history)
    result = {"verdict": "unknown", "reason": "", "gap": None,
              "final_train_loss": train[-1][1] if train else None,
              "final_eval_loss": evals[-1][1] if evals else None,
              "best_eval_step": None, "best_eval_loss": None, "checkpoint": None}
    if not train:
        result["reason"] = "no training loss was logged (set logging_steps lower than the step count)"
        return result
    if evals:
        best_step, best = min(evals, key=lambda pair: pair[1])
        result.update(best_eval_step=best_step, best_eval_loss=best, gap=evals[-1][1] - train[-1][1])
        final = evals[-1][1]
        if best_step != evals[-1][0] and final - best > max(RISE_REL * best, RISE_ABS):
            checkpoint = _checkpoint_near(Path(output_dir), best_step) if output_dir else None
            where = f"; use {checkpoint}" if checkpoint else "; no checkpoint was saved near it (lower save_steps)"
            result.update(verdict="overfit", checkpoint=checkpoint, reason=(
                f"eval loss bottomed at {best:.3f} at step {best_step} and rose to {final:.3f} by step "
                f"{evals[-1][0]}{where}. Train fewer steps/epochs, add data, or raise lora_dropout/weight_decay"))
            return result
    verdict, why = _train_shape(train)
    if verdict:
        result.update(verdict=verdict, reason=why)
        return result
    if len(train) < 4:
        result["reason"] = why
        return result
    gap = result["gap"]
    tail = f"; generalization gap {gap:+.3f}" if gap is not None else "; no eval split, so overfitting is not checked"
    result.update(verdict="well-fit", reason=why + tail)
    return result


def plot_curves(log_history: list[dict], path: str | Path, diagnosis: dict | None = None) -> Path:
    """Train and eval loss against step, written as a PNG (headless)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train, evals = loss_series(log_history)
    fig = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        ax.plot(*zip(*train), label="train loss", color="tab:blue", alpha=0.8)
    if evals:
        ax.plot(*zip(*evals), label="eval loss", color="tab:orange", marker="o")
    if diagnosis and diagnosis.get("verdict") == "overfit":
        ax.axvline(diagnosis["best_eval_step"], color="tab:red", linestyle="--",
                   label=f"best eval (step {diagnosis['best_eval_step']})")
    title = f"{diagnosis['verdict']}" if diagnosis else "loss"
    if diagnosis and diagnosis.get("gap") is not None:
        title += f" (gap {diagnosis['gap']:+.3f})"
    ax.set(xlabel="optimizer step", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path


def write_curves(output_dir, log_history: list[dict]) -> dict:
    """Write output_dir/loss_curve.png and output_dir/diagnosis.json; return the diagnosis."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    diagnosis = diagnose(log_history, output_dir)
    plot = plot_curves(log_history, output_dir / "loss_curve.png", diagnosis)
    diagnosis["plot"] = str(plot)
    (output_dir / "diagnosis.json").write_text(json.dumps(diagnosis, indent=2))
    return diagnosis


def read_log_history(output_dir: str | Path) -> list[dict]:
    """log_history from run.json, else from the newest checkpoint's trainer_state.json."""
    from finetune.errors import FinetuneError

    output_dir = Path(output_dir)
    run_json = output_dir / "run.json"
    if run_json.is_file():
        history = json.loads(run_json.read_text()).get("log_history")
        if history:
            return history
    states = sorted([*output_dir.glob("checkpoint-*/trainer_state.json"),
                     *output_dir.glob("*/checkpoint-*/trainer_state.json")],
                    key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
    if states:
        return json.loads(states[-1].read_text()).get("log_history", [])
    raise FinetuneError(
        f"no training logs in `{output_dir}`: expected run.json (written at the end of `finetune train`) or "
        "checkpoint-*/trainer_state.json. Point at the run's output_dir."
    )
