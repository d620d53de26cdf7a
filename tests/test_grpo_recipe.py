"""GRPO's recipe, records and step layout: impossible combinations refused with the numbers at validate, prompt
records tokenized as the model will see them, and the sampler's groups whole on every process."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from grpo_helpers import grpo_recipe
from finetune.errors import DataError, RecipeError
from finetune.recipe import load_recipe


def problems(tmp_path, base, **overrides) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(grpo_recipe(tmp_path, base, **overrides))
    return str(info.value)


def test_a_grpo_recipe_validates_with_the_method_defaults(tmp_path, tiny_model_dir):
    from finetune.recipe.methods import method_setting, method_settings

    recipe = load_recipe(grpo_recipe(tmp_path, tiny_model_dir, num_generations=None, max_completion_length=None,
                                     sequence_len=512, gradient_accumulation_steps=2))
    assert method_setting(recipe, "num_generations") == 8 and method_setting(recipe, "rl_beta") == 0.0
    settings = method_settings(recipe)
    assert settings["loss_type"] == "dapo" and settings["epsilon_high"] == settings["epsilon"] == 0.2
    assert settings["max_completion_length"] == 256 and settings["scale_rewards"] == "group"


def test_a_step_that_splits_a_group_is_refused_with_the_numbers(tmp_path, tiny_model_dir):
    said = problems(tmp_path, tiny_model_dir, micro_batch_size=3, gradient_accumulation_steps=1, num_generations=4)
    assert "micro_batch_size 3 x gradient_accumulation_steps 1 = 3 completions per process" in said
    assert "not a multiple of num_generations 4" in said and "a multiple of 4" in said


@pytest.mark.parametrize("overrides, expected", [
    ({"rewards": []}, "`method: grpo` needs at least one reward function"),
    ({"num_generations": 1}, "num_generations"),
    ({"max_completion_length": 64}, "`max_completion_length` 64 leaves no room for the prompt in sequence_len 64"),
    ({"rl_beta": 0.04, "adapter": "none"}, "needs `adapter: lora` or `qlora`"),
    ({"sample_packing": True}, "remove `sample_packing`"),
    ({"epsilon": 0.3, "epsilon_high": 0.2}, "`epsilon_high` 0.2 is below `epsilon` 0.3"),
])
def test_impossible_grpo_settings_are_named(tmp_path, tiny_model_dir, overrides, expected):
    assert expected in problems(tmp_path, tiny_model_dir, **overrides)


def test_grpo_keys_under_another_method_and_rewards_under_dpo_are_refused(tmp_path, tiny_model_dir):
    said = problems(tmp_path, tiny_model_dir, method="sft", datasets=[{"path": "prompts.jsonl", "type": "completion"}])
    assert "`num_generations` is a setting of method `grpo`, not of `method: sft`" in said
    assert "`rewards` score completions that `method: grpo` generates" in said


def test_prompt_records_under_sft_and_sft_records_under_grpo_are_refused(tmp_path, tiny_model_dir):
    said = problems(tmp_path, tiny_model_dir, datasets=[{"path": "prompts.jsonl", "type": "chat"}])
    assert "`method: grpo` trains on prompt records" in said
    said = problems(tmp_path, tiny_model_dir, method="dpo", num_generations=None, max_completion_length=None,
                    rewards=[], datasets=[{"path": "prompts.jsonl", "type": "prompt"}])
    assert "only `method: grpo` trains on" in said


def _prepared(tmp_path, base, **overrides):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    recipe = load_recipe(grpo_recipe(tmp_path, base, **overrides))
    tokenizer = load_tokenizer(recipe)
    return recipe, tokenizer, build_dataset(recipe, tokenizer)


@pytest.mark.parametrize("chat", [False, True])
def test_prompts_are_the_ids_the_model_generates_after_and_keep_their_columns(tmp_path, tiny_model_dir, chat):
    recipe, tokenizer, prepared = _prepared(tmp_path, tiny_model_dir, chat=chat, val_set_size=4)
    row = prepared.train[0]
    record = json.loads(row["record"])
    assert set(record) == {"prompt", "word"}
    if chat:
        text = tokenizer.apply_chat_template(record["prompt"], tokenize=False, add_generation_prompt=True)
        expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        expected = tokenizer(record["prompt"], add_special_tokens=True)["input_ids"]
    assert row["prompt_ids"] == list(expected)
    assert prepared.stats["train"]["examples"] == 12 and prepared.stats["eval"]["examples"] == 4
    # issue 43, item 14: plain text reaches a model whose tokenizer has a chat template without it, and is said so
    from finetune.data.grpo.prompts import template_note

    assert tokenizer.chat_template and prepared.stats["formats"] == ({"chat": 16} if chat else {"completion": 16})
    note = template_note(prepared.stats, tokenizer)
    assert (note is None) if chat else note.startswith("16 of 16 prompts are plain text: they reach the model as "
                                                       "written (its BOS, no chat template)")


def test_a_prompt_longer_than_its_room_is_dropped_counted_or_cut_from_its_start(tmp_path, tiny_model_dir):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    path = grpo_recipe(tmp_path, tiny_model_dir)
    with open(tmp_path / "prompts.jsonl", "a") as out:
        out.write(json.dumps({"prompt": " ".join(["alpha"] * 80), "word": "alpha"}) + "\n")

    def prepared(strategy):
        recipe = load_recipe(path, [f"excess_length_strategy={strategy}"])
        return build_dataset(recipe, load_tokenizer(recipe))

    dropped = prepared("drop")
    assert dropped.stats["records"] == 17 and dropped.stats["dropped_too_long"] == 1
    assert dropped.stats["train"]["examples"] == 16
    cut = prepared("truncate")
    assert cut.stats["truncated"] == 1 and cut.stats["train"]["examples"] == 17
    assert max(len(ids) for ids in cut.train["prompt_ids"]) == 64 - 8  # sequence_len - max_completion_length
    with pytest.raises(DataError, match="over the 56 that sequence_len minus max_completion_length leaves"):
        prepared("error")


def test_a_prompt_ending_on_the_assistant_turn_is_refused_with_its_line(tmp_path, tiny_model_dir):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(DataError, match="line 1.*the prompt's last message is the assistant's"):
        _prepared(tmp_path, tiny_model_dir, datasets=[{"path": "bad.jsonl"}])


@pytest.mark.parametrize("group, micro, accumulation, processes, iterations", [
    (4, 4, 2, 1, 1), (4, 1, 4, 2, 1), (2, 3, 2, 2, 1), (8, 2, 4, 1, 2), (2, 2, 1, 3, 3)])
def test_every_process_gets_whole_groups_and_each_step_its_own_prompts(group, micro, accumulation, processes,
                                                                       iterations):
    """accelerate hands global micro batch k x processes + p to process p: each process's slots of a step must be
    whole groups of one prompt, every prompt of an epoch trained once (x iterations), none twice in a step."""
    from finetune.train.grpo.sampler import GroupSampler, StepShape

    shape = StepShape(group, micro, accumulation, processes, iterations)
    sampler = GroupSampler(23, shape, seed=3)
    slots = list(sampler)
    assert len(slots) == len(sampler) and len(slots) % (micro * accumulation * processes) == 0
    per_step = micro * accumulation * processes
    steps = [slots[i:i + per_step] for i in range(0, len(slots), per_step)]
    for n, step in enumerate(steps):
        batches = [step[i:i + micro] for i in range(0, len(step), micro)]
        lanes = [sum(batches[p::processes], []) for p in range(processes)]
        for lane in lanes:
            groups = [lane[i:i + group] for i in range(0, len(lane), group)]
            assert all(len(set(g)) == 1 and len(g) == group for g in groups)
        prompts = [lane[i] for lane in lanes for i in range(0, len(lane), group)]
        assert len(set(prompts)) == len(prompts)  # a prompt once per step
        if n % iterations:
            assert step == steps[n - 1]  # the same generation's prompts, mu times
    counts = Counter(slots)
    assert set(counts.values()) == {group * iterations}
    sampler.set_epoch(1)
    assert list(sampler) != slots and sorted(Counter(list(sampler)).values()) == sorted(counts.values())


def test_checkpoints_between_two_updates_of_one_generation_and_zero3_are_refused(tmp_path, tiny_model_dir):
    said = problems(tmp_path, tiny_model_dir, num_iterations=2, checkpoint_interval=3)
    assert "`checkpoint_interval` 3 is not a multiple of num_iterations 2" in said
    assert "does not run under DeepSpeed ZeRO-3" in problems(tmp_path, tiny_model_dir, deepspeed="zero3")


def test_a_broken_reward_is_refused_at_validate_before_any_model_loads(tmp_path, tiny_model_dir):
    said = problems(tmp_path, tiny_model_dir, rewards=[{"function": "rewards.py:nope"}])
    assert "`rewards.0`: reward `" in said and "has no `nope`" in said and "names_the_word" in said
    said = problems(tmp_path, tiny_model_dir, rewards=[{"function": "missing.py:f"}])
    assert "`rewards.0`" in said and "missing.py" in said


def test_preprocess_runs_every_reward_on_a_few_records_and_names_a_broken_one(tmp_path, tiny_model_dir, capsys):
    from finetune.cli import main

    path = grpo_recipe(tmp_path, tiny_model_dir)
    (tmp_path / "rewards.py").write_text((tmp_path / "rewards.py").read_text()
                                         + "\n\ndef wrong_length(completions, **kwargs):\n    return [1.0]\n")
    recipe = path.read_text().replace("rewards.py:names_the_word",
                                      "rewards.py:names_the_word\n- function: rewards.py:wrong_length")
    path.write_text(recipe)
    code = main(["preprocess", str(path), "--show", "1"])
    out = capsys.readouterr().out
    assert code == 2
    assert "columns for the rewards: {\"word\": " in out
    assert "reward names_the_word: ok [" in out
    assert "reward wrong_length: FAILED: wrong_length" in out


def test_prompts_from_a_parquet_file_with_map_keep_every_other_column(tmp_path, tiny_model_dir):
    import pandas as pd

    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    pd.DataFrame({"question": ["say cat", "say dog"], "word": ["cat", "dog"], "level": [1, 2]}).to_parquet(
        tmp_path / "q.parquet")
    recipe = load_recipe(grpo_recipe(tmp_path, tiny_model_dir, micro_batch_size=2, gradient_accumulation_steps=2,
                                     num_generations=2,
                                     datasets=[{"path": "q.parquet", "type": "prompt", "map": {"prompt": "question"}}]))
    prepared = build_dataset(recipe, load_tokenizer(recipe))
    assert [json.loads(r) for r in prepared.train["record"]] == [
        {"prompt": "say cat", "word": "cat", "level": 1}, {"prompt": "say dog", "word": "dog", "level": 2}]


def test_four_prompts_make_two_steps_of_two_prompts_x_8_completions(tmp_path, tiny_model_dir):
    """micro_batch_size counts completions: 8 x 2 accumulation = 16 completions = 2 prompts x G 8 per step, so 4
    prompts are 2 steps (not "16 examples per step, 4 prompts: too few")."""
    from finetune.train.settings import plan_numbers

    recipe, _, prepared = _prepared(tmp_path, tiny_model_dir, n=4, num_generations=8, micro_batch_size=8,
                                    gradient_accumulation_steps=2, max_steps=None)
    numbers = plan_numbers(recipe, prepared, 1)
    assert numbers["steps_per_epoch"] == 2 and numbers["train_rows"] == 4 * 8
    with pytest.raises(DataError, match="3 training prompts, but one optimizer step takes 4"):
        (tmp_path / "three").mkdir()
        recipe3, _, prepared3 = _prepared(tmp_path / "three", tiny_model_dir, n=3, num_generations=2,
                                          micro_batch_size=4, gradient_accumulation_steps=2)
        plan_numbers(recipe3, prepared3, 1)
