"""Porting axolotl's vision-language recipes (issue 39 item 8): its multimodal examples port with every key accounted
for, the layers they adapt are the layers axolotl adapts (peft reading axolotl's own regex on a tiny VLM is the
oracle), what a full fine-tune trains carries over, and a multimodal key finetune has no equivalent for is kept for a
decision with its reason (exit 1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from finetune.cli import main
from test_port import _accounted_for, _flat

ASSETS = Path(__file__).parent / "assets" / "axolotl" / "multimodal"
EXAMPLES = sorted(p.name for p in ASSETS.glob("*.y*ml"))
# each example's keys that finetune cannot honour (kept for a decision, exit 1)
DECISIONS = {"gemma-3-4b-vision-qlora.yml": {"eot_tokens"}, "gemma4-e2b-vision-lora.yaml": {"eot_tokens"}}
VISION_DROPPED = {"processor_type": "finetune loads the model's processor (AutoProcessor)",
                  "skip_prepare_dataset": "finetune tokenizes image records with the processor once",
                  "remove_unused_columns": "finetune's rows keep the images their collator reads"}


def port(source: Path, out: Path, *overrides: str) -> int:
    flags = [a for o in overrides for a in (("--set", o) if "=" in o else (o,))]
    return main(["port", str(source), "-o", str(out), *flags])


@pytest.mark.parametrize("name", EXAMPLES)
def test_multimodal_example_ports_with_every_key_accounted_for(name, tmp_path, capsys):
    from finetune.recipe import recipe_from_dict

    assert len(EXAMPLES) >= 5
    source = yaml.safe_load((ASSETS / name).read_text())
    out = tmp_path / "recipe.yml"
    decisions = DECISIONS.get(name, set())
    assert port(ASSETS / name, out) == (1 if decisions else 0)
    text = out.read_text()
    recipe = yaml.safe_load(text)
    assert not [k for k in source if not _accounted_for(k, text, recipe)]
    flat = _flat(text)
    for key, why in VISION_DROPPED.items():  # each with what finetune does instead, not "not in the table"
        assert re.search(rf"^# {key}: .*\^ dropped, not needed: {re.escape(why)}", flat, re.M), key
    assert "a preference-tuning key" not in flat
    assert {k for k in recipe if "NEEDS YOUR DECISION" in "".join(_comments_of(text, k))} == decisions
    settled = recipe_from_dict({k: v for k, v in recipe.items() if k not in decisions}, base_dir=tmp_path)
    assert settled.sample_packing is False and settled.adapter == source.get("adapter", "none")
    if settled.adapter == "none":  # axolotl's full fine-tune trains the tower too
        assert settled.freeze_vision_tower is False and settled.freeze_multi_modal_projector is False
    else:  # the examples' regex adapts the language model's layers: neither the tower nor the projector
        assert settled.lora_target_modules == "all-linear"
        assert settled.freeze_vision_tower is True and settled.freeze_multi_modal_projector is True


def _comments_of(text: str, key: str) -> list[str]:
    """The comment lines just above `key:` in a ported recipe."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    above = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        above.append(line)
    return above


@pytest.mark.parametrize("name,family,prefix", [("llava-lora-7b.yaml", "llava", "model.language_model"),
                                                ("smolvlm2-2B-lora.yaml", "idefics3", "model.text_model")])
def test_ported_targets_are_the_layers_axolotls_regex_adapts(name, family, prefix, tmp_path, tmp_path_factory):
    """peft reading axolotl's regex (what axolotl hands it) on a tiny model of the family is the oracle."""
    import torch
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from transformers import AutoConfig, AutoModelForImageTextToText

    from finetune.model.vision import lora_target_names
    from finetune.recipe import load_recipe
    from tiny_vision import tiny_vlm

    folder = tiny_vlm(family, tmp_path_factory.getbasetemp())
    out = tmp_path / "recipe.yml"
    port(ASSETS / name, out, f"base_model={folder}", "trust_remote_code=false")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(folder))
    regex = yaml.safe_load((ASSETS / name).read_text())["lora_target_modules"]
    theirs = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
              and check_target_module_exists(LoraConfig(target_modules=regex), n)}
    ours = set(lora_target_names(model, load_recipe(out)))
    assert theirs and all(n.startswith(prefix) for n in theirs)
    assert ours == theirs


