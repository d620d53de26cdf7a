"""FSDP2 over 2 GPU processes against one process without it: the same losses (fp32, relative 1e-5), the same saved
LoRA adapter and full model (whole files, loadable by peft / transformers, not shards), and a SHARDED_STATE_DICT
checkpoint that resumes exactly. Needs 2 CUDA GPUs: on CPU accelerate runs no FSDP at all (tests/test_fsdp.py says
why), and one GPU cannot hold two NCCL ranks.

Same global batch as tests/test_distributed.py: one process micro batch 2 x accumulation 2, two processes 2 x 1 each
(`global_batch_size: 4`); dropout 0; fp32 with sdpa and no compile, so only the reduction order differs.
Run: python -m pytest tests/test_fsdp_gpu.py (on a machine with 2 GPUs; every test here skips elsewhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import make_records, write_jsonl
from finetune.recipe import load_recipe
from finetune.train.launch import free_port
from test_distributed import assert_same_losses, losses  # the DDP test's loss comparison, the same bar

WEIGHTS_ATOL = 1e-5
DRIVER = Path(__file__).with_name("multiproc_driver.py")
pytestmark = [pytest.mark.gpu, pytest.mark.multiproc,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP2 across 2 processes needs 2 CUDA GPUs")]

RUNS = {  # run name -> --set overrides, in order
    "lora": "output_dir=fsdp_lora,fsdp=true",
    "full": "output_dir=fsdp_full,fsdp=true,adapter=none,max_steps=2",
    # checkpoints of each process's shard; the final save is still the whole adapter
    "sharded_first_half": "output_dir=fsdp_sharded,fsdp.state_dict_type=SHARDED_STATE_DICT,max_steps=2",
    "sharded": "output_dir=fsdp_sharded,fsdp.state_dict_type=SHARDED_STATE_DICT",  # resumes from step 2
    "checkpointed": "output_dir=fsdp_ckpt,fsdp=true,gradient_checkpointing=full",  # FSDP's activation checkpointing
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    write_jsonl(root / "chat.jsonl", make_records("chat", 32))
    recipe = {
        "base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
        "sequence_len": 512, "micro_batch_size": 2, "global_batch_size": 4, "max_steps": 4,
        "learning_rate": 1e-3, "lr_scheduler": "constant", "logging_steps": 1, "adapter": "lora", "lora_r": 4,
        "lora_dropout": 0.0, "precision": "fp32", "attn_implementation": "sdpa", "compile": False,
        "output_dir": "single", "cache_dir": "cache", "report_to": ["none"],
    }
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def single(workdir) -> dict:
    """One process on one GPU, no FSDP: LoRA 4 steps, a full fine-tune 2 steps."""
    from finetune.train import run_training

    recipe = workdir / "recipe.yml"
    return {"lora": run_training(load_recipe(recipe, world_size=1)),
            "full": run_training(load_recipe(recipe, ["adapter=none", "max_steps=2", "output_dir=single_full"],
                                             world_size=1))}


@pytest.fixture(scope="module")
def multiproc(workdir, single) -> dict:
    results = workdir / "results"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(DRIVER), str(workdir / "recipe.yml"), str(results),
               *(f"{name}={overrides}" for name, overrides in RUNS.items())]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=workdir,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1")})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return {rank: json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def assert_same_tensors(saved: dict, reference: dict, atol: float) -> None:
    assert saved.keys() == reference.keys() and saved
    for name, tensor in saved.items():  # whole tensors, not a process's shard
        assert tensor.shape == reference[name].shape, name
        assert torch.allclose(tensor.float(), reference[name].float(), atol=atol), name


def test_fsdp2_lora_matches_one_process_and_saves_the_whole_adapter(multiproc, single, workdir, tiny_model_dir):
    for rank in (0, 1):
        assert "error" not in multiproc[rank]["lora"], multiproc[rank]["lora"]
        assert multiproc[rank]["lora"]["world_size"] == 2
        assert_same_losses(losses(multiproc[rank]["lora"]), losses(single["lora"]))
    saved = load_file(str(workdir / "fsdp_lora" / "adapter_model.safetensors"))
    assert_same_tensors(saved, load_file(str(workdir / "single" / "adapter_model.safetensors")), WEIGHTS_ATOL)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(workdir / "fsdp_lora"))


def test_fsdp2_full_finetune_matches_one_process_and_saves_the_whole_model(multiproc, single, workdir):
    assert_same_losses(losses(multiproc[0]["full"]), losses(single["full"]))
    saved = load_file(str(workdir / "fsdp_full" / "model.safetensors"))
    assert_same_tensors(saved, load_file(str(workdir / "single_full" / "model.safetensors")), 1e-4)

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(workdir / "fsdp_full")


def test_sharded_checkpoint_resumes_exactly_and_the_final_save_is_whole(multiproc, single, workdir):
    first, resumed = multiproc[0]["sharded_first_half"], multiproc[0]["sharded"]
    assert first["steps"] == 2 and resumed["resumed_from"].endswith("step-2")
    assert_same_losses(losses(resumed)[2:], losses(single["lora"])[2:])  # optimizer state came back
    shards = [p.name for p in (workdir / "fsdp_sharded" / "checkpoints").glob("step-*/*")]
    assert any(name.startswith("pytorch_model_fsdp") for name in shards), shards  # DCP shards, not a model
    saved = load_file(str(workdir / "fsdp_sharded" / "adapter_model.safetensors"))
    assert_same_tensors(saved, load_file(str(workdir / "single" / "adapter_model.safetensors")), WEIGHTS_ATOL)


def test_fsdp_activation_checkpointing_changes_no_number(multiproc, single):
    assert_same_losses(losses(multiproc[0]["checkpointed"]), losses(single["lora"]))
