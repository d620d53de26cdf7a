"""`learning_rate: auto` for preference methods and GRPO: each method's published default (full fine-tune, adapters)
with its sources, shown by `finetune lr`; the SFT formula stays SFT's."""

from __future__ import annotations

import pytest

from finetune.cli import main
from finetune.errors import RecipeError
from finetune.plan.lr_preference import METHOD_LRS
from finetune.recipe import load_recipe
from finetune.recipe.methods import PREFERENCE_METHODS
from grpo_helpers import grpo_recipe
from test_plan_preference import _dpo_recipe


def test_every_preference_method_has_sourced_defaults():
    assert set(METHOD_LRS) == set(PREFERENCE_METHODS) | {"grpo", "reward"}
    for row in METHOD_LRS.values():
        assert row.full_source and row.lora_source and row.usual
        assert row.lora == pytest.approx(10 * row.full)  # LoRA's optimum ~10x full fine-tuning's
        assert 1e-7 <= row.full <= 1e-5  # far below SFT's usual 1e-5..2e-4
    assert METHOD_LRS["dpo"].full == 5e-7 and METHOD_LRS["dpo"].lora == 5e-6
    assert "Zephyr" in METHOD_LRS["dpo"].full_source and "Tulu 3" in METHOD_LRS["dpo"].full_source
    assert METHOD_LRS["orpo"].full == 8e-6 and "SimPO" in METHOD_LRS["simpo"].full_source
    # TRL 1.16's GRPOConfig default, read from the installed package: the figure the source names
    from trl import GRPOConfig

    assert METHOD_LRS["grpo"].full == GRPOConfig.__dataclass_fields__["learning_rate"].default == 1e-6
    assert "GRPOConfig" in METHOD_LRS["grpo"].full_source and "LoRA Without Regret" in METHOD_LRS["grpo"].lora_source


@pytest.mark.parametrize("adapter,expected", [("none", 5e-7), ("lora", 5e-6)])
def test_auto_resolves_to_the_methods_default_not_the_sft_formula(tmp_path, tiny_model_dir, adapter, expected):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.train.settings import resolve

    recipe = load_recipe(_dpo_recipe(tmp_path, tiny_model_dir, learning_rate="auto", adapter=adapter))
    prepared = build_dataset(recipe, load_tokenizer(recipe))
    lr, plan = resolve_learning_rate(recipe, prepared.train_counts())
    assert lr == expected and plan.method == "dpo" and "default" in plan.describe()
    settings = resolve(recipe, prepared, 1, cuda=False)  # what the run trains with and run.json records
    record = settings.record()
    assert settings.learning_rate == expected and record["learning_rate_plan"]["learning_rate"] == expected
    assert record["learning_rate_plan"]["source"] == plan.source
    # the same recipe as SFT still takes the formula (here: no family row for the tiny model, so it cannot)
    with pytest.raises(RecipeError, match="lr_base"):
        resolve_learning_rate(recipe.model_copy(update={"method": "sft"}), prepared.train_counts())


def test_lr_on_a_dpo_recipe_shows_the_defaults_with_sources(tmp_path, tiny_model_dir, capsys):
    path = str(_dpo_recipe(tmp_path, tiny_model_dir, learning_rate="auto", adapter="lora"))
    assert main(["lr", path]) == 0
    out = capsys.readouterr().out
    assert "training pairs             24" in out and "optimizer steps            9 over 3 epoch(s)" in out
    assert "dpo default, full FT       5.00e-7   (Zephyr" in out and "dpo default, LoRA          5.00e-6" in out
    assert "training uses 5.00e-6, the LoRA default" in out and "formula, full fine-tune" not in out
    assert main(["lr", path, "--set", "learning_rate=1e-5", "--family", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert "1.00e-5   (recipe `learning_rate`; 2x the LoRA default; training uses this)" in out
    assert "ignored" in out


def test_lr_method_flag_prints_the_table_row(capsys):
    assert main(["lr", "--method", "kto"]) == 0
    out = capsys.readouterr().out
    assert "kto full fine-tune   5.00e-7" in out and "TRL KTO guide" in out and "5e-7 to 5e-6" in out


def test_sft_formula_inputs_under_a_preference_method_are_refused(tmp_path, tiny_model_dir):
    with pytest.raises(RecipeError, match="`lr_base` feeds the SFT learning-rate formula"):
        load_recipe(_dpo_recipe(tmp_path, tiny_model_dir, learning_rate="auto", lr_base=3e-4))


@pytest.mark.parametrize("adapter,expected", [("none", 1e-6), ("lora", 1e-5)])
def test_grpo_auto_resolves_to_its_published_default(tmp_path, tiny_model_dir, adapter, expected):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.train.settings import resolve

    recipe = load_recipe(grpo_recipe(tmp_path, tiny_model_dir, learning_rate="auto", adapter=adapter))
    prepared = build_dataset(recipe, load_tokenizer(recipe))
    settings = resolve(recipe, prepared, 1, cuda=False)  # what the run trains with and run.json records
    assert settings.learning_rate == expected
    plan = settings.record()["learning_rate_plan"]
    assert plan["method"] == "grpo" and plan["learning_rate"] == expected and "TRL" in plan["source"]


def test_lr_on_a_grpo_recipe_counts_prompts_and_shows_the_defaults(tmp_path, tiny_model_dir, capsys):
    path = str(grpo_recipe(tmp_path, tiny_model_dir, learning_rate="auto", max_steps=None, num_epochs=2))
    assert main(["lr", path]) == 0
    out = capsys.readouterr().out
    # 16 prompts; micro_batch_size 4 x accumulation 2 = 8 completions = 2 prompts of G 4 a step: 8 steps an epoch
    assert "training prompts           16" in out
    assert "optimizer steps            16 over 2 epoch(s)   (2 prompts per step: micro_batch_size 4" in out
    assert "grpo default, full FT      1.00e-6   (TRL's GRPOConfig default" in out
    assert "grpo default, LoRA         1.00e-5" in out and "training uses 1.00e-5, the LoRA default" in out
    assert "not a policy-gradient loss's" in out
    assert main(["lr", "--method", "grpo"]) == 0
    assert "grpo full fine-tune   1.00e-6" in capsys.readouterr().out
