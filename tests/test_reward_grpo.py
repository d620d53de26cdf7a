"""A reward model as a GRPO reward: a tiny reward model trained here to prefer short answers makes a GRPO run's
completions shorter; beside a program reward, both normalized, both rewards rise; the completions reach it rendered as
it trained (the EOS trap); the recipe's and validate's checks of a `model:` reward."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from conftest import sentence, write_jsonl
from finetune.recipe import load_recipe
from finetune.train.run import run_training
from grpo_helpers import grpo_recipe, prompt_records
from reward_helpers import reward_recipe

# the GRPO runs: full fine-tune at a rate that moves the tiny policy within a few steps
FAST = {"adapter": "none", "learning_rate": 1e-2, "lr_scheduler": "constant", "max_completion_length": 16}


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """(a policy that ends its answers after 1-10 words, a reward model that prefers the shorter answer). The tiny
    model alone almost never samples EOS, so a short SFT teaches it to end; the reward model learns length pairs."""
    policy = tmp_path_factory.mktemp("policy")
    rng = random.Random(0)
    write_jsonl(policy / "sft.jsonl", [{"text": f"say {r['word']} " + sentence(rng, 1, 10)}
                                       for r in prompt_records(64, seed=3)])
    (policy / "recipe.yml").write_text(yaml.safe_dump(
        {"base_model": str(tiny_model_dir), "datasets": [{"path": "sft.jsonl", "type": "completion"}],
         "sequence_len": 64, "micro_batch_size": 8, "num_epochs": 1, "learning_rate": 1e-2, "output_dir": "out",
         "cache_dir": "cache", "report_to": ["none"], "val_set_size": 0, "adapter": "none", "precision": "fp32",
         "compile": False}))
    run_training(load_recipe(policy / "recipe.yml"))
    rm = tmp_path_factory.mktemp("rm")
    run_training(load_recipe(reward_recipe(rm, tiny_model_dir, sample_packing=True, micro_batch_size=2)))
    return policy / "out", rm / "out"


def grpo(tmp_path, models, rewards, steps: int = 16):
    policy, _ = models
    return run_training(load_recipe(grpo_recipe(tmp_path, policy, rewards=rewards, max_steps=steps, **FAST)))


def thirds(summary, key: str) -> tuple[float, float]:
    values = [e[key] for e in summary["log_history"] if key in e]
    k = len(values) // 3
    return sum(values[:k]) / k, sum(values[-k:]) / k


def test_a_reward_model_that_prefers_short_answers_shortens_the_completions(tmp_path, models):
    summary = grpo(tmp_path, models, [{"model": str(models[1])}])
    length_first, length_last = thirds(summary, "completions/mean_length")
    score_first, score_last = thirds(summary, "rewards/out/mean")
    assert length_last < length_first - 2.0, (length_first, length_last)
    assert score_last > score_first, (score_first, score_last)
    failures = json.loads((tmp_path / "out" / "run.json").read_text())["grpo"]["reward_failures"]
    assert failures["out"]["model"] == str(models[1]) and failures["out"]["calls"] == 16


def test_beside_a_program_reward_both_normalized_both_rise(tmp_path, models):
    summary = grpo(tmp_path, models, [{"model": str(models[1]), "normalize": True},
                                      {"function": "rewards.py:even_tokens", "normalize": True}], steps=20)
    for key in ("rewards/out/mean", "rewards/even_tokens/mean"):
        first, last = thirds(summary, key)
        assert last > first + 0.1, (key, first, last)


def test_group_zscores_give_each_normalized_reward_its_weight_alone():
    from finetune.train.grpo.advantages import zscore_groups

    values = torch.tensor([[5.0, 1.0], [7.0, 0.0], [float("nan"), 1.0], [-3.0, 0.0],  # group 1
                           [2.0, 1.0], [2.0, 1.0], [2.0, 0.0], [2.0, 1.0]])  # group 2: the model's scores tie
    out = zscore_groups(values, [True, False], 4)
    assert torch.equal(out[:, 1], values[:, 1])  # not normalized: as it was
    group = torch.tensor([5.0, 7.0, -3.0])
    expected = (group - group.mean()) / (group.std() + 1e-4)
    assert torch.allclose(out[[0, 1, 3], 0], expected, atol=1e-5) and torch.isnan(out[2, 0])
    assert torch.equal(out[4:, 0], torch.zeros(4))  # a tied group: no spread, no signal


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_a_completion_reaches_the_reward_model_as_it_trained_not_as_decoded_text(tmp_path, tiny_model_dir, models,
                                                                                 chat):
    """The trap (TRL PR #5813): training appends EOS (plain text) or the template's end of turn (chat), but the
    policy's completion arrives as text decoded without special tokens. The scorer renders it again the way the pairs
    were rendered, so the head reads the token it was trained on; the decoded text alone ends a token early."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.model.scorer import RewardScorer, Scoring

    recipe = load_recipe(reward_recipe(tmp_path, tiny_model_dir, n=8, chat=chat, val_set_size=0))
    store = build_dataset(recipe, load_tokenizer(recipe)).store
    records = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    scorer = RewardScorer.load(models[1])  # trained on plain text; as one trained on conversations, for chat
    if chat:
        scorer = RewardScorer(scorer.model, scorer.tokenizer, Scoring(True, 48, eos_appended=False))
    for i, record in enumerate(records):
        answer = record["chosen"] if not chat else record["chosen"][0]["content"]
        completion = answer if not chat else [{"role": "assistant", "content": answer}]  # GRPO's shapes
        assert scorer.encode(record["prompt"], completion) == store.prompts[i] + store.responses[i][0]
    tokenizer = scorer.tokenizer
    record = records[0]
    if chat:
        naive = tokenizer.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=False)
        naive = tokenizer(naive + record["chosen"][0]["content"], add_special_tokens=False)["input_ids"]
    else:
        naive = tokenizer(record["prompt"] + record["chosen"])["input_ids"]
    trained = scorer.encode(record["prompt"], record["chosen"] if not chat else record["chosen"])
    assert naive != trained and trained[:len(naive)] == naive  # the same text, without its end
    assert abs(scorer.score_ids([naive])[0] - scorer.score_ids([trained])[0]) > 1e-3