def test_lora_target_linear_on_a_vision_model_adapts_the_tower_as_axolotl_does(tmp_path, tmp_path_factory):
    """axolotl's lora_target_linear names every Linear layer by its last name, so peft adapts the tower's too."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from finetune.model.vision import lora_target_names
    from finetune.recipe import load_recipe
    from tiny_vision import tiny_vlm

    folder = tiny_vlm("llava", tmp_path_factory.getbasetemp())
    source = yaml.safe_load((ASSETS / "llava-lora-7b.yaml").read_text())
    source.update(base_model=str(folder), lora_target_linear=True)
    (tmp_path / "a.yml").write_text(yaml.safe_dump(source))
    assert port(tmp_path / "a.yml", tmp_path / "r.yml") == 0
    recipe = load_recipe(tmp_path / "r.yml")
    assert recipe.lora_target_modules == "all-linear" and recipe.freeze_vision_tower is False
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(folder))
    # axolotl's find_all_linear_names: the last name of every Linear module, the output layer left out
    suffixes = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - {"lm_head"}
    theirs = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in suffixes}
    assert set(lora_target_names(model, recipe)) == theirs and any("vision_tower" in n for n in theirs)


def test_multimodal_keys_map_or_are_kept_for_a_decision_with_their_reason(tmp_path, capsys):
    src = tmp_path / "a.yml"
    src.write_text(yaml.safe_dump({
        "base_model": "Qwen/Qwen2-VL-2B-Instruct", "processor_type": "AutoProcessor", "adapter": "lora",
        "datasets": [{"path": "d.jsonl", "type": "chat_template"}], "freeze_mm_modules": True,
        "image_size": 512, "image_resize_algorithm": "lanczos",
        "processor_kwargs": {"max_pixels": 200704, "do_pan_and_scan": True},
        "role_boundaries": [{"role": "assistant", "start": "<|im_start|>assistant"}],
        "lora_target_modules": "model.language_model.layers.[\\d]+.self_attn.(q|v)_proj"}, sort_keys=False))
    out = tmp_path / "r.yml"
    assert port(src, out) == 1
    err = capsys.readouterr().err
    recipe = yaml.safe_load(out.read_text())
    # mapped: the pixel budget (512 x 512, bounded by the processor's max_pixels), the freeze keys, the targets
    assert recipe["image_max_pixels"] == recipe["image_min_pixels"] == 200704
    assert recipe["freeze_vision_tower"] is True and recipe["freeze_multi_modal_projector"] is True
    assert recipe["lora_target_modules"] == ["self_attn.q_proj", "self_attn.v_proj"]
    assert "pads each image to a 512 x 512 square (black bars); finetune keeps each image's aspect" in _flat(
        out.read_text())
    # kept for a decision, each with its reason; the rest of the processor kwargs only
    assert recipe["processor_kwargs"] == {"do_pan_and_scan": True}
    assert "`image_resize_algorithm: lanczos`: axolotl resizes images to `image_size` with lanczos" in err
    assert "`processor_kwargs: {do_pan_and_scan: true}`: these processor settings change how images" in err
    assert "`role_boundaries: " in err and "finds each turn from the chat template itself" in err
    # a regex finetune cannot read as layer names is kept for a decision too
    src.write_text(src.read_text().replace("self_attn.(q|v)_proj", "(self_attn|mlp).*"))
    assert port(src, out, "image_resize_algorithm=null", "processor_kwargs=null", "role_boundaries=null",
                "--force") == 1
    assert "`lora_target_modules: " in capsys.readouterr().err and "a regular expression over module names" in \
        _flat(out.read_text())


def test_validate_names_the_equivalent_of_a_multimodal_key(capsys):
    assert main(["validate", str(ASSETS / "qwen2-vl-lora-7b.yaml")]) == 2
    err = capsys.readouterr().err
    assert "`processor_type` (line 2): an axolotl key: not needed: finetune loads the model's processor" in err
    assert "`image_size`" not in err
