"""Vision-language fine-tuning end to end (issue 39): a tiny LLaVA with image chat records trains through
`finetune train`, LoRA only where the parts are not frozen, a full fine-tune leaving the frozen tower bit-identical,
the processor saved beside the result."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import write_jsonl
from tiny_vision import build_tiny_vlm, draw_images

COLOURS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}


def image_records(paths: dict[str, str], n: int) -> list[dict]:
    names = list(paths)
    return [{"messages": [{"role": "user", "content": [{"type": "image", "path": paths[names[i % 3]]},
                                                       {"type": "text", "text": "what colour is it"}]},
                          {"role": "assistant", "content": names[i % 3]}]} for i in range(n)]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    model = build_tiny_vlm("llava", root / "llava")
    paths = draw_images(root / "images", COLOURS)
    text_only = {"messages": [{"role": "user", "content": "say hello"}, {"role": "assistant", "content": "hello world"}]}
    data = write_jsonl(root / "data.jsonl", image_records(paths, 11) + [text_only])
    return model, data


def run_recipe(tmp_path, vlm, **overrides) -> dict:
    from finetune.cli import main

    model, data = vlm
    recipe = {"base_model": str(model), "datasets": [{"path": str(data), "type": "chat"}], "sequence_len": 64,
              "micro_batch_size": 4, "max_steps": 2, "learning_rate": 1e-2, "output_dir": str(tmp_path / "out"),
              "cache_dir": str(tmp_path / "cache"), "report_to": ["none"], "logging_steps": 1, **overrides}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    return json.loads((tmp_path / "out" / "run.json").read_text())


def test_lora_trains_the_language_model_and_projector_never_the_tower(tmp_path, vlm, capsys, caplog):
    from finetune.cli import main

    # batches grouped by length (the eval split too), the learning rate from the supervised tokens (image tokens apart)
    summary = run_recipe(tmp_path, vlm, adapter="lora", lora_r=4, lora_target_modules="all-linear", group_by_length=True,
                         val_set_size=2, learning_rate="auto", lr_base=1e-2, lr_pretrained_batch_tokens=1000)
    assert summary["learning_rate_plan"]["supervised_tokens"] == summary["data"]["train"]["supervised_tokens"]
    train = summary["data"]["train"]  # the step report counts image tokens apart from the supervised ones
    assert f"{train['supervised_tokens']:,} supervised, {train['image_tokens']:,} image tokens" in caplog.text
    assert " image) per optimizer step" in caplog.text
    # `finetune targets` says the same beforehand: the three parts, the tower frozen, all-linear's count
    capsys.readouterr()
    assert main(["targets", str(tmp_path / "recipe.yml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {p: v["frozen"] for p, v in report["parts"].items()} == {
        "vision_tower": True, "multi_modal_projector": False, "language_model": False}
    recipe_preset = next(p for p in report["presets"] if p["name"] == "recipe")
    assert recipe_preset["trainable_parameters"] == summary["trainable_parameters"]
    out = tmp_path / "out"
    targets = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert targets and not [t for t in targets if "vision_tower" in t]
    assert any("language_model" in t for t in targets) and any("multi_modal_projector" in t for t in targets)
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert all(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at zero: it trained
    # the processor is saved beside the adapter, and loads
    from transformers import AutoProcessor

    assert type(AutoProcessor.from_pretrained(out)).__name__ == "LlavaProcessor"
    data = summary["data"]
    # 11 image records (4 image tokens each: a 16 px crop in 8 px patches) and one text-only record, all kept
    assert data["records"] == 12 and data["train"]["examples"] + data["eval"]["examples"] == 12
    assert data["dropped_images"] == {}
    images = data["train"]["images"] + data["eval"]["images"]
    assert images in (10, 11) and data["train"]["image_tokens"] + data["eval"]["image_tokens"] == 4 * images
    assert summary["steps"] == 2


def test_full_finetune_leaves_the_frozen_tower_bit_identical(tmp_path, vlm):
    # packed rows too (LLaVA's positions allow it): the run's isolation probe passes and the images ride with their rows
    summary = run_recipe(tmp_path, vlm, adapter="none", sample_packing=True, sequence_len=128)
    assert summary["data"]["packing"]["train"]["examples"] == 12 and summary["data"]["packing"]["train"]["rows"] < 12
    base = load_file(str(vlm[0] / "model.safetensors"))
    trained = load_file(str(tmp_path / "out" / "model.safetensors"))
    tower = [k for k in base if "vision_tower" in k]
    assert tower and all(torch.equal(base[k], trained[k]) for k in tower)
    for part in ("multi_modal_projector", "language_model"):
        names = [k for k in base if part in k and "norm" not in k and "embed" not in k]
        assert names and all(not torch.equal(base[k], trained[k]) for k in names), part


def test_resume_continues_exactly(tmp_path, vlm):
    """2 steps, then 2 more resumed from the step-2 checkpoint (images reloaded, LoRA dropout's RNG restored): the same
    losses and adapter as 4 steps straight. A constant schedule, so a longer run is the same run continued."""
    keys = dict(adapter="lora", lora_r=4, lora_dropout=0.1, micro_batch_size=2, lr_scheduler="constant",
                checkpoint_interval=2, gradient_checkpointing="full", precision="fp32", compile=False)
    straight = run_recipe(tmp_path / "straight", vlm, max_steps=4, **keys)
    run_recipe(tmp_path / "resumed", vlm, max_steps=2, **keys)
    resumed = run_recipe(tmp_path / "resumed", vlm, max_steps=4, **keys)
    assert resumed["resumed_from"].endswith("step-2")
    losses = lambda summary: {e["step"]: e["loss"] for e in summary["log_history"] if "loss" in e}  # noqa: E731
    assert [losses(resumed)[s] for s in (3, 4)] == pytest.approx([losses(straight)[s] for s in (3, 4)], abs=1e-6)
    a = load_file(str(tmp_path / "straight" / "out" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "out" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