def test_reward_model_entries_are_checked_when_the_recipe_loads(tmp_path, tiny_model_dir, models):
    from finetune.errors import RecipeError

    def recipe(rewards):
        return grpo_recipe(tmp_path, tiny_model_dir, rewards=rewards)

    with pytest.raises(RecipeError, match="(?i)either `function: FILE.py:NAME` or `model: FOLDER`"):
        load_recipe(recipe([{"function": "rewards.py:short", "model": str(models[1])}]))
    with pytest.raises(RecipeError, match="`timeout_s` does not apply to a reward model"):
        load_recipe(recipe([{"model": str(models[1]), "timeout_s": 5}]))
    with pytest.raises(RecipeError, match="`max_length` does not apply to a reward function"):
        load_recipe(recipe([{"function": "rewards.py:short", "max_length": 64}]))
    with pytest.raises(RecipeError, match="rewards.0.model.*not a reward model"):
        load_recipe(recipe([{"model": str(models[0])}]))  # the policy: an SFT run
    with pytest.raises(RecipeError, match="rewards.0.model.*no folder at"):
        load_recipe(recipe([{"model": "nowhere"}]))
    loaded = load_recipe(recipe([{"model": str(models[1]), "weight": 0.5, "normalize": True, "batch_size": 4}]))
    assert loaded.rewards[0].model == str(models[1]) and loaded.rewards[0].batch_size == 4


def test_a_plain_text_reward_model_is_refused_for_conversation_prompts_before_the_policy_loads(tmp_path, models,
                                                                                              tiny_model_dir):
    from finetune.errors import ModelError

    path = grpo_recipe(tmp_path, tiny_model_dir, chat=True, rewards=[{"model": str(models[1])}])
    with pytest.raises(ModelError, match="trained on plain-text pairs, and this run's prompts are conversations"):
        run_training(load_recipe(path))
    assert not (tmp_path / "out").exists()


def test_validate_says_what_a_reward_model_reads(tmp_path, tiny_model_dir, models, capsys):
    from finetune.cli import main

    path = grpo_recipe(tmp_path, tiny_model_dir, rewards=[{"model": str(models[1])},
                                                          {"function": "rewards.py:names_the_word"}])
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "reward out: a reward model" in out and "plain text, EOS appended" in out
    assert "reward names_the_word: ok" in out


def test_plan_counts_a_grpo_runs_reward_models(tmp_path, tiny_model_dir, models, capsys):
    from finetune.cli import main
    from finetune.plan.run_memory import recipe_shape

    path = grpo_recipe(tmp_path, tiny_model_dir, rewards=[{"model": str(models[1]), "batch_size": 4}])
    (load,) = recipe_shape(load_recipe(path))["reward_models"]
    assert load.tokens == 4 * 48 and load.params > 0  # batch_size x the sequence_len the reward model trained with
    assert main(["plan", str(path), "--no-data"]) == 0
    out = capsys.readouterr().out
    assert "reward models" in out and "reward model scoring" in out and "held the whole run" in out
