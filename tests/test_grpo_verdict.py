"""The GRPO verdict reads the reward curves: each verdict from a history made to show it, with its numbers."""

from __future__ import annotations

import json

import pytest

from finetune.train.curves import write_curves


def history(n=12, reward=lambda s: 0.2, std=0.3, tied=0.2, clipped=0.1, length=lambda s: 20.0, entropy=lambda s: 1.5):
    return [{"step": s, "loss": 0.0, "reward": reward(s), "reward_std": std, "frac_reward_zero_std": tied,
             "completions/clipped_ratio": clipped, "completions/mean_length": length(s), "entropy": entropy(s)}
            for s in range(1, n + 1)]


@pytest.mark.parametrize("log, verdict, numbers", [
    (history(reward=lambda s: 0.1 + 0.05 * s), "reward rising", "mean reward 0.225 -> 0.625"),
    (history(), "flat", "0.200 -> 0.200"),
    (history(tied=0.95), "no signal", "95% of groups were tied"),
    (history(clipped=0.8), "truncated", "80% of completions were cut"),
    (history(entropy=lambda s: 2.0 / s ** 2), "collapsed", "token entropy fell to 0.019"),
    (history(reward=lambda s: 0.1 * s, length=lambda s: 10.0 * s), "length hacking", "grew 12.0x"),
])
def test_each_verdict_with_the_numbers_behind_it(tmp_path, log, verdict, numbers):
    diagnosis = write_curves(tmp_path, log)
    assert diagnosis["verdict"] == verdict, diagnosis
    assert numbers in diagnosis["reason"]
    assert json.loads((tmp_path / "diagnosis.json").read_text())["verdict"] == verdict
    assert (tmp_path / "loss_curve.png").stat().st_size > 10_000  # the reward panels were drawn


def test_the_first_generation_warns_before_a_run_that_cannot_learn():
    from finetune.train.grpo.verdict import first_generation

    assert "90% of completions hit max_completion_length 8" in first_generation(0.0, 0.9, 4, 8)
    assert "every group of 4 completions got one reward" in first_generation(1.0, 0.0, 4, 8)
    assert first_generation(0.5, 0.1, 4, 8) is None


@pytest.mark.parametrize("last_entropy", [0.049, 0.051])
def test_one_low_entropy_step_at_the_end_is_not_a_collapse(tmp_path, last_entropy):
    """Per-step entropy swings (0.01 to 0.4 on SmolLM2): the verdict reads the last third's mean, not the last step."""
    rewards, entropies = [0.2, 0.3, 0.9, 1.4, 1.5, 1.5, 1.5, 1.5], [2, 1.5, 0.5, 0.2, 0.3, 0.3, 0.3, last_entropy]
    log = history(n=8, reward=lambda s: rewards[s - 1], entropy=lambda s: entropies[s - 1])
    assert write_curves(tmp_path, log)["verdict"] == "reward rising"


def with_tools(log, calls=lambda s: 1.0, capped=lambda s: 0.0):
    return [{**e, "tools/call_frequency": calls(e["step"]), "episodes/cut_by_cap": capped(e["step"])} for e in log]


@pytest.mark.parametrize("log, verdict, numbers, reward_verdict", [
    (with_tools(history(reward=lambda s: 0.1 + 0.05 * s), calls=lambda s: 1.2 - 0.1 * s), "stopped calling tools",
     "tool calls per episode fell 0.95 -> 0.15", "reward rising"),
    (with_tools(history(), capped=lambda s: 0.95), "tool cap", "95% of episodes (last third)", "flat"),
    (with_tools(history(reward=lambda s: 0.1 + 0.05 * s), calls=lambda s: 0.9 + 0.01 * s), "reward rising",
     "mean reward 0.225 -> 0.625", None),  # tools used throughout: the reward's verdict
    (with_tools(history(), calls=lambda s: 0.05 if s < 4 else 0.0), "flat", "0.200 -> 0.200", None),  # never used
])
def test_tool_use_verdicts_keep_the_rewards_own(tmp_path, log, verdict, numbers, reward_verdict):
    diagnosis = write_curves(tmp_path, log)
    assert diagnosis["verdict"] == verdict, diagnosis
    assert numbers in diagnosis["reason"]
    assert diagnosis.get("reward_verdict") == reward_verdict


def test_a_few_logged_rewards_are_too_short_for_a_trend_but_shares_are_still_told(tmp_path):
    """3 logged steps rising 0.48 -> 0.52 said "reward rising"; under SFT's minimum of points it is "too short"."""
    from finetune.train.curves import MIN_POINTS
    from finetune.train.curves import diagnose as curves_diagnose

    def diagnose(log):
        return curves_diagnose(log, tmp_path)

    rising = lambda s: 0.1 + 0.05 * s  # noqa: E731
    short = diagnose(history(n=MIN_POINTS - 1, reward=rising))
    assert short["verdict"] == "too short" and f"{MIN_POINTS - 1} logged reward point(s), {MIN_POINTS} needed" in \
        short["reason"], short
    assert diagnose(history(n=3))["verdict"] == "too short"  # flat is a trend too
    assert diagnose(history(n=MIN_POINTS, reward=rising))["verdict"] == "reward rising"
    assert diagnose(history(n=3, tied=0.95))["verdict"] == "no signal"
    assert diagnose(history(n=3, clipped=0.8, reward=rising))["verdict"] == "truncated"


def test_a_held_out_gain_is_not_set_against_a_too_short_training_verdict():
    import random

    from finetune.evaluation.grpo import verdict_part
    from finetune.evaluation.uncertainty import paired_interval

    base = [random.Random(2).random() for _ in range(20)]
    grpo = {"sides": {"base": {"reward": 0.4}, "tuned": {"reward": 0.7}}, "prompts": 20,
            "differences": {"reward": paired_interval(base, [b + 0.3 for b in base], seed=0)},
            "training_verdict": {"verdict": "too short", "reason": "too short to judge the reward's trend: 3"}}
    assert "against" not in verdict_part(grpo)
