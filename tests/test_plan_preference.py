"""`finetune plan` for preference methods: both sequences of every pair in the micro batch, no reference weights,
and the exact step count from the pairs (KTO: two examples per pair), checked against a real DPO run."""

from __future__ import annotations

import random
import re

import pytest
import yaml

from conftest import sentence, write_jsonl
from finetune.cli import main
from finetune.plan.budget import PlanInputs, plan_memory


def _pairs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": sentence(rng)}],
             "chosen": [{"role": "assistant", "content": f"yes {sentence(rng)}"}],
             "rejected": [{"role": "assistant", "content": f"no {sentence(rng)}"}]} for _ in range(n)]


def _dpo_recipe(tmp_path, tiny_model_dir, n=24, **overrides):
    write_jsonl(tmp_path / "pairs.jsonl", _pairs(n))
    recipe = {"base_model": str(tiny_model_dir), "method": "dpo",
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}], "sequence_len": 128,
              "micro_batch_size": 4, "gradient_accumulation_steps": 2, "num_epochs": 3, "learning_rate": 1e-3,
              "logging_steps": 1, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"],
              "max_checkpoints": 1, "precision": "fp32"}
    recipe.update(overrides)
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _llama7b():
    from transformers import LlamaConfig

    from finetune.plan.model_size import count_model

    config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32)
    return count_model(config, lora_r=16)


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_a_micro_batch_of_pairs_holds_twice_the_sequences(adapter):
    shape, full, lora = _llama7b()
    common = dict(adapter=adapter, precision="bf16", seq_len=1024)
    sft = plan_memory(PlanInputs(shape, full, lora, micro_batch_size=8, **common))
    pairs = plan_memory(PlanInputs(shape, full, lora, micro_batch_size=4, sequences_per_item=2, **common))
    single = plan_memory(PlanInputs(shape, full, lora, micro_batch_size=4, **common))
    # 4 pairs are 8 sequences: the activations of 8 SFT examples, twice those of 4; the model states are the
    # same (no second model: the reference log-probs are precomputed)
    assert pairs.components["activations"] == sft.components["activations"] == 2 * single.components["activations"]
    assert pairs.model_states == single.model_states


def test_packed_pairs_are_rows_of_twice_the_sequence_length():
    shape, full, lora = _llama7b()
    common = dict(adapter="lora", precision="bf16", sequences_per_item=2, micro_batch_size=2, attn="eager")
    packed = PlanInputs(shape, full, lora, seq_len=1024, packed=True, **common)
    assert packed.micro_batch_rows() == (2, 2048)
    assert PlanInputs(shape, full, lora, seq_len=1024, **common).micro_batch_rows() == (4, 1024)
    # eager attention keeps a row x row probability matrix: a packed row of 2048 tokens is what it sees
    as_sft = PlanInputs(shape, full, lora, adapter="lora", precision="bf16", micro_batch_size=2, seq_len=2048,
                        attn="eager")
    assert plan_memory(packed).components["activations"] == plan_memory(as_sft).components["activations"]


def _activations_gib(out: str) -> float:
    return float(re.search(r"activations\s+([\d.]+) GiB", out).group(1))


def test_plan_a_dpo_recipe(tmp_path, tiny_model_dir, capsys):
    from finetune.plan.steps import optimizer_steps

    path = str(_dpo_recipe(tmp_path, tiny_model_dir, sequence_len=4096, micro_batch_size=4))
    assert main(["plan", path, "--gpu-memory-gib", "8"]) == 0
    out = capsys.readouterr().out
    assert "4 pair(s) x 2 sequences x 4096 tokens per micro batch (8 sequences)" in out and "method dpo" in out
    assert "reference: no reference weights in memory" in out and "computed once before training" in out
    pairs = int(re.search(r"([\d,]+) pairs \(2 sequences each\)", out).group(1))
    steps = int(re.search(r"steps: ([\d,]+) optimizer steps", out).group(1))
    assert pairs == 24 and steps == optimizer_steps(24, 4, 2, 1, 3, None) == 9
    # the same knobs as SFT: half the activations (4 sequences, not 8)
    assert main(["plan", path, "--gpu-memory-gib", "8", "--method", "sft", "--no-data"]) == 0
    sft = capsys.readouterr().out
    assert "reference:" not in sft and "4 x 4096 tokens per micro batch" in sft
    assert _activations_gib(out) == pytest.approx(2 * _activations_gib(sft), rel=0.02)


def test_kto_from_pairs_counts_two_examples_per_pair(tmp_path, tiny_model_dir):
    from finetune.commands.plan import _steps_line
    from finetune.plan.steps import optimizer_steps
    from finetune.recipe import load_recipe

    dpo = load_recipe(_dpo_recipe(tmp_path, tiny_model_dir))
    # KTO's loss is not wired into the trainer yet (the recipe refuses it); its data and step count are
    kto = dpo.model_copy(update={"method": "kto"})
    line = _steps_line(kto, 1)
    assert "48 KTO examples (24 desirable, 24 undesirable" in line
    assert line.startswith(f"steps: {optimizer_steps(48, 4, 2, 1, 3, None)} optimizer steps") and "18" in line
    assert _steps_line(dpo, 1).startswith("steps: 9 optimizer steps")


def test_planned_steps_and_memory_are_the_dpo_runs(tmp_path, tiny_model_dir, capsys):
    """Packed pairs: the plan's step count is the Trainer's, and run.json's planned memory counts 2 sequences."""
    from finetune.plan.run_memory import planned_memory, recipe_shape
    from finetune.recipe import load_recipe
    from finetune.train.run import run_training

    path = _dpo_recipe(tmp_path, tiny_model_dir, n=20, sample_packing=True, micro_batch_size=2, num_epochs=1,
                       gradient_accumulation_steps=1, adapter="lora", lora_dropout=0.0)
    assert main(["plan", str(path), "--no-data"]) == 0 and "packed row(s) of 2 x 128" in capsys.readouterr().out
    main(["plan", str(path)])
    planned = int(re.search(r"steps: ([\d,]+) optimizer steps", capsys.readouterr().out).group(1))
    recipe = load_recipe(path)
    assert recipe_shape(recipe) == {"sequences_per_item": 2, "packed": True}
    summary = run_training(recipe)
    assert summary["steps"] == planned
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    dpo = planned_memory(recipe, config, "fp32", "sdpa", "adamw_torch", 1)
    sft = planned_memory(recipe.model_copy(update={"method": "sft"}), config, "fp32", "sdpa", "adamw_torch", 1)
    assert dpo["peak_allocated_gib"] > sft["peak_allocated_gib"]
