"""loss_curve.png and the verdict on a run: underfit, overfit, well-fit or diverged, with the generalization gap.

The training curve is every optimizer step's loss (`step_losses` in the log history, written by
finetune/train/callbacks/step_loss.py); a history without them (another tool's) falls back to the logged losses.
Levels are means over a fifth of the points (at least 3) at each end, so a few noisy steps decide nothing.

    too short  fewer than MIN_POINTS training losses: nothing can be told apart from noise; fewer than
               MIN_TAIL in the last quarter (a loss that did not rise): whether it flattened cannot be told; or
               it fell and looks flat after less than MIN_EPOCH of one epoch: too little of the data to call fit
    overfit    eval loss reached a minimum and then rose (> 2% and > 0.01 above it): the step of the
               minimum and the checkpoint nearest it are reported
    diverged   the training loss ended higher than it began (> FLAT_DROP): lower the learning rate
    underfit   the training loss barely moved (fell < FLAT_DROP), or it was still falling at the end: a
               straight line through the last quarter takes > STEEP_TAIL off it and its slope is clearly
               below zero (more than TAIL_T standard errors), so noise alone does not make a run "underfit";
               a run that stopped within its first epoch (the log's `epoch` < 1) is underfit when that slope
               is below zero by PARTIAL_T standard errors: it has not seen most of its data
    well-fit   the training loss fell and flattened; the gap (final eval loss - the last level of the training
               loss, the one the closing line prints) is reported

A preference run (it logs reward metrics) is not underfit because its loss barely moved when its accuracy ended
clearly above chance or its margin grew (a preference loss can move little while the ranking is learned), and
has two more verdicts, checked with the rules above
(finetune/train/preference/curves.py has their thresholds):
    nothing learned          accuracy ended at chance (or at a tie), or did not rise, and the loss stayed at its
                             start (DPO: log 2), checked before diverged / overfit / underfit
    likelihood displacement  the chosen log-prob fell while the reward margin grew, checked after diverged and
                             overfit; its plot adds accuracy, margin and log-prob panels beside the loss

A reward run (it logs pair accuracy and margin: finetune/train/reward/curves.py has the thresholds) has three more:
    nothing learned          pair accuracy ended at chance or did not rise, checked before diverged / overfit / underfit
    margins exploding        the mean margin ended far past what the loss needs, checked after diverged and overfit
    scores drifting          the mean score moved far more than the margin (the centering hint), the same
and its plot adds accuracy, margin and score panels beside the loss.

Thresholds are deliberately simple and stated; the plot is the evidence. Plotting uses matplotlib's
Agg canvas directly, so it runs headless and never touches the global backend.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from finetune.train.preference.curves import (LOG2, is_preference, learned, likelihood_displacement, nothing_learned,
                                              plot_panels)
from finetune.train.preference.curves import summary as preference_summary
from finetune.train.grpo import verdict as grpo_verdict
from finetune.train.reward import curves as reward_curves

MIN_POINTS = 8  # fewer training losses than this: too short to judge
MIN_TAIL = 4  # the last quarter's slope needs this many points: a loss that did not rise needs 4 x as many steps
MIN_EPOCH = 0.1  # a loss that fell and looks flat after less of one epoch than this: too little data seen to judge
TOO_SHORT = "too short"
FLAT_DROP = 0.10  # a training loss that moved less than this fraction overall is flat
STEEP_TAIL = 0.10  # ... and one whose last quarter's trend takes more than this fraction off is still learning
TAIL_T = 3.0  # the last quarter's slope must be this many standard errors below zero to count as falling
PARTIAL_T = 1.0  # ... within a run that stopped before the end of its first epoch: a trend down is enough
RISE_REL, RISE_ABS = 0.02, 0.01  # eval loss this far above its minimum has turned up


def loss_series(log_history: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(train, eval) as (step, loss) pairs from HF Trainer's state.log_history: train from every optimizer
    step when the run recorded them, else from the logged losses. Non-finite losses (skipped steps) are left out."""
    per_step = {int(step): float(loss) for e in log_history for step, loss in e.get("step_losses", ())}
    if per_step:
        train = sorted(per_step.items())
    else:
        train = [(int(e["step"]), float(e["loss"])) for e in log_history if "loss" in e and "step" in e]
    evals = [(int(e["step"]), float(e["eval_loss"])) for e in log_history if "eval_loss" in e and "step" in e]
    return [p for p in train if math.isfinite(p[1])], evals


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares slope of loss against step, and its standard error."""
    xs, ys = [float(s) for s, _ in points], [loss for _, loss in points]
    mx, my = _mean(xs), _mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return slope, math.sqrt(residual / max(len(xs) - 2, 1) / sxx)


def _train_shape(train: list[tuple[int, float]], epochs: float | None = None) -> tuple[str | None, str]:
    """(verdict, why) from the training curve alone; verdict None: it fell and flattened (why says so). `epochs`:
    how far through its data the run got, when logged; a run that stopped within its first epoch has not seen
    most of its data, so a loss still trending down there is underfit even when noise hides the trend's size."""
    if len(train) < MIN_POINTS:
        return TOO_SHORT, (f"too short to judge: {len(train)} training loss point(s), {MIN_POINTS} needed "
                           "(train more steps; each optimizer step's loss counts)")
    first, last, _ = loss_levels(train)
    change = (last - first) / first if first > 0 else 0.0
    moved = f"{first:.3f} -> {last:.3f}, {100 * abs(change):.0f}% {'higher' if change > 0 else 'lower'}"
    if change > FLAT_DROP:
        return "diverged", (f"training loss rose ({moved}): the learning rate is likely too high for this "
                            "batch; lower `learning_rate` (or raise `warmup_steps`)")
    tail = train[int(len(train) * 0.75):]
    if len(tail) < MIN_TAIL:  # 8 noisy steps: a last quarter of 2 points says nothing about flattening
        return TOO_SHORT, (f"too short to judge: {len(train)} training losses ({moved}), too few to tell a trend "
                           f"from step-to-step noise ({4 * MIN_TAIL} needed: the last quarter's slope is read from "
                           f"at least {MIN_TAIL}); train more steps")
    if -change < FLAT_DROP:
        return "underfit", (f"training loss barely moved ({moved}): raise the learning rate, train longer, "
                            "or check that the responses are supervised")
    slope, stderr = _slope(tail)
    tail_level = _mean([loss for _, loss in tail])
    tail_drop = -slope * (tail[-1][0] - tail[0][0]) / tail_level if tail_level > 0 else 0.0
    if tail_drop > STEEP_TAIL and slope < -TAIL_T * stderr:
        return "underfit", (f"training loss still falling at the end ({moved} overall; the last quarter's trend "
                            f"takes {100 * tail_drop:.0f}% off, steps {tail[0][0]}-{tail[-1][0]}): train longer")
    if epochs is not None and epochs < 1:
        seen = f"{100 * epochs:.0f}% of one epoch"
        if slope < -PARTIAL_T * stderr:
            return "underfit", (f"the run stopped after {seen} with the training loss still trending down ({moved}; "
                                f"steps {tail[0][0]}-{tail[-1][0]} keep falling): most of the data was never seen, "
                                "train longer (num_epochs, or a higher max_steps)")
        if epochs < MIN_EPOCH:
            return TOO_SHORT, (f"too little of the data to judge: the training loss fell and looks flat ({moved}), "
                               f"but the run stopped after {seen}, below the {100 * MIN_EPOCH:.0f}% a verdict "
                               "needs; train longer (num_epochs, or a higher max_steps)")
        return None, f"training loss fell and flattened after {seen} ({moved})"
    return None, f"training loss fell and flattened ({moved})"


