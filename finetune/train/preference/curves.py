"""The verdicts and panels only a preference run has (finetune/train/preference.py logs the metrics).

    nothing learned           preference accuracy ended at chance (0.5 +- CHANCE_BAND) or at a tie
                              (<= TIE_ACCURACY: accuracy counts chosen > rejected, so rewards that are still
                              exactly equal score 0), or it did not rise (ended below its start + ACCURACY_RISE:
                              flat or falling, wherever it sits: a first level above chance is the noise of
                              dropout or of a small split, not learning), and the loss stayed where it started:
                              at log 2 = 0.693 (+- LOG2_BAND), DPO's loss while the policy equals the reference,
                              or within LOSS_STILL of its first level (methods that start elsewhere)
    likelihood displacement   the chosen answers' log-prob fell (by more than LOGP_FALL of its start and at least
                              LOGP_FALL_NATS), and their reward with it (the log-prob varies with which answers a
                              step holds; the reward compares each answer with its own start), while the reward
                              margin grew (by more than MARGIN_GROWTH, to above 0):
                              the model widens the gap by pushing both answers down (Razin et al. 2024)

Levels are means over the ends of a series, as for the loss: a fifth of the points, at least
min(3, half of them). Training metrics are read first, the eval_ ones when a run logged no training ones.
"""

from __future__ import annotations

import math

from finetune.train.metric_curves import ends, levels, series
from finetune.train.metric_curves import plot_panels as metric_panels

LOG2 = math.log(2)  # DPO's loss while the policy equals the reference: -log sigmoid(0)
CHANCE_BAND = 0.10  # accuracy within this of 0.5 is chance
ACCURACY_RISE = 0.10  # accuracy that ended less than this above its first level did not rise
TIE_ACCURACY = 0.05  # accuracy at or below this: the rewards still tie (policy == reference)
LOG2_BAND = 0.03  # a loss within this of log 2 has not left its start (a mean margin of ~0.06)
LOSS_STILL = 0.10  # ... nor has one that moved less than this fraction (curves.FLAT_DROP's 10%)
MIN_METRIC_POINTS = 3  # logged points a metric needs before it is judged
LOGP_FALL, LOGP_FALL_NATS = 0.05, 1.0  # the chosen log-prob fell by 5% of its start and at least 1 nat
MARGIN_GROWTH = 0.10  # ... while the margin (beta-scaled reward units) grew by this much

METRICS = ("rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected")


def is_preference(log_history: list[dict]) -> bool:
    """A preference run logs reward metrics (KTO: margins without accuracies)."""
    keys = ("rewards/accuracies", "eval_rewards/accuracies", "rewards/margins", "eval_rewards/margins")
    return any(key in entry for entry in log_history for key in keys)


def learned(log_history: list[dict]) -> str | None:
    """What shows the policy learned the preferences, when its loss barely moved: accuracy ended clearly above
    chance, or the reward margin grew (KTO logs no accuracy). A preference loss can move little while the
    ranking is learned (IPO starts at 1 / (2 beta)^2 and falls slowly; KTO's is bounded by its weights), so
    the SFT rule "the loss barely moved: underfit" does not apply alone. None when neither holds."""
    accuracy, key = series(log_history, "rewards/accuracies")
    if len(accuracy) >= MIN_METRIC_POINTS:
        a0, a1 = ends(accuracy)
        if a1 > 0.5 + CHANCE_BAND:
            return f"{key} {a0:.2f} -> {a1:.2f}"
    margins, key = series(log_history, "rewards/margins")
    if len(margins) >= MIN_METRIC_POINTS:
        m0, m1 = ends(margins)
        if m1 > m0 + MARGIN_GROWTH and m1 > 0:
            return f"{key} {m0:.2f} -> {m1:.2f}"
    return None


def summary(log_history: list[dict]) -> dict:
    """{metric: {"first", "last"}} levels of every preference metric logged (train and eval_): diagnosis.json."""
    return levels(log_history, METRICS)


