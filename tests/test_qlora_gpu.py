"""QLoRA on CUDA: the 4-bit base lives on the GPU, paged optimizers page, and the peak memory is recorded
(printed and written to output_dir/gpu_memory.json, to be copied into docs/lora.md)."""

from __future__ import annotations

import json

import pytest
import torch

from finetune.recipe import load_recipe
from finetune.train import run_training

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("gradient_checkpointing", ["off", "mlp", "full"])
def test_qlora_trains_on_cuda_and_records_peak_memory(make_recipe, tmp_path, capfd, gradient_checkpointing):
    recipe = load_recipe(make_recipe("chat", n=32, adapter="qlora", lora_r=8, max_steps=4,
                                     optimizer="paged_adamw_8bit", gradient_checkpointing=gradient_checkpointing))
    torch.cuda.reset_peak_memory_stats()
    summary = run_training(recipe)
    peak = torch.cuda.max_memory_allocated()
    err = capfd.readouterr().err
    assert summary["steps"] == 4 and summary["precision"] in ("bf16", "fp16")
    assert "paging needs CUDA" not in err and "4-bit NF4" in err
    record = {"device": torch.cuda.get_device_name(), "gradient_checkpointing": gradient_checkpointing,
              "peak_allocated_bytes": peak, "trainable_parameters": summary["trainable_parameters"]}
    (tmp_path / "out" / "gpu_memory.json").write_text(json.dumps(record))
    print(f"QLoRA tiny model on {record['device']}, checkpointing {gradient_checkpointing}: "
          f"peak {peak / 2**20:.1f} MiB")


def test_a_qlora_reward_model_trains_on_cuda_and_saves_its_head(tmp_path, tiny_model_dir):
    """QLoRA for `method: reward`: the sequence-classification class on a 4-bit base, its score head trained in full
    and saved with the adapter; reloaded (its base unquantized, as evaluation reads a QLoRA run) it ranks the
    held-out pairs as training's last eval did."""
    from finetune.evaluation.run import evaluate
    from reward_helpers import reward_recipe

    recipe = load_recipe(reward_recipe(tmp_path, tiny_model_dir, adapter="qlora", lora_r=8, num_epochs=3,
                                       precision="auto", sample_packing=True, micro_batch_size=2))
    summary = run_training(recipe)
    last = [e for e in summary["log_history"] if "eval_accuracy" in e][-1]
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and "score" in config["modules_to_save"]
    report = evaluate(str(tmp_path / "out"), changes={"generations": 0})
    assert abs(report["reward"]["sides"]["tuned"]["accuracy"] - last["eval_accuracy"]) <= 0.125
