"""The LoRA target inspector: module groups and preset parameter counts from a config alone, checked against
peft's own count on a real model of four families (Llama, Qwen2, GPT-2 with Conv1D, Gemma)."""

from __future__ import annotations

import json

import pytest
import torch

from finetune.cli import main as cli_main
from finetune.errors import ModelError
from finetune.model.targets import check_targets, inspect_model, meta_model, module_groups


def family_configs() -> dict:
    from transformers import GemmaConfig, GPT2Config, LlamaConfig, Qwen2Config

    small = dict(num_hidden_layers=2, num_attention_heads=4, vocab_size=300)
    return {
        "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2, **small),
        "qwen2": Qwen2Config(hidden_size=64, intermediate_size=96, num_key_value_heads=2, tie_word_embeddings=True,
                             **small),  # q/k/v carry biases
        "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=64,
                           bos_token_id=0, eos_token_id=0),  # fused c_attn, Conv1D, tied lm_head
        "gemma": GemmaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=1, head_dim=16, **small),
    }


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gemma"])
def test_preset_counts_match_peft(family):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = family_configs()[family]
    report = inspect_model(meta_model(config), family, rank=4)
    assert [p.name for p in report.presets] == ["q,v", "all attention", "all-linear",
                                                "all-linear + embeddings/lm_head saved"]
    for preset in report.presets:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        peft_model = get_peft_model(model, LoraConfig(
            r=4, target_modules=preset.target_modules, modules_to_save=preset.modules_to_save or None,
            ensure_weight_tying=tied and bool(preset.modules_to_save), task_type="CAUSAL_LM"))
        trainable, total = peft_model.get_nb_trainable_parameters()
        assert (preset.trainable_parameters, preset.total_parameters) == (trainable, total), (family, preset.name)
    # the fractions differ between presets in the expected order
    counts = [p.trainable_parameters for p in report.presets]
    assert counts == sorted(counts) and len(set(counts)) == 4


def test_groups_patterns_classes_and_shapes():
    gpt2 = {g.pattern: g for g in module_groups(meta_model(family_configs()["gpt2"]))}
    attn = gpt2["transformer.h.*.attn.c_attn"]
    assert (attn.cls, attn.count, attn.shape, attn.targetable) == ("Conv1D", 2, "64 -> 192", True)
    assert attn.parameters == 2 * (64 * 192 + 192)
    assert gpt2["lm_head"].output_layer and gpt2["transformer.wte"].shape == "300x64"
    assert not gpt2["transformer.h.*.ln_1"].targetable
    llama = {g.pattern: g for g in module_groups(meta_model(family_configs()["llama"]))}
    assert llama["model.layers.*.self_attn.k_proj"].shape == "64 -> 32"  # 2 KV heads of 16
    assert llama["model.layers.*.mlp.down_proj"].suffix == "mlp.down_proj"


def test_targets_that_match_nothing_list_what_exists():
    groups = module_groups(meta_model(family_configs()["gpt2"]))
    with pytest.raises(ModelError) as err:
        check_targets(groups, ["q_proj", "v_proj"])
    assert "attn.c_attn (2x Conv1D)" in str(err.value) and "mlp.c_fc" in str(err.value)
    with pytest.raises(ModelError, match="LoRA cannot adapt those"):
        check_targets(groups, ["ln_1"])
    check_targets(groups, ["c_attn"])  # no error


def test_cli_on_a_recipe_uses_its_rank_and_targets(make_recipe, capsys):
    recipe = make_recipe("completion", n=4, adapter="lora", lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    assert cli_main(["targets", str(recipe), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rank"] == 4 and report["architecture"] == "LlamaForCausalLM"
    ours = report["presets"][-1]
    # q: 64 -> 64, v: 64 -> 32, two layers: 4 * ((64 + 64) + (64 + 32)) * 2 = 1,792
    assert ours["name"] == "recipe" and ours["trainable_parameters"] == 1792
    assert ours["trainable_parameters"] == report["presets"][0]["trainable_parameters"]  # same as q,v
    assert cli_main(["targets", str(recipe), "--rank", "8"]) == 0
    text = capsys.readouterr().out
    assert "model.layers.*.self_attn.q_proj" in text and "3,584" in text and "output layer" in text


def test_cli_recipe_with_unknown_targets_exits_2_listing_modules(make_recipe, capsys):
    recipe = make_recipe("completion", n=4, adapter="lora", lora_target_modules=["query", "value"])
    assert cli_main(["targets", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "match no layer LoRA can adapt" in err and "self_attn.q_proj (2x Linear)" in err
    assert "Traceback" not in err
    # the builder refuses it the same way, before training
    assert cli_main(["train", str(recipe)]) == 2
    assert "self_attn.q_proj" in capsys.readouterr().err


def test_cli_on_a_config_file_and_a_missing_model(tmp_path, capsys):
    family_configs()["qwen2"].save_pretrained(tmp_path / "qwen")
    assert cli_main(["targets", str(tmp_path / "qwen" / "config.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_type"] == "qwen2" and report["rank"] == 8
    assert cli_main(["targets", str(tmp_path / "nothing-here")]) == 2
    assert "does not exist" in capsys.readouterr().err
