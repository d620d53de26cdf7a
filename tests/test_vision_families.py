"""Each vision-language family through finetune's model stage and collator (issue 39 items 2 and 4): a batch of image
rows and a text-only row goes forward and backward, gradients reach exactly the parts that train (never the frozen
tower), and the model generates from an image; full fine-tune, LoRA, DoRA and QLoRA; gradient checkpointing gives
the same gradients."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import write_jsonl
from tiny_vision import draw_images, tiny_vlm

NEEDS_TORCHVISION = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="Qwen2-VL's processor needs torchvision (its video processor)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    paths = draw_images(root / "family-images", {"red": (230, 20, 20), "blue": (30, 40, 220)}, (60, 40))
    chats = [{"messages": [{"role": "user", "content": [{"type": "image", "path": paths[c]},
                                                        {"type": "text", "text": "what colour"}]},
                           {"role": "assistant", "content": c}]} for c in ("red", "blue")]
    chats.append({"messages": [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"}]})
    return root, write_jsonl(root / "family.jsonl", chats)


def batch_and_model(data, tmp_path, family, **keys):
    from finetune.data import build_dataset
    from finetune.data.collate import Collator
    from finetune.data.vision.collate import VisionCollator
    from finetune.model import build_model
    from finetune.model.vision import tokenizer_and_processor
    from finetune.recipe import recipe_from_dict

    root, records = data
    recipe = recipe_from_dict({"base_model": str(tiny_vlm(family, root)), "cache_dir": str(tmp_path),
                               "datasets": [{"path": str(records), "type": "chat"}], "lora_r": 4, **keys}, tmp_path)
    tokenizer, processor = tokenizer_and_processor(recipe)
    rows = build_dataset(recipe, tokenizer, processor).train
    torch.manual_seed(0)
    model, _ = build_model(recipe, tokenizer)
    collator = VisionCollator(Collator(tokenizer.pad_token_id), processor, recipe.image_max_pixels)
    return collator([rows[i] for i in range(len(rows))]), model


def tower_names(model) -> list[str]:
    """The tower's parameters, named as model.named_parameters() names them (under a PEFT wrapper too)."""
    from finetune.model import base_causal_lm
    from finetune.model.vision import vision_parts

    base = base_causal_lm(model)
    parts = vision_parts(base)
    tower = {id(p) for n, p in base.named_parameters() if parts.part_of(n) == "vision_tower"}
    return [n for n, p in model.named_parameters() if id(p) in tower]


MATRIX = [("llava", "lora"), ("idefics3", "lora"), ("gemma3", "lora"), pytest.param("qwen2_vl", "lora",
                                                                                       marks=NEEDS_TORCHVISION),
          ("llava", "none"), ("idefics3", "none"), ("gemma3", "none"), pytest.param("qwen2_vl", "none",
                                                                                   marks=NEEDS_TORCHVISION),
          ("idefics3", "dora"), ("llava", "qlora")]


@pytest.mark.parametrize("family,adapter", MATRIX)
def test_forward_backward_generate(data, tmp_path, family, adapter):
    keys = {"adapter": "lora", "peft_use_dora": True} if adapter == "dora" else {"adapter": adapter}
    if adapter == "qlora":
        pytest.importorskip("bitsandbytes")
    batch, model = batch_and_model(data, tmp_path, family, **keys)
    assert "pixel_values" in batch and batch["input_ids"].shape[0] == 3  # two image rows and a text-only row
    model.train()
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    tower = set(tower_names(model))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert tower and not tower & trained  # the frozen tower: no gradients, no adapters
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trained)
    if adapter != "none":
        assert trained and all("lora_" in n for n in trained)
    if adapter == "qlora":  # the language model in 4 bits, the tower and projector as they are
        kinds = {n: type(m).__name__ for n, m in model.named_modules()}
        assert any(k == "Linear4bit" and "language_model" in n for n, k in kinds.items())
        assert not any(k == "Linear4bit" and ("vision_tower" in n or "projector" in n) for n, k in kinds.items())
    # generation reads the image: greedy continuation of the first row's prompt with its pixels
    model.eval()
    prompt = {k: v[:1] for k, v in batch.items() if k not in ("labels", "pixel_values", "pixel_attention_mask",
                                                               "image_grid_thw")}
    pixels = {k: v[:1] if k != "image_grid_thw" else v[:1] for k, v in batch.items()
              if k in ("pixel_values", "pixel_attention_mask", "image_grid_thw")}
    with torch.no_grad():
        out = model.generate(**prompt, **pixels, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 3


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_gradient_checkpointing_gives_the_same_gradients(data, tmp_path, family):
    batch, model = batch_and_model(data, tmp_path, family, adapter="lora", lora_dropout=0.0)
    model.train()

    def gradients():
        model.zero_grad()
        model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain = gradients()
    # what the Trainer switches on for `gradient_checkpointing: full` (train/arguments.py: activation_checkpointing)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = gradients()
    assert plain.keys() == checkpointed.keys()
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-6) for n in plain)
    assert any(g.abs().sum() > 0 for g in checkpointed.values())


