"""DPO on image pairs end to end (issue 39 item 5): `finetune train` on a tiny LLaVA, pairs packed with their prompt
(and its image) held once; step 1's loss is ln 2 (the policy is the reference), the reference log-probs are cached
and read again by the next run, and a resumed run continues exactly. `finetune preprocess --show` marks the image
tokens in the prompt."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import write_jsonl
from tiny_vision import build_tiny_vlm, draw_images

COLOURS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    root = tmp_path_factory.mktemp("vdpo")
    paths = draw_images(root / "images", COLOURS)
    names = list(paths)
    pairs = [{"images": [paths[names[i % 3]]], "prompt": [{"role": "user", "content": "<image>what colour is it"}],
              "chosen": [{"role": "assistant", "content": names[i % 3]}],
              "rejected": [{"role": "assistant", "content": f"{names[(i + 1) % 3]} I think"}]} for i in range(10)]
    pairs.append({"prompt": [{"role": "user", "content": "say hello"}],  # a text-only pair trains beside them
                  "chosen": [{"role": "assistant", "content": "hello"}], "rejected": [{"role": "assistant", "content": "no"}]})
    return build_tiny_vlm("llava", root / "llava"), write_jsonl(root / "pairs.jsonl", pairs), root / "cache"


def write_recipe(folder, vlm, **overrides):
    model, data, cache = vlm
    recipe = {"base_model": str(model), "method": "dpo", "datasets": [{"path": str(data), "type": "preference"}],
              "sequence_len": 64, "micro_batch_size": 2, "max_steps": 4, "learning_rate": 1e-2, "adapter": "lora",
              "lora_r": 4, "lora_dropout": 0.1, "lr_scheduler": "constant", "sample_packing": True,
              "checkpoint_interval": 2, "precision": "fp32", "output_dir": str(folder / "out"), "cache_dir": str(cache),
              "report_to": ["none"], "logging_steps": 1, "val_set_size": 0, **overrides}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe))
    return folder / "recipe.yml"


def train(folder, vlm, **overrides) -> dict:
    from finetune.cli import main

    assert main(["train", str(write_recipe(folder, vlm, **overrides))]) == 0
    return json.loads((folder / "out" / "run.json").read_text())


def losses(summary: dict) -> dict:
    return {e["step"]: e["loss"] for e in summary["log_history"] if "loss" in e}


def test_dpo_on_image_pairs_starts_at_ln2_caches_its_reference_and_resumes_exactly(tmp_path, vlm, caplog):
    """4 steps straight; then 2 steps and 2 more resumed from the step-2 checkpoint (the images reloaded, LoRA
    dropout's RNG restored): the same losses and adapter. A constant schedule: a longer run is the run continued."""
    straight = train(tmp_path / "straight", vlm)
    assert losses(straight)[1] == pytest.approx(math.log(2), abs=1e-6)  # the policy is the reference at step 1
    data = straight["data"]
    assert data["train"]["images"] == 10 and data["train"]["image_tokens"] == 2 * 4 * 10  # 4 a 16 px crop, per response
    assert straight["preference"]["shared_prompt"]  # packed pairs held their prompt (and its image) once
    assert "pairs sharing their prompt are isolated" in caplog.text
    table = straight["preference"]["reference_table"]
    caplog.clear()
    train(tmp_path / "resumed", vlm, max_steps=2)
    assert f"reference log-probs: read from {table}" in caplog.text  # the same data, images and model: not recomputed
    resumed = train(tmp_path / "resumed", vlm)
    assert resumed["resumed_from"].endswith("step-2")
    assert [losses(resumed)[s] for s in (3, 4)] == pytest.approx([losses(straight)[s] for s in (3, 4)], abs=1e-6)
    a = load_file(str(tmp_path / "straight" / "out" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "out" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)  # it trained


def test_preprocess_shows_where_a_pairs_image_tokens_sit(tmp_path, vlm, capsys):
    from finetune.cli import main

    assert main(["preprocess", str(write_recipe(tmp_path, vlm)), "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "image tokens (" in out and "<image>x4what colour is it" in out
    assert "[chosen]\n[[red<|im_end|>\n]]" in out
