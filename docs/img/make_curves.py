"""Render the example curves in docs/learning-curves.md with finetune's own plot and diagnosis.

    python docs/img/make_curves.py     # -> docs/img/curve-*.png

The log histories are synthetic (shapes typical of real runs, with a little noise), so that each verdict
has a clean example; tests/test_docs.py checks that `finetune.train.curves.diagnose` gives each its label.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _history(train_fn, eval_fn, steps: int = 60, eval_every: int = 10, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    history = []
    for step in range(1, steps + 1):
        history.append({"step": step, "loss": round(train_fn(step) + rng.gauss(0, 0.03), 4)})
        if step % eval_every == 0:
            history.append({"step": step, "eval_loss": round(eval_fn(step), 4)})
    return history


def _preference_history(loss_fn, accuracy_fn, margin_fn, chosen_fn, rejected_fn, steps: int = 60,
                        log_every: int = 3, eval_every: int = 10, seed: int = 0) -> list[dict]:
    """A DPO run's log: the loss every step, the preference metrics every `log_every` steps (train) and at
    every evaluation (eval_), as finetune/train/preference/trainer.py logs them."""
    rng = random.Random(seed)
    history = []
    for step in range(1, steps + 1):
        entry = {"step": step, "loss": round(loss_fn(step) + rng.gauss(0, 0.01), 4)}
        metrics = {"rewards/accuracies": accuracy_fn(step, rng), "rewards/margins": margin_fn(step),
                   "logps/chosen": chosen_fn(step), "logps/rejected": rejected_fn(step)}
        if step % log_every == 0:
            entry.update({k: round(v, 4) for k, v in metrics.items()})
        history.append(entry)
        if step % eval_every == 0:
            history.append({"step": step, "eval_loss": round(loss_fn(step) + 0.01, 4),
                            **{f"eval_{k}": round(v, 4) for k, v in metrics.items()}})
    return history


def _grow(step: int) -> float:
    return 1 - math.exp(-step / 8)


def histories() -> dict[str, tuple[str, list[dict]]]:
    """name -> (the verdict finetune gives it, log_history)."""
    return {
        "underfit-flat": ("underfit", _history(lambda s: 2.4 - 0.002 * s, lambda s: 2.45 - 0.002 * s)),
        "underfit-still-falling": ("underfit", _history(lambda s: 2.4 - 0.02 * s, lambda s: 2.45 - 0.019 * s)),
        "overfit": ("overfit", _history(lambda s: 0.3 + 2.1 * math.exp(-s / 12),
                                        lambda s: 1.1 + 1.4 * math.exp(-s / 8) + 0.012 * max(0, s - 20))),
        "well-fit": ("well-fit", _history(lambda s: 1.0 + 1.4 * math.exp(-s / 8),
                                          lambda s: 1.1 + 1.4 * math.exp(-s / 8))),
        "diverged": ("diverged", _history(lambda s: 0.95 + 0.012 * s + (0.4 if s > 40 else 0.0),
                                          lambda s: 1.0 + 0.012 * s)),
        # DPO: accuracy stays at chance (batches of 8 pairs) and the loss at log 2
        "nothing-learned": ("nothing learned", _preference_history(
            lambda s: math.log(2), lambda s, rng: rng.choice((0.375, 0.5, 0.5, 0.625)), lambda s: 0.0,
            lambda s: -210.0, lambda s: -214.0)),
        # DPO: the margin grows and the loss falls, but by pushing the chosen answers down too
        "likelihood-displacement": ("likelihood displacement", _preference_history(
            lambda s: 0.35 + (math.log(2) - 0.35) * math.exp(-s / 8), lambda s, rng: 0.5 + 0.4 * _grow(s),
            lambda s: 3.0 * _grow(s), lambda s: -210.0 - 45 * _grow(s), lambda s: -214.0 - 75 * _grow(s))),
    }


def main() -> None:
    from finetune.train.curves import diagnose, plot_curves

    for name, (_, history) in histories().items():
        diagnosis = diagnose(history)
        path = plot_curves(history, HERE / f"curve-{name}.png", diagnosis)
        print(f"{path.name}: {diagnosis['verdict']}: {diagnosis['reason']}")


if __name__ == "__main__":
    main()