def summed_loss(model, batch) -> float:
    """Cross-entropy summed over the supervised next tokens (independent of how rows are batched)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs).logits.float()
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                             reduction="sum").item()


@pytest.mark.parametrize("family", ["llava", "idefics3", "smolvlm"])
def test_packed_rows_with_images_give_the_loss_of_the_rows_alone(data, tmp_path, family):
    """sample_packing where the family's positions allow it: one packed row of two image chats and a text chat
    (images in their order in the row) scores every supervised token as the unpacked rows do."""
    from transformers import AutoConfig

    from finetune.model.families import generic_path
    from finetune.recipe import recipe_from_dict

    recipe = recipe_from_dict({"base_model": str(tiny_vlm(family, data[0])), "cache_dir": str(tmp_path),
                               "datasets": [{"path": str(data[1]), "type": "chat"}], "sample_packing": True}, tmp_path)
    config = AutoConfig.from_pretrained(recipe.base_model)
    assert generic_path(recipe, config).sample_packing is True  # the family table keeps it: train packs these rows
    unpacked, model = batch_and_model(data, tmp_path, family, adapter="none", sequence_len=256)
    packed, _ = batch_and_model(data, tmp_path, family, adapter="none", sequence_len=256, sample_packing=True)
    assert packed["input_ids"].shape[0] == 1 and "position_ids" in packed and "attention_mask" not in packed
    model.eval()
    assert summed_loss(model, packed) == pytest.approx(summed_loss(model, unpacked), rel=1e-5)


@pytest.mark.parametrize("family,why", [("gemma3", "both ways"), ("qwen2_vl", "mrope")])
def test_packing_is_refused_where_positions_or_masks_do_not_allow_it(data, tmp_path, family, why):
    """The family table says where packing trains (finetune/model/families.py); the run asks it before anything loads."""
    from transformers import AutoConfig

    from finetune.errors import ModelError
    from finetune.model.families import generic_path
    from finetune.recipe import recipe_from_dict

    from tiny_vision import qwen2_vl_config

    # the config alone: Qwen2-VL's processor needs torchvision, its config does not
    config = qwen2_vl_config() if family == "qwen2_vl" else AutoConfig.from_pretrained(tiny_vlm(family, data[0]))
    recipe = recipe_from_dict({"base_model": str(tiny_vlm("llava", data[0])), "cache_dir": str(tmp_path),
                               "datasets": [{"path": str(data[1]), "type": "chat"}], "sample_packing": True}, tmp_path)
    with pytest.raises(ModelError, match=why):
        generic_path(recipe, config)
    assert generic_path(recipe.model_copy(update={"sample_packing": False}), config).sample_packing is False


def test_freeze_keys_decide_where_lora_goes_and_what_a_full_finetune_trains(data):
    from types import SimpleNamespace

    from transformers import AutoConfig

    from finetune.errors import ModelError
    from finetune.model.targets import meta_model
    from finetune.model.vision import freeze_parts, lora_target_names

    model = meta_model(AutoConfig.from_pretrained(tiny_vlm("llava", data[0])))
    keys = lambda targets="all-linear", **freeze: SimpleNamespace(**{  # noqa: E731
        "lora_target_modules": targets, "freeze_vision_tower": True, "freeze_multi_modal_projector": False,
        "freeze_language_model": False, **freeze})
    default = lora_target_names(model, keys())
    assert not [n for n in default if "vision_tower" in n] and "lm_head" not in default
    assert {n.split(".")[1] for n in default} == {"multi_modal_projector", "language_model"}
    tower_too = lora_target_names(model, keys(freeze_vision_tower=False))
    assert [n for n in tower_too if "vision_tower" in n] and set(default) < set(tower_too)
    # a list of names matches inside the unfrozen parts only: CLIP's q_proj stays frozen
    assert all("language_model" in n for n in lora_target_names(model, keys(["q_proj"])))
    only_tower = lora_target_names(model, keys(freeze_vision_tower=False, freeze_multi_modal_projector=True,
                                               freeze_language_model=True))
    assert only_tower and all("vision_tower" in n for n in only_tower)
    with pytest.raises(ModelError, match="match no layer outside the frozen parts"):
        lora_target_names(model, keys(["q_proj"], freeze_language_model=True))
    with pytest.raises(ModelError, match="nothing would train"):
        freeze_parts(model, keys(freeze_multi_modal_projector=True, freeze_language_model=True))
    freeze_parts(model, keys(freeze_language_model=True))
    trained = {n.split(".")[1] for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {"multi_modal_projector"}


def test_the_three_parts_are_found_from_structure_in_every_family(data):
    """Qwen2-VL keeps its projector (the patch merger) inside the tower: the merger is the projector, trains by
    default, and the tower's blocks stay frozen. Config only (meta tensors): no processor, no torchvision."""
    from transformers import AutoConfig

    from finetune.model.targets import meta_model
    from finetune.model.vision import lora_target_names, vision_parts
    from tiny_vision import qwen2_vl_config

    expected = {"llava": ("model.vision_tower", ["model.multi_modal_projector"], "model.language_model"),
                "idefics3": ("model.vision_model", ["model.connector"], "model.text_model"),
                "smolvlm": ("model.vision_model", ["model.connector"], "model.text_model"),
                "gemma3": ("model.vision_tower", ["model.multi_modal_projector"], "model.language_model"),
                "qwen2_vl": ("model.visual", ["model.visual.merger"], "model.language_model")}
    for family, (tower, projector, language) in expected.items():
        config = qwen2_vl_config() if family == "qwen2_vl" else AutoConfig.from_pretrained(tiny_vlm(family, data[0]))
        model = meta_model(config)
        parts = vision_parts(model)
        assert (parts.vision_tower, parts.multi_modal_projector, parts.language_model) == \
            ([tower], projector, [language, "lm_head"]), family
    targets = lora_target_names(model, type("Keys", (), {"lora_target_modules": "all-linear",
                                                         "freeze_vision_tower": True,
                                                         "freeze_multi_modal_projector": False,
                                                         "freeze_language_model": False})())
    assert any(t.startswith("model.visual.merger.") for t in targets)
    assert not any(t.startswith("model.visual.blocks.") for t in targets)
