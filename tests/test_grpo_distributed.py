"""Two gloo processes train the same GRPO update as one process: the step split over processes (each with whole
groups), the rewards, advantages and loss normalizer over the whole step, DDP's average undone by the loss scale.
Generation is replaced by a fixed function of each prompt (tests/grpo_ddp_driver.py): sampling depends on the batch
a process generates, which the split changes by design."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_helpers import grpo_recipe
from finetune.train.launch import free_port

DRIVER = Path(__file__).parent / "grpo_ddp_driver.py"
COMMON = ["adapter=none", "optimizer=sgd", "learning_rate=1.0", "lr_scheduler=constant", "max_steps=2",
          "num_generations=4", "micro_batch_size=4", "loss_type=dapo", "num_iterations=2",
          "rewards=[{function: rewards.py:even_tokens}]"]


@pytest.mark.multiproc
def test_two_processes_train_what_one_process_trains(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    sys.path.insert(0, str(DRIVER.parent))
    from grpo_ddp_driver import train

    recipe = grpo_recipe(tmp_path, tiny_model_dir)
    one = train(str(recipe), [*COMMON, "gradient_accumulation_steps=2", "output_dir=one", "cache_dir=one_cache"])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(DRIVER), str(recipe), str(tmp_path / "two.json"), *COMMON,
               "gradient_accumulation_steps=1", "output_dir=two", "cache_dir=two_cache"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2 and one["steps"] == two["steps"] == 2
    assert one["rewards"] == pytest.approx(two["rewards"], abs=1e-6)  # the same prompts, groups and rewards
    start, a, b = (load_file(str(p)) for p in (tiny_model_dir / "model.safetensors", tmp_path / "one" /
                                                "model.safetensors", tmp_path / "two" / "model.safetensors"))
    assert any(not torch.equal(start[n], a[n]) for n in a)
    for name, tensor in a.items():
        assert torch.allclose(tensor, b[name], atol=1e-5), name
