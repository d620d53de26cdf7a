"""Porting axolotl recipes (issue 14 item 10): `finetune port` on axolotl's published examples, and `finetune
validate` naming the finetune equivalent of an axolotl key instead of a fuzzy did-you-mean."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from finetune.cli import main

ASSETS = Path(__file__).parent / "assets" / "axolotl"
EXAMPLES = sorted(p.name for p in ASSETS.glob("*.y*ml"))


def _local_overrides(tmp_path, tiny_model_dir) -> list[str]:
    data = tmp_path / "data.jsonl"
    data.write_text('{"instruction": "say hi", "input": "", "output": "hi"}\n')
    return ["--set", f"base_model={tiny_model_dir}", "--set", f"datasets.0.path={data}"]


def _flat(text: str) -> str:
    """The recipe's comments with their wrapped lines joined."""
    return re.sub(r"\n#\s+(?![\w\[\]-]+:)", " ", text)


def _accounted_for(key: str, text: str, recipe: dict) -> bool:
    """A source key is in the ported recipe, or a comment names it (dropped, or what it became)."""
    return key in recipe or re.search(rf"^# {re.escape(key)}:", text, re.M) is not None \
        or f"from axolotl `{key}:" in text


@pytest.mark.parametrize("name", EXAMPLES)
def test_port_of_an_axolotl_example_validates_and_accounts_for_every_key(name, tmp_path, tiny_model_dir, capsys):
    from finetune.recipe import load_recipe

    assert len(EXAMPLES) >= 6
    source = yaml.safe_load((ASSETS / name).read_text())
    out = tmp_path / "recipe.yml"
    assert main(["port", str(ASSETS / name), "-o", str(out), *_local_overrides(tmp_path, tiny_model_dir)]) == 0
    assert "is a valid finetune recipe" in capsys.readouterr().out
    text = out.read_text()
    recipe = yaml.safe_load(text)
    missing = [k for k in source if not _accounted_for(k, text, recipe)]
    assert not missing, f"{name}: keys neither ported nor commented: {missing}"
    for i, spec in enumerate(source["datasets"]):
        for key in spec:
            assert key in recipe["datasets"][i] or f"datasets[{i}].{key}" in text, (name, key)
    loaded = load_recipe(out)  # the file as written loads, comments and all
    # what the axolotl keys meant survives
    assert loaded.adapter == source["adapter"] and loaded.lora_r == source["lora_r"]
    assert loaded.precision == "auto"  # bf16: auto in every example
    assert loaded.datasets[0].type == {"alpaca": "instruction", "chat_template": "chat"}[source["datasets"][0]["type"]]
    if source.get("lora_target_linear"):
        assert loaded.lora_target_modules == "all-linear"
    else:
        assert loaded.lora_target_modules == source["lora_target_modules"]
    assert loaded.gradient_checkpointing == ("full" if source["gradient_checkpointing"] else "off")
    assert loaded.lora_target_parameters == source.get("lora_target_parameters")  # MoE experts: the same key
    assert loaded.load_in_4bit == bool(source.get("load_in_4bit"))


