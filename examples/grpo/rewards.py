"""Reward functions for examples/grpo/recipe.yml, in TRL's contract: keyword arguments `prompts`, `completions`
(here [{"role": "assistant", "content": ...}], the prompts being conversations) and the records' other columns
(`answer`); one float per completion."""

import re


def _text(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def correct(prompts, completions, answer, **kwargs):
    """1 when the reply's last number is the sum, else 0."""
    out = []
    for completion, expected in zip(completions, answer):
        numbers = re.findall(r"-?\d+", _text(completion))
        out.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return out


def concise(completions, **kwargs):
    """Partial credit for brevity: 1 up to 6 words ("7 + 5 = 12."), falling to 0 at 20 words. Graded, so that a
    group of answers rarely ties (a tied group teaches nothing)."""
    return [min(1.0, max(0.0, (20 - len(_text(c).split())) / 14)) for c in completions]
