"""A vision-language run for use elsewhere (issue 39 item 7): `finetune merge` writes the whole model with its
processor, which transformers loads (AutoModelForImageTextToText + AutoProcessor) and which gives the adapter's logits
on an image prompt; `finetune export --gguf` writes the language model and llama.cpp's mmproj file (the tower and the
projector) for the families llama.cpp's converter maps, each read back; other families are one message."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import yaml

from conftest import write_jsonl
from tiny_vision import draw_images, tiny_vlm

NEEDS_TORCHVISION = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="Qwen2-VL's processor needs torchvision (its video processor)")
FAMILIES = ["llava", "idefics3", "gemma3", pytest.param("qwen2_vl", marks=NEEDS_TORCHVISION)]
COLOURS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return draw_images(tmp_path_factory.mktemp("export-images"), COLOURS, (40, 30))


def train_run(root, folder, family: str, images: dict, **keys):
    """A 2-step LoRA run of the family's tiny model (built in `root`) on colour records; returns its recipe."""
    from finetune.cli import main

    records = [{"messages": [{"role": "user", "content": [{"type": "image", "path": images[name]},
                                                          {"type": "text", "text": "what colour"}]},
                             {"role": "assistant", "content": name}]} for name in COLOURS] * 2
    data = write_jsonl(folder / "data.jsonl", records)
    recipe = {"base_model": str(tiny_vlm(family, root)), "datasets": [{"path": str(data), "type": "chat"}],
              "adapter": "lora", "lora_r": 4, "sequence_len": 128, "micro_batch_size": 3, "max_steps": 2,
              "learning_rate": 5e-2, "output_dir": str(folder / "out"), "cache_dir": str(folder / "cache"),
              "report_to": ["none"], **keys}
    path = folder / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, images):
    """family -> (recipe, merged folder): one LoRA run per family, merged once with `finetune merge`."""
    from finetune.cli import main

    root = tmp_path_factory.getbasetemp()  # tiny_vlm builds each family once per session here
    built = {}

    def get(family):
        if family not in built:
            recipe = train_run(root, tmp_path_factory.mktemp(f"run-{family}"), family, images)
            assert main(["merge", str(recipe)]) == 0
            built[family] = recipe, recipe.parent / "out" / "merged"
        return built[family]
    return get


def image_prompt(processor, image_path: str) -> dict:
    """The processor's inputs for one image question, rendered by the chat template the folder carries."""
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], images=[[Image.open(image_path).convert("RGB")]], return_tensors="pt")


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits.float()


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_vlm_loads_whole_and_gives_the_adapters_logits(runs, images, family):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from finetune.model.trained import load_adapter_model, locate

    recipe, merged_dir = runs(family)
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    processor = AutoProcessor.from_pretrained(merged_dir)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base_dir = yaml.safe_load(recipe.read_text())["base_model"]
    assert type(processor) is type(AutoProcessor.from_pretrained(base_dir))
    assert processor.chat_template and processor.tokenizer.chat_template  # the run's template, for chat tools
    inputs = image_prompt(processor, images["green"])
    assert "pixel_values" in inputs and (inputs["input_ids"] == merged.config.image_token_id).sum() > 0

    trained = locate(str(recipe))
    assert trained.vision  # the run finder knows a vision-language run from its base
    adapter_model, _ = load_adapter_model(trained)
    merged_logits, adapter_logits = logits(merged, inputs), logits(adapter_model.eval(), inputs)
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-5, atol=1e-5)
    # the adapter changed the model (a vacuous match would pass the line above too), and the image is read
    base = AutoModelForImageTextToText.from_pretrained(base_dir).eval()
    assert (merged_logits - logits(base, inputs)).abs().max() > 1e-3
    other = image_prompt(processor, images["red"])
    assert (logits(merged, other) - merged_logits).abs().max() > 0
