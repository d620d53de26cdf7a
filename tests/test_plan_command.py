"""`finetune plan` from a model config folder and from a recipe."""

from __future__ import annotations

import re

from finetune.cli import main


def _config_dir(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32).save_pretrained(tmp_path / "llama7b")
    return tmp_path / "llama7b"


def test_plan_a_model_config_with_a_verdict(tmp_path, capsys):
    model = str(_config_dir(tmp_path))
    assert main(["plan", model, "--gpu", "rtx-4090", "--micro-batch-size", "4"]) == 1  # does not fit: exit 1
    out = capsys.readouterr().out
    assert "6.738B parameters" in out and "DOES NOT FIT" in out and "together:" in out
    assert re.search(r"weights\s+25\.10 GiB", out)  # 6,738,415,616 fp32 weights
    assert main(["plan", model, "--gpu", "rtx-4090", "--adapter", "qlora", "--gradient-checkpointing", "full"]) == 0
    assert "FITS" in capsys.readouterr().out


def test_plan_a_recipe_prints_the_exact_step_count(make_recipe, capsys):
    from finetune.plan.steps import optimizer_steps

    path = make_recipe("instruction", n=24, micro_batch_size=4, gradient_accumulation_steps=2, num_epochs=3)
    assert main(["plan", str(path), "--gpu-memory-gib", "8"]) == 0
    out = capsys.readouterr().out
    examples = int(re.search(r"([\d,]+) examples", out).group(1).replace(",", ""))
    steps = int(re.search(r"steps: ([\d,]+) optimizer steps", out).group(1))
    assert steps == optimizer_steps(examples, 4, 2, 1, 3, None) and "FITS" in out


def test_unknown_gpu_is_a_user_error(tmp_path, capsys):
    assert main(["plan", str(_config_dir(tmp_path)), "--gpu", "voodoo5"]) == 2
    assert "--gpu-memory-gib" in capsys.readouterr().err


def test_plan_and_lr_count_packed_rows_like_training(make_recipe, capsys):
    """With sample_packing the Trainer iterates packed rows: `plan` and `lr` must count steps from them."""
    import argparse

    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.commands.lr import _from_recipe
    from finetune.recipe_load import load_recipe
    from finetune.train.run import plan_numbers

    path = make_recipe("chat", n=40, sample_packing=True, sequence_len=256, micro_batch_size=2, num_epochs=2,
                       learning_rate="auto", lr_base=3e-4, lr_pretrained_batch_tokens=4_000_000)
    recipe = load_recipe(path)
    prepared = build_dataset(recipe, load_tokenizer(recipe))
    planned = plan_numbers(recipe, prepared, 1)["total_steps"]
    assert len(prepared.train) < 40 and planned == 2 * -(-len(prepared.train) // 2)  # rows, not examples
    assert main(["plan", str(path), "--gpu-memory-gib", "8"]) == 0
    out = capsys.readouterr().out
    assert f"steps: {planned:,} optimizer steps" in out and f"{len(prepared.train):,} packed rows (40 examples)" in out
    lr_plan = _from_recipe(argparse.Namespace(recipe=str(path), overrides=[], num_processes=None))
    assert lr_plan.total_steps == planned
