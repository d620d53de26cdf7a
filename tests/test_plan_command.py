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