def nothing_learned(log_history: list[dict], train_losses: list[tuple[int, float]]) -> str | None:
    """The reason, when accuracy ended at chance or a tie and the loss stayed where it started; else None."""
    accuracy, key = series(log_history, "rewards/accuracies")
    if len(accuracy) < MIN_METRIC_POINTS or len(train_losses) < MIN_METRIC_POINTS:
        return None
    acc0, acc = ends(accuracy)
    first, last = ends(train_losses)  # = curves.loss_levels for >= 6 points: the loss verdict's own numbers
    at_log2 = abs(last - LOG2) <= LOG2_BAND
    still = first > 0 and abs(last - first) < LOSS_STILL * first
    if not (at_log2 or still):
        return None
    where = "log 2 = 0.693, DPO's loss while the policy equals the reference" if at_log2 else \
        f"where it started ({first:.3f})"
    raise_lr = "raise `learning_rate` (`finetune lr recipe.yml` shows the method's published defaults)"
    if acc <= TIE_ACCURACY:
        return (f"{key} ended at {acc:.2f} and the loss at {last:.3f} ({where}): chosen and rejected rewards still "
                "tie, so the policy has not moved from the reference at all (accuracy counts only chosen > rejected). "
                f"The updates are too small to change the log-probs: {raise_lr} or train longer, and check that "
                "the weights train (adapter, frozen layers)")
    loss = f"the loss {first:.3f} -> {last:.3f} ({where})"
    if abs(acc - 0.5) <= CHANCE_BAND:
        return (f"{key} ended at {acc:.2f} (chance is 0.5) and {loss}: the policy still ranks chosen and rejected "
                f"answers as the reference does. {raise_lr[0].upper()}{raise_lr[1:]} or train longer, or check the "
                "pairs: do chosen and rejected differ, and is chosen the better one?")
    if acc < acc0 + ACCURACY_RISE:
        trend = "fell" if acc < acc0 - 0.02 else "stayed flat"
        return (f"{key} {acc0:.2f} -> {acc:.2f} ({trend}) and {loss}: the policy did not learn to rank the chosen "
                f"answers higher; where the accuracy started is the reference's noise, not learning. "
                f"{raise_lr[0].upper()}{raise_lr[1:]} or train longer, or check the pairs: do chosen and rejected "
                "differ, and is chosen the better one?")
    return None


def likelihood_displacement(log_history: list[dict]) -> str | None:
    """The reason, when the chosen log-prob fell while the reward margin grew; else None."""
    chosen, _ = series(log_history, "logps/chosen")
    margins, _ = series(log_history, "rewards/margins")
    if len(chosen) < MIN_METRIC_POINTS or len(margins) < MIN_METRIC_POINTS:
        return None
    c0, c1 = ends(chosen)
    m0, m1 = ends(margins)
    fell = c1 < c0 - max(LOGP_FALL_NATS, LOGP_FALL * abs(c0))
    grew = m1 > m0 + MARGIN_GROWTH and m1 > 0
    rewards, _ = series(log_history, "rewards/chosen")
    if len(rewards) >= MIN_METRIC_POINTS:  # the chosen reward compares each answer with itself: it must agree
        fell = fell and ends(rewards)[1] < ends(rewards)[0]
    if not (fell and grew):
        return None
    rejected, _ = series(log_history, "logps/rejected")
    also = ""
    if len(rejected) >= MIN_METRIC_POINTS:
        r0, r1 = ends(rejected)
        also = f" (the rejected answers' from {r0:.1f} to {r1:.1f})"
    return (f"the chosen answers' log-prob fell from {c0:.1f} to {c1:.1f}{also} while the reward margin grew from "
            f"{m0:.2f} to {m1:.2f}: the model widens the gap by pushing both answers down, so probability moves to "
            "answers that are in neither (likelihood displacement). Add an SFT term on the chosen answers "
            "(`rpo_alpha: 1.0` for dpo, ipo, simpo), lower `learning_rate` or raise `rl_beta`, or stop earlier")


def plot_panels(axes, log_history: list[dict]) -> None:
    """Accuracy, margin and log-prob panels (train and eval_) on three matplotlib axes."""
    panels = (
        (("rewards/accuracies",), "preference accuracy", 0.5, "chance"),
        (("rewards/margins",), "reward margin (chosen - rejected)", 0.0, None),
        (("logps/chosen", "logps/rejected"), "response log-prob (summed)", None, None),
    )
    colors = {"rewards/accuracies": "tab:green", "rewards/margins": "tab:purple", "logps/chosen": "tab:green",
              "logps/rejected": "tab:red"}
    metric_panels(axes, log_history, panels, colors)
