"""The verdicts and panels only a reward run has (finetune/train/reward/trainer.py logs the metrics).

    nothing learned     pair accuracy ended at chance (0.5 +- CHANCE_BAND), or did not rise (ended below its start +
                        ACCURACY_RISE) while the loss stayed within LOSS_STILL of where it started: the head does not
                        separate chosen from rejected (an accuracy that starts high on easy pairs and stays there, the
                        loss falling, is learning); checked before the loss's verdicts
    margins exploding   the mean margin (chosen - rejected score) ended above MARGIN_LIMIT: the pairs are separated
                        by sigmoid(MARGIN_LIMIT) = 0.99995, their loss and gradients are ~0, and the scores are
                        far apart: the head memorises the training pairs (their accuracy says nothing then; the eval
                        split's does), and as a GRPO reward such logits drown every other reward
    scores drifting     the mean score moved by more than DRIFT_LIMIT and by more than DRIFT_RATIO x the final
                        margin: the Bradley-Terry loss sees only differences, so nothing holds the scores' level;
                        `center_rewards_coefficient` (e.g. 0.01) does, as `normalize: true` does for a GRPO reward
The last two are checked after diverged and overfit, as likelihood displacement is for preference runs.

Levels are means over the ends of a series (finetune/train/metric_curves.py). Training metrics are read first, the
eval_ ones when a run logged no training ones.
"""

from __future__ import annotations

from finetune.train.metric_curves import ends, levels, metric_series, plot_panels, series

CHANCE_BAND = 0.10  # accuracy within this of 0.5 is chance
ACCURACY_RISE = 0.10  # accuracy that ended less than this above its first level did not rise
LOSS_STILL = 0.10  # ... while the loss moved less than this fraction of its start
MARGIN_LIMIT = 10.0  # logits: sigmoid(10) = 0.99995, a training pair's loss 4.5e-5
DRIFT_LIMIT = 5.0  # the mean score moved this far ...
DRIFT_RATIO = 2.0  # ... and more than twice the final margin: a level the loss does not see
MIN_METRIC_POINTS = 3  # logged points a metric needs before it is judged

METRICS = ("accuracy", "margin", "chosen_reward", "rejected_reward", "mean_reward")


def is_reward(log_history: list[dict]) -> bool:
    """A reward run logs pair accuracy and margin under TRL's names (preference runs log rewards/accuracies)."""
    return any(("accuracy" in e and "margin" in e) or ("eval_accuracy" in e and "eval_margin" in e)
               for e in log_history)


def summary(log_history: list[dict]) -> dict:
    """{metric: {"first", "last"}} of every reward metric logged: diagnosis.json."""
    return levels(log_history, METRICS)


def nothing_learned(log_history: list[dict], train_losses: list[tuple[int, float]]) -> str | None:
    """The reason, when pair accuracy ended at chance, or did not rise while the loss stayed; else None."""
    accuracy, key = series(log_history, "accuracy")
    if len(accuracy) < MIN_METRIC_POINTS or len(train_losses) < MIN_METRIC_POINTS:
        return None
    first, last = ends(accuracy)
    loss_first, loss_last = ends(train_losses)
    still = loss_first > 0 and abs(loss_last - loss_first) < LOSS_STILL * loss_first
    advice = ("Raise `learning_rate` (`finetune lr recipe.yml` shows the method's default) or train longer, and check "
              "the pairs: do chosen and rejected differ in what the score should see, and is chosen the better one?")
    if abs(last - 0.5) <= CHANCE_BAND:
        return f"{key} ended at {last:.2f} (chance is 0.5): the score head does not separate chosen from rejected. " \
               + advice
    if last < first + ACCURACY_RISE and still:
        trend = "fell" if last < first - 0.02 else "stayed flat"
        return f"{key} {first:.2f} -> {last:.2f} ({trend}) and the loss {loss_first:.3f} -> {loss_last:.3f}: the " \
               "reward model did not learn to rank the chosen answers higher. " + advice
    return None


def margins_exploding(log_history: list[dict]) -> str | None:
    margins, key = series(log_history, "margin")
    if len(margins) < MIN_METRIC_POINTS:
        return None
    first, last = ends(margins)
    if last <= MARGIN_LIMIT:
        return None
    held = ""
    accuracy = metric_series(log_history, "eval_accuracy")
    if accuracy:
        held = f"; eval_accuracy ended at {ends(accuracy)[1]:.2f}"
    return (f"the mean {key} grew from {first:.2f} to {last:.2f} (sigmoid({last:.0f}) is 1 to 4 decimals): the "
            f"training pairs are separated far past what the loss needs, so the head memorises them{held}. Lower "
            "`learning_rate`, train fewer epochs, or add pairs; as a GRPO reward such scores drown other rewards "
            "unless normalized (`normalize: true`)")


def scores_drifting(log_history: list[dict]) -> str | None:
    mean, key = series(log_history, "mean_reward")
    margins, _ = series(log_history, "margin")
    if len(mean) < MIN_METRIC_POINTS or len(margins) < MIN_METRIC_POINTS:
        return None
    first, last = ends(mean)
    margin = abs(ends(margins)[1])
    moved = abs(last - first)
    if moved <= DRIFT_LIMIT or moved <= DRIFT_RATIO * margin:
        return None
    return (f"the scores drifted as a whole: {key} {first:+.2f} -> {last:+.2f} while the margin is {margin:.2f}. The "
            "Bradley-Terry loss sees only chosen - rejected, so nothing holds the scores' level; set "
            "`center_rewards_coefficient: 0.01` (or raise it), and give a GRPO reward from this model `normalize: true`")


def plot_reward_panels(axes, log_history: list[dict]) -> None:
    """Accuracy, margin and score panels (train and eval_) on three matplotlib axes."""
    panels = ((("accuracy",), "pair accuracy (chosen > rejected)", 0.5, "chance"),
              (("margin",), "margin (chosen - rejected score)", 0.0, None),
              (("chosen_reward", "rejected_reward", "mean_reward"), "score", 0.0, None))
    colors = {"accuracy": "tab:green", "margin": "tab:purple", "chosen_reward": "tab:green",
              "rejected_reward": "tab:red", "mean_reward": "tab:gray"}
    plot_panels(axes, log_history, panels, colors)