def loss_levels(train: list[tuple[int, float]]) -> tuple[float, float, int]:
    """(first, last, k): the means of the first and last k training losses, a fifth of the steps at each end and
    at least 3 (per-step losses are noisy). Every verdict, and the run's closing line, reads these."""
    k = max(3, len(train) // 5)
    return _mean([loss for _, loss in train[:k]]), _mean([loss for _, loss in train[-k:]]), k


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


def diagnose(log_history: list[dict], output_dir: str | Path | None = None, reward_failures: dict | None = None) -> dict:
    """The verdict on a run's curves. Keys: verdict, reason, gap, final/best losses and steps, checkpoint.
    `reward_failures`: a GRPO run's (run.json's grpo.reward_failures), to name why a reward gave no value."""
    if grpo_verdict.is_grpo(log_history):  # online RL: the reward, not the loss, says whether it learns
        return {**grpo_verdict.diagnose(log_history, reward_failures, (MIN_POINTS, TOO_SHORT)), "method": "grpo"}
    train, evals = loss_series(log_history)
    result = {"verdict": "unknown", "reason": "", "gap": None,
              "final_train_loss": train[-1][1] if train else None,
              "final_eval_loss": evals[-1][1] if evals else None,
              "best_eval_step": None, "best_eval_loss": None, "checkpoint": None}
    if not train:
        result["reason"] = "no training loss was logged (set logging_steps lower than the step count)"
        return result
    last_level = train[-1][1]  # the gap's train side: the last level the closing line prints, where there is one
    if len(train) >= MIN_POINTS:  # the levels the verdicts read (and the run's closing line prints)
        first, last_level, k = loss_levels(train)
        result["train_loss_levels"] = {"first": round(first, 6), "last": round(last_level, 6), "steps_each_end": k}
    epochs = [float(e["epoch"]) for e in log_history if isinstance(e.get("epoch"), (int, float))]
    verdict, why = _train_shape(train, max(epochs) if epochs else None)
    preference, reward = is_preference(log_history), reward_curves.is_reward(log_history)
    if reward:
        result["reward_model"] = reward_curves.summary(log_history)
        stuck = reward_curves.nothing_learned(log_history, train) if verdict != "unknown" else None
        if stuck:
            result.update(verdict="nothing learned", reason=stuck)
            return result
    if preference:
        result["preference"] = preference_summary(log_history)
        # a loss held at its start with accuracy at chance needs no trend: judged from MIN_POINTS, as diverged is
        stuck = nothing_learned(log_history, train) if len(train) >= MIN_POINTS else None
        if stuck:
            result.update(verdict="nothing learned", reason=stuck)
            return result
        shown = learned(log_history) if verdict == "underfit" and why.startswith("training loss barely") else None
        if shown:  # the loss moved little, the ranking did: not underfit by the loss alone
            verdict, why = None, f"{why.split(':')[0].replace('barely moved', 'moved little')} while {shown}"
    if evals:
        best_step, best = min(evals, key=lambda pair: pair[1])
        result.update(best_eval_step=best_step, best_eval_loss=best, gap=evals[-1][1] - last_level)
        final = evals[-1][1]
        if verdict != "diverged" and best_step != evals[-1][0] and final - best > max(RISE_REL * best, RISE_ABS):
            checkpoint = _checkpoint_near(Path(output_dir), best_step) if output_dir else None
            where = f"; use {checkpoint}" if checkpoint else "; no checkpoint was saved near it (lower checkpoint_interval)"
            result.update(verdict="overfit", checkpoint=checkpoint, reason=(
                f"eval loss bottomed at {best:.3f} at step {best_step} and rose to {final:.3f} by step "
                f"{evals[-1][0]}{where}. Train fewer steps/epochs, add data, or raise lora_dropout/weight_decay"))
            return result
    displaced = likelihood_displacement(log_history) if preference and verdict not in (TOO_SHORT, "diverged") else None
    if displaced:
        result.update(verdict="likelihood displacement", reason=displaced)
        return result
    for name, check in (("margins exploding", reward_curves.margins_exploding),
                        ("scores drifting", reward_curves.scores_drifting)):
        found = check(log_history) if reward and verdict not in ("unknown", "diverged") else None
        if found:
            result.update(verdict=name, reason=found)
            return result
    if verdict:
        result.update(verdict=verdict, reason=why)
        return result
    gap, k = result["gap"], result.get("train_loss_levels", {}).get("steps_each_end")
    tail = (f"; generalization gap {gap:+.3f} (final eval loss - the mean train loss of the last {k} steps)"
            if gap is not None else "; no eval split, so overfitting is not checked")
    result.update(verdict="well-fit", reason=why + tail)
    return result


def plot_curves(log_history: list[dict], path: str | Path, diagnosis: dict | None = None) -> Path:
    """Train and eval loss against step, written as a PNG (headless); a preference run adds accuracy, margin and
    log-prob panels (train and eval_) beside the loss."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    preference, reward = is_preference(log_history), reward_curves.is_reward(log_history)
    if grpo_verdict.is_grpo(log_history):
        return _save(grpo_figure(log_history, diagnosis), path)
    fig = Figure(figsize=(11, 7.5) if preference or reward else (7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    if preference or reward:
        axes = fig.subplots(2, 2).flatten()
        _plot_loss(axes[0], log_history, diagnosis)
        start = "log 2 (DPO at the start)" if preference else "log 2 (an untrained head's scores tie)"
        axes[0].axhline(LOG2, color="gray", linestyle=":", linewidth=1, label=start)
        axes[0].legend()
        (plot_panels if preference else reward_curves.plot_reward_panels)(axes[1:], log_history)
        if diagnosis:
            axes[0].set_title("loss")
            fig.suptitle(_title(diagnosis))
    else:
        _plot_loss(fig.add_subplot(), log_history, diagnosis)
    fig.tight_layout()
    return _save(fig, path)


def grpo_figure(log_history: list[dict], diagnosis: dict | None):
    """A GRPO run's figure: a panel per reward function (finetune/train/grpo/verdict.py); the constrained layout
    makes room for the whole verdict in the title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=grpo_verdict.figure_size(log_history), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    grpo_verdict.plot_figure(fig, log_history, diagnosis, lambda ax: _plot_loss(ax, log_history, None))
    return fig


def _save(fig, path) -> Path:
    path = Path(path)
    fig.savefig(path)
    return path


def _title(diagnosis: dict | None) -> str:
    title = f"{diagnosis['verdict']}" if diagnosis else "loss"
    if diagnosis and diagnosis.get("gap") is not None:
        title += f" (gap {diagnosis['gap']:+.3f})"
    return title


def _plot_loss(ax, log_history: list[dict], diagnosis: dict | None) -> None:
    train, evals = loss_series(log_history)
    if train:
        ax.plot(*zip(*train), label="train loss (each step)", color="tab:blue", alpha=0.35, linewidth=0.8)
        window = max(1, len(train) // 20)  # a trailing mean over a twentieth of the run shows the trend
        if window > 1:
            losses = [loss for _, loss in train]
            trend = [_mean(losses[max(0, i - window + 1): i + 1]) for i in range(len(losses))]
            ax.plot([s for s, _ in train], trend, label=f"train loss (mean of {window})", color="tab:blue")
    if evals:
        ax.plot(*zip(*evals), label="eval loss", color="tab:orange", marker="o")
    if diagnosis and diagnosis.get("verdict") == "overfit":
        ax.axvline(diagnosis["best_eval_step"], color="tab:red", linestyle="--",
                   label=f"best eval (step {diagnosis['best_eval_step']})")
    ax.set(xlabel="optimizer step", ylabel="loss", title=_title(diagnosis))
    ax.grid(alpha=0.3)
    ax.legend()


def write_curves(output_dir, log_history: list[dict], reward_failures: dict | None = None) -> dict:
    """Write output_dir/loss_curve.png and output_dir/diagnosis.json; return the diagnosis."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    diagnosis = diagnose(log_history, output_dir, reward_failures)
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
