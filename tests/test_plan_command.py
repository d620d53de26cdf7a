"""`finetune plan` from a model config folder and from a recipe."""

from __future__ import annotations

import re

import pytest

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


@pytest.mark.parametrize("packed", [False, True])
def test_a_step_larger_than_the_training_split_is_refused_by_plan_and_train(make_recipe, tmp_path, capsys, packed):
    # micro_batch_size read as the global batch: 50 records ran as one step an epoch at 17.6 GiB peak, and plan
    # sized the step as if the rows existed
    path = make_recipe("instruction", n=12, micro_batch_size=8, gradient_accumulation_steps=2,
                       sample_packing=packed, val_set_size=0)
    for verb in ("plan", "train"):
        assert main([verb, str(path)]) == 2
        err = capsys.readouterr().err
        assert re.search(r"one optimizer step takes micro_batch_size 8 x gradient_accumulation_steps 2 = 16 "
                         rf"{'packed rows' if packed else 'examples'}, but the training split holds 12 examples: "
                         r"every epoch would be one short step", err), err
    assert not (tmp_path / "out").exists()
    # packed, a step of more rows than the examples pack into (but not more than the examples) is only said
    assert main(["plan", str(path), "--set", "gradient_accumulation_steps=1", "--set", "micro_batch_size=1"]) == 0
    assert "one short step" not in capsys.readouterr().err
    if packed:
        assert main(["plan", str(path), "--set", "micro_batch_size=12", "--set", "gradient_accumulation_steps=1"]) == 0
        assert re.search(r"warning: one optimizer step takes .* = 12 packed rows and the training split packs into "
                         r"\d+: each epoch is one step", capsys.readouterr().err)


def test_unknown_gpu_is_a_user_error(tmp_path, capsys):
    assert main(["plan", str(_config_dir(tmp_path)), "--gpu", "voodoo5"]) == 2
    assert "--gpu-memory-gib" in capsys.readouterr().err


def test_plan_and_lr_count_packed_rows_like_training(make_recipe, capsys):
    """With sample_packing the Trainer iterates packed rows: `plan` and `lr` must count steps from them."""
    import argparse

    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.commands.lr import _from_recipe
    from finetune.recipe import load_recipe
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


# --- precision: auto resolves per GPU as training resolves it (issue 14 item 9) ----------------------------


def _planned_precision(out: str) -> str:
    return re.search(r"setup: adapter \w+, (\w+)", out).group(1)


def test_plan_resolves_auto_precision_per_gpu_like_training(tmp_path, capsys):
    """T4 (Turing) has no bf16 tensor cores: a run there trains in fp16, so the plan must count fp16."""
    model = str(_config_dir(tmp_path))
    recipe = tmp_path / "r.yml"
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a b c"}\n')
    recipe.write_text(f"base_model: {model}\ndatasets: [{{path: {data}}}]\nadapter: qlora\nprecision: auto\n"
                      "gradient_checkpointing: full\nsequence_len: 512\n")
    main(["plan", str(recipe), "--gpu", "t4", "--no-data"])
    t4 = capsys.readouterr().out
    main(["plan", str(recipe), "--gpu", "a100", "--no-data"])
    a100 = capsys.readouterr().out
    assert _planned_precision(t4) == "fp16" and "auto on t4" in t4
    assert _planned_precision(a100) == "bf16"
    # the numbers are the fp16 plan's, not a bf16 plan relabelled
    main(["plan", str(recipe), "--gpu", "t4", "--no-data", "--precision", "fp16"])
    explicit = capsys.readouterr().out
    assert t4.split("per-GPU memory:")[1] == explicit.split("per-GPU memory:")[1]


def test_explicit_bf16_on_a_t4_is_warned(tmp_path, capsys):
    main(["plan", str(_config_dir(tmp_path)), "--gpu", "t4", "--precision", "bf16", "--adapter", "qlora"])
    assert "t4 has no bf16 tensor cores" in capsys.readouterr().out


@pytest.mark.parametrize("capability,expected", [((7, 5), "fp16"), ((7, 0), "fp16"), ((8, 0), "bf16"),
                                                 ((9, 0), "bf16")])
def test_training_resolves_auto_by_the_same_rule(monkeypatch, capability, expected):
    """The live-device side: a T4 (sm_75) can build bf16 tensors, so torch's default is_bf16_supported() says
    True there (emulation); training must still pick fp16, as the GPU table and the plan do. The device is read
    once (training_device) from torch's capability, faked here."""
    import torch

    from finetune.model import resolve_precision
    from finetune.model.device import training_device
    from finetune.plan.gpus import GPUS
    from finetune.plan.precision import resolve_precision as rule

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "a faked GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulation works on sm_75
    device = training_device()
    assert device.cuda and device.capability == capability
    assert resolve_precision(type("R", (), {"precision": "auto"})()) == expected
    assert resolve_precision(type("R", (), {"precision": "auto"})(), device) == expected
    gpu = {(7, 5): "t4", (8, 0): "a100-80gb", (9, 0): "h100-sxm"}.get(capability)
    if gpu:
        assert rule("auto", True, GPUS[gpu].native_bf16) == expected
