"""Evaluation: a stage after training, usable alone (`finetune eval`) or when training ends (`eval:` in the recipe).

Base and tuned, side by side, on the same tokens:

    subject.py     what is evaluated: the run (recipe, folder, format) and its models, base and tuned, one at a time
    heldout.py     held-out loss and perplexity on supervised tokens, tokenized and masked as training does
    preference.py  preference runs: reward accuracy and margin on held-out pairs (reference = the base)
    grpo.py        GRPO runs: the run's own rewards on held-out prompts, base vs tuned, with their answers
    uncertainty.py each base-vs-tuned claim's bootstrap interval over the items (seeded): better / worse / no difference
    generation.py  greedy answers to held-out prompts: did each end, is it empty, does it loop
    harness.py     the lm-evaluation-harness bridge (optional extra), local task folders
    report.py      report.json, report.md, report.png, the one-line verdict, --compare
    run.py         evaluate(): the checks in order, the report written

docs/evaluation.md says what each number means.
"""

from __future__ import annotations

__all__ = ["evaluate", "evaluate_after_training"]


def evaluate(*args, **kwargs):
    from finetune.evaluation.run import evaluate as _evaluate

    return _evaluate(*args, **kwargs)


def evaluate_after_training(*args, **kwargs):
    from finetune.evaluation.run import evaluate_after_training as _after

    return _after(*args, **kwargs)
