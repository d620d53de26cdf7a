"""GRPO end to end on the tiny model: a verifiable reward rises; the optimizer update does not depend on how a step
is split into micro batches; a run stopped between steps and resumed regenerates the same completions and ends with
the same weights; mu > 1 with a KL term trains; a reward that raises never ends the run."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_helpers import REWARDS_PY, grpo_recipe
from finetune.recipe import load_recipe

# a dense reward a random tiny model can climb (tests/grpo_helpers.py), trained in full at a rate that moves it
EVEN = [{"function": "rewards.py:even_tokens"}]
FAST = {"rewards": EVEN, "adapter": "none", "learning_rate": 1e-2, "lr_scheduler": "constant"}


def run(tmp_path, base, **overrides):
    from finetune.train.run import run_training

    return run_training(load_recipe(grpo_recipe(tmp_path, base, **{**FAST, **overrides})))


def samples(out) -> list[dict]:
    return [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]


def weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_verifiable_reward_rises_and_the_run_says_so(tmp_path, tiny_model_dir):
    summary = run(tmp_path, tiny_model_dir, max_steps=24)
    rewards = [e["reward"] for e in summary["log_history"] if "reward" in e]
    assert len(rewards) == 24
    assert sum(rewards[-8:]) / 8 > sum(rewards[:8]) / 8 + 0.05
    assert summary["curves"]["verdict"] == "reward rising", summary["curves"]
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    grpo = record["grpo"]
    assert grpo["generated_completions"] == 24 * 8 and grpo["shared_prompt"] is True
    assert grpo["reward_failures"]["even_tokens"]["failures"] == {}
    for key in ("reward", "reward_std", "frac_reward_zero_std", "rewards/even_tokens/mean", "completions/mean_length",
                "completions/clipped_ratio", "entropy", "clip_ratio/region_mean"):
        assert key in record["log_history"][0], key
    logged = samples(tmp_path / "out")
    assert [s["step"] for s in logged][:2] == [1, 1] and len(logged[0]["completions"]) == 4
    assert json.loads((tmp_path / "out" / "diagnosis.json").read_text())["verdict"] == "reward rising"


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_the_update_does_not_depend_on_the_split_of_a_step(tmp_path, tiny_model_dir, loss_type):
    """8 completions a step (2 prompts x G 4) as 1 x 8 and 4 x 2 micro batches: the same generation (seeded
    per step), the same loss normalizer (the whole step's), so the same weights after the step. SGD: Adam's first
    step is lr x sign(gradient), which turns rounding-level differences in a near-zero gradient into lr-sized ones."""
    results = []
    for micro, accumulation in ((8, 1), (2, 4)):
        folder = tmp_path / f"{micro}x{accumulation}"
        folder.mkdir()
        run(folder, tiny_model_dir, max_steps=2, micro_batch_size=micro, gradient_accumulation_steps=accumulation,
            loss_type=loss_type, num_iterations=2, optimizer="sgd", learning_rate=1.0)  # mu 2: the second step's ratio is not 1, so the clip acts
        results.append(weights(folder / "out"))
    for other in results[1:]:
        for name, tensor in results[0].items():
            assert torch.allclose(tensor, other[name], atol=1e-5), name
    assert any(not torch.equal(results[0][n], weights_start) for n, weights_start in
               _start(tiny_model_dir).items() if n in results[0])  # and the step did change the weights


def _start(base) -> dict:
    from safetensors.torch import load_file

    return load_file(str(base / "model.safetensors"))


def test_a_run_stopped_between_steps_and_resumed_regenerates_the_same_completions(tmp_path, tiny_model_dir):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    whole.mkdir(), halves.mkdir()
    run(whole, tiny_model_dir, max_steps=4, checkpoint_interval=2)
    run(halves, tiny_model_dir, max_steps=2, checkpoint_interval=2)
    resumed = run(halves, tiny_model_dir, max_steps=4, checkpoint_interval=2)
    assert resumed["resumed_from"]
    assert samples(whole / "out") == samples(halves / "out")  # steps 1-4: the same completions and rewards
    final_whole, final_resumed = weights(whole / "out"), weights(halves / "out")
    for name, tensor in final_whole.items():
        assert torch.allclose(tensor, final_resumed[name], atol=1e-6), name


def test_two_updates_per_generation_with_a_kl_term_train_an_adapter(tmp_path, tiny_model_dir):
    summary = run(tmp_path, tiny_model_dir, max_steps=4, num_iterations=2, rl_beta=0.04, adapter="lora",
                  learning_rate=5e-2, lora_dropout=0.0)
    logged = [e for e in summary["log_history"] if "kl" in e]
    assert len(logged) == 4 and logged[0]["kl"] == 0  # before the first update the policy is the reference
    assert logged[1]["kl"] > 0  # the adapter moved after step 1; the reference is the adapter switched off
    # the rewards are logged at the steps that generate (1 and 3); the clip acts on the reused generation's step
    assert [e["step"] for e in summary["log_history"] if "reward" in e] == [1, 3]
    assert summary["grpo"]["generated_completions"] == 2 * 8  # 4 steps, one generation per 2 steps
    assert sorted({s["step"] for s in samples(tmp_path / "out")}) == [1, 3]


def test_a_reward_that_raises_is_counted_and_the_run_goes_on(tmp_path, tiny_model_dir):
    (tmp_path / "broken.py").write_text("def boom(completions, **kwargs):\n    raise ValueError('no answer key')\n")
    summary = run(tmp_path, tiny_model_dir, max_steps=2, rewards=[*EVEN, {"function": "broken.py:boom"}])
    failures = summary["grpo"]["reward_failures"]
    assert failures["boom"]["failures"] == {"exception": 2}
    assert "no answer key" in failures["boom"]["first_messages"]["exception"]
    assert failures["even_tokens"]["failures"] == {}
    assert all("rewards/boom/missing" in e and e["rewards/boom/missing"] == 1.0
               for e in summary["log_history"] if "reward" in e)
    assert REWARDS_PY  # the helper file is the same one the recipe points at


def test_finetune_eval_scores_base_and_tuned_with_the_runs_rewards_on_held_out_prompts(tmp_path, tiny_model_dir):
    from finetune.evaluation.run import evaluate

    run(tmp_path, tiny_model_dir, max_steps=6, val_set_size=4, n=20)
    report = evaluate(str(tmp_path / "out"))
    grpo = report["grpo"]
    assert grpo["prompts"] == 4 and grpo["samples_per_prompt"] == 4
    for side in ("base", "tuned"):
        values = grpo["sides"][side]
        assert 0.0 <= values["rewards/even_tokens"] <= 1.0 and values["reward"] == values["rewards/even_tokens"]
    assert grpo["sides"]["tuned"]["reward"] != grpo["sides"]["base"]["reward"]
    assert "on held-out reward" in report["verdict"] and "over 4 prompts, 95% interval" in report["verdict"]
    assert grpo["differences"]["reward"]["mean"] == pytest.approx(
        grpo["sides"]["tuned"]["reward"] - grpo["sides"]["base"]["reward"], abs=1e-9)  # every prompt scored
    md = (tmp_path / "out" / "eval" / "report.md").read_text()
    assert "held-out data: the recipe's eval split (val_set_size 4" in md and "None" not in md
    assert "pairs' prompts" not in md and "prompt format: raw (a grpo run on text prompts" in md
    assert "answers cut at max_completion_length: base " in md and "mean answer length: base " in md
    assert "### Prompt 4" in md and "**tuned 4** (reward " in md and "even_tokens " in md  # the answers, kept
    kept = grpo["answers"][0]["tuned"][0]
    assert set(kept) == {"answer", "reward", "tokens", "truncated", "rewards"} and "even_tokens" in kept["rewards"]


def test_every_reward_failing_step_after_step_stops_the_run_with_one_message(tmp_path, tiny_model_dir):
    from finetune.errors import RewardError

    (tmp_path / "broken.py").write_text("def boom(completions, **kwargs):\n    raise ValueError('no answer key')\n")
    with pytest.raises(RewardError, match="no answer key") as info:
        run(tmp_path, tiny_model_dir, max_steps=8, rewards=[{"function": "broken.py:boom"}])
    assert info.value.exit_code == 2 and "5" in str(info.value)