def test_port_explains_the_dropped_keys(tmp_path, capsys):
    out = tmp_path / "r.yml"
    assert main(["port", str(ASSETS / "mistral-qlora.yml"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    text = _flat(out.read_text())
    assert "mhenrichsen/alpaca_2k_test` looks like a Hugging Face dataset id: finetune loads it from the hub" in text
    assert "the dataset(s) mhenrichsen/alpaca_2k_test are read from the Hugging Face hub when training" in printed
    assert re.search(r"^# tokenizer_type: LlamaTokenizer \^ dropped, not needed: transformers' Auto", text, re.M)
    assert re.search(r"^# tf32: false \^ dropped, not in finetune: TF32", text, re.M)
    assert "# from axolotl `bf16: auto`\nprecision: auto" in out.read_text()
    assert "lora_target_linear: true` adds every linear layer" in text


def test_legacy_keys_and_values(tmp_path, tiny_model_dir):
    """Older axolotl spellings (boolean attention flags, fp16, a deepspeed JSON path, sharegpt)."""
    src = tmp_path / "old.yml"
    src.write_text(yaml.safe_dump({
        "base_model": str(tiny_model_dir), "datasets": [{"path": "d.jsonl", "type": "sharegpt", "conversation": "chatml"}],
        "fp16": True, "bf16": False, "flash_attention": True, "deepspeed": "deepspeed_configs/zero3_bf16.json",
        "chat_template": "qwen_25", "lr_scheduler": "one_cycle", "optimizer": "lion_8bit", "micro_batch_size": 2,
        "gradient_checkpointing": "offload", "torch_compile": True,
    }, sort_keys=False))
    out = tmp_path / "new.yml"
    assert main(["port", str(src), "-o", str(out)]) == 0
    recipe = yaml.safe_load(out.read_text())
    assert recipe["precision"] == "fp16" and recipe["attn_implementation"] == "flash_attention_2"
    assert recipe["deepspeed"] == "zero3" and recipe["chat_template"] == "tokenizer_default"
    assert recipe["datasets"][0]["type"] == "chat" and recipe["gradient_checkpointing"] == "full"
    assert recipe["compile"] is True
    assert "lr_scheduler" not in recipe and "optimizer" not in recipe
    text = _flat(out.read_text())
    assert "# lr_scheduler: one_cycle" in text and "# optimizer: lion_8bit" in text
    assert "sharegpt records ({conversations: [{from, value}]}, roles human/gpt) are read as they are" in text
    assert "datasets[0].conversation" in text

    (tmp_path / "ds3.json").write_text("{}")  # a DeepSpeed JSON of one's own next to the recipe is kept as it is
    src.write_text(src.read_text().replace("deepspeed_configs/zero3_bf16.json", "ds3.json"))
    assert main(["port", str(src), "-o", str(out), "--force"]) in (0, 1)
    assert yaml.safe_load(out.read_text())["deepspeed"] == "ds3.json"


def test_training_finetune_does_not_do_is_refused_and_nothing_is_written(tmp_path, capsys):
    src = tmp_path / "rm.yml"
    src.write_text("base_model: x\nprocess_reward_model: true\ndatasets: [{path: d.jsonl}]\n")
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) == 2
    assert "leaves process reward models out" in capsys.readouterr().err and not out.exists()


def test_an_existing_output_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "r.yml"
    out.write_text("mine\n")
    assert main(["port", str(ASSETS / "llama-3-lora-1b.yml"), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "mine\n"


def test_a_result_that_does_not_validate_is_written_and_exits_1(tmp_path, capsys):
    src = tmp_path / "a.yml"
    src.write_text("base_model: x\ndatasets: [{path: d.jsonl, type: alpaca}]\nlearning_rate: -1\n")
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) == 1
    assert "learning_rate" in capsys.readouterr().err and out.exists()


def test_keys_that_change_what_trains_are_kept_for_a_decision_and_exit_1(tmp_path, tiny_model_dir, capsys):
    # port said "valid" while dropping these: a full fine-tune of every weight instead of two layers, and
    # end-of-turn tokens the user listed silently replaced by the template's
    src = tmp_path / "a.yml"
    base = {"base_model": str(tiny_model_dir), "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
            "streaming": True, "dataset_exact_deduplication": True}
    src.write_text(yaml.safe_dump({**base, "unfrozen_parameters": ["^lm_head.weight$", "model.layers.1[0-9].*"],
                                   "eot_tokens": ["<|im_end|>"]}, sort_keys=False))
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert "`unfrozen_parameters: [^lm_head.weight$, 'model.layers.1[0-9].*']`: finetune trains every weight " in \
        captured.err and "`eot_tokens: [<|im_end|>]`: finetune supervises the end-of-turn token" in captured.err
    text = _flat(out.read_text())
    assert text.count("NEEDS YOUR DECISION") == 2 and yaml.safe_load(out.read_text())["eot_tokens"] == ["<|im_end|>"]
    # streaming is dropped with its reason; deduplication is finetune's key of the same name (issue 33 item 6: it
    # was dropped with exit 0, and every record of axolotl's two-identical-datasets example trained twice)
    assert re.search(r"^# streaming: true \^ dropped, not needed: finetune tokenizes", text, re.M)
    assert yaml.safe_load(out.read_text())["dataset_exact_deduplication"] is True
    src.write_text(yaml.safe_dump(base, sort_keys=False))
    assert main(["port", str(src), "-o", str(out), "--force"]) == 0
    from finetune.recipe import load_recipe

    assert load_recipe(out).dataset_exact_deduplication is True


# --- validate on an axolotl recipe ---------------------------------------------------------------------------


def test_validate_names_the_equivalent_of_axolotl_keys(capsys):
    assert main(["validate", str(ASSETS / "llama-3-lora-1b-kernels.yml")]) == 2
    err = capsys.readouterr().err
    line = {m.group(1): m.group(2) for m in re.finditer(r"^  - `([\w.\[\]]+)` \(line \d+\): (.*)$", err, re.M)}
    assert "lora_r" not in line["lora_o_kernel"] and "Triton" in line["lora_o_kernel"]
    assert "precision: bf16" in line["bf16"] and "`precision: auto`" in line["bf16"]
    assert "TF32" in line["tf32"]
    assert "finetune's `type: instruction`" in line["datasets[0].type"]
    assert err.count("finetune port") == 1  # the tip once, not on every line


def test_validate_on_more_axolotl_keys(tmp_path, capsys):
    path = tmp_path / "a.yml"
    path.write_text("base_model: x\ntokenizer_type: AutoTokenizer\nfp16: true\nflash_attention: true\n"
                    "lora_target_linear: true\ndatasets: [{path: d.jsonl, type: chat_template}]\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "Auto classes" in err
    assert "write `precision: fp16`" in err and "write `attn_implementation: flash_attention_2`" in err
    assert "write `lora_target_modules: all-linear`" in err
    assert "axolotl's `type: chat_template` is finetune's `type: chat`" in err


def test_a_plain_typo_still_gets_did_you_mean(tmp_path, capsys):
    path = tmp_path / "a.yml"
    path.write_text("base_model: x\nlora_rr: 8\ndatasets: [{path: d.jsonl}]\n")
    assert main(["validate", str(path)]) == 2
    assert "did you mean `lora_r`?" in capsys.readouterr().err


def test_keys_with_no_finetune_equivalent_exit_1_with_their_own_reason(tmp_path, tiny_model_dir, capsys):
    """Issue 33 item 6: axolotl keys that change what is trained and that finetune cannot honour (from axolotl's
    schema: 1.58-bit BitNet layers, NEFTune noise, ReLoRA...) were dropped as "not in the axolotl table" with exit 0.
    Each is kept for a decision with what it does; `--set KEY=null` decides it away, as the docs say."""
    src = tmp_path / "a.yml"
    keys = {"use_onebitllms": True, "neftune_noise_alpha": 5, "relora": True, "unfrozen_parameters": ["^lm_head"],
            "curriculum_sampling": True}
    src.write_text(yaml.safe_dump({"base_model": str(tiny_model_dir), "datasets": [{"path": "d.jsonl",
                                   "type": "alpaca"}], **keys, "learning_rate": 1e-4}, sort_keys=False))
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "not in the axolotl table" not in err + out.read_text()
    assert "`use_onebitllms: true`: replaces the Linear layers with BitNet 1.58-bit ones" in err
    assert "`neftune_noise_alpha: 5`: adds noise to the input embeddings" in err and "`relora: true`: merges" in err
    assert "`curriculum_sampling: true`: trains the records in their order" in err
    assert _flat(out.read_text()).count("NEEDS YOUR DECISION") == 5
    nulls = [a for key in keys for a in ("--set", f"{key}=null")]
    assert main(["port", str(src), "-o", str(out), "--force", *nulls]) == 0, capsys.readouterr().err
    text = out.read_text()
    recipe = yaml.safe_load(text)
    assert not set(keys) & set(recipe) and recipe["learning_rate"] == 1e-4 and "NEEDS YOUR DECISION" not in text
    # each removed key is still accounted for, as written, where it stood
    assert re.search(r"^# use_onebitllms: true\n#  \^ removed on the command line \(--set use_onebitllms=null\)",
                     text, re.M)
    assert text.index("# relora: true") < text.index("learning_rate:")
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    # validate on the axolotl recipe itself names the same reason
    assert main(["validate", str(src)]) == 2
    assert "`use_onebitllms`" in (err := capsys.readouterr().err) and "BitNet 1.58-bit" in err


def test_lora_layer_and_rank_patterns_are_kept_for_a_decision(tmp_path, tiny_model_dir, capsys):
    """peft_layers_to_transform / rank and alpha patterns / trainable token indices change what trains: exit 1,
    each with its reason (they were dropped with exit 0 or "not in the axolotl table")."""
    src = tmp_path / "a.yml"
    keys = {"peft_layers_to_transform": [0, 1], "lora_rank_pattern": {"q_proj": 16},
            "lora_alpha_pattern": {"q_proj": 32}, "peft_trainable_token_indices": [5, 6]}
    src.write_text(yaml.safe_dump({"base_model": str(tiny_model_dir), "adapter": "lora", "datasets": [
        {"path": "d.jsonl", "type": "alpaca"}], **keys}, sort_keys=False))
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "not in the axolotl table" not in err + out.read_text()
    assert _flat(out.read_text()).count("NEEDS YOUR DECISION") == 4
    assert "adapts only the listed layers" in err and "their own LoRA rank" in err and "listed token ids" in err


@pytest.mark.parametrize("name, base_type, verdict", [
    ("qwen3", "qwen3", "which this `qwen3` base's tokenizer ships"),
    ("gemma3", "gemma3_text", "which this `gemma3_text` base's tokenizer ships"),
    ("phi_3", "phi3", "which this `phi3` base's tokenizer ships"),
    ("llama3", "mistral", "but this base is `mistral`"),
    ("mistral_v7_tekken", None, "(model_type mistral, mistral3)"),
])
def test_axolotl_template_names_map_to_the_family_whose_tokenizer_ships_them(tmp_path, name, base_type, verdict):
    """axolotl's template names say whose template they are: the base's own family renders the same turns with
    `tokenizer_default`; another family's base, or one the port cannot read, is told so."""
    import json

    base = "org/some-model"
    if base_type:
        (tmp_path / "base").mkdir()
        (tmp_path / "base" / "config.json").write_text(json.dumps({"model_type": base_type}))
        base = "base"  # relative to the axolotl recipe
    src = tmp_path / "a.yml"
    src.write_text(yaml.safe_dump({"base_model": base, "chat_template": name,
                                   "datasets": [{"path": "d.jsonl", "type": "chat_template"}]}))
    out = tmp_path / "r.yml"
    assert main(["port", str(src), "-o", str(out)]) in (0, 1)
    assert yaml.safe_load(out.read_text())["chat_template"] == "tokenizer_default"
    assert verdict in _flat(out.read_text())


def test_every_family_an_axolotl_template_names_is_a_transformers_model_type():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from finetune.recipe.axolotl.chat_templates import OWN_TEMPLATES

    assert {t for families, _ in OWN_TEMPLATES.values() for t in families} <= set(CONFIG_MAPPING_NAMES)


def test_roles_to_train_of_the_datasets_becomes_the_top_level_key_or_a_decision(tmp_path, tiny_model_dir, capsys):
    # review of issue 39: vcore added a top-level roles_to_train; port dropped axolotl's per-dataset key as "not in
    # finetune" (exit 0): the ported run supervised fewer turns than axolotl's
    def port(datasets) -> tuple[int, dict]:
        src, out = tmp_path / "a.yml", tmp_path / "r.yml"
        src.write_text(yaml.safe_dump({"base_model": str(tiny_model_dir), "datasets": datasets}, sort_keys=False))
        code = main(["port", str(src), "-o", str(out), "--force"])
        capsys.readouterr()
        return code, yaml.safe_load(out.read_text())

    chat = {"path": "d.jsonl", "type": "chat_template"}
    code, recipe = port([{**chat, "roles_to_train": ["gpt", "human"]}, {**chat, "roles_to_train": ["user", "assistant"]}])
    assert code == 0 and recipe["roles_to_train"] == ["user", "assistant"]
    code, recipe = port([{**chat, "roles_to_train": ["user", "assistant"]}, chat])  # the second: axolotl's default
    assert code == 1 and recipe["roles_to_train"] == [["user", "assistant"], ["assistant"]]
    code, recipe = port([{**chat, "roles_to_train": ["tool", "assistant"]}])
    assert code == 1
    code, recipe = port([{**chat, "roles_to_train": ["assistant"]}])
    assert code == 0 and "roles_to_train" not in recipe
