"""`finetune port` on axolotl's preference recipes (issue 21): `rl:` -> `method:`, the rl settings -> finetune's,
axolotl's preference dataset types -> `preference` / `unpaired` records or what the records must become, and
the keys finetune cannot honour kept so the recipe does not load until the user decides."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from conftest import sentence, write_jsonl
from finetune.cli import main
from finetune.ingest.preference import RecordProblem, canonical
from finetune.port.preference import records as preference_records
from finetune.recipe import load_recipe
from finetune.recipe.methods import method_settings
from test_port import _accounted_for, _flat

RL_ASSETS = Path(__file__).parent / "assets" / "axolotl" / "rl"


def _port(tmp_path, source, *overrides: str) -> tuple[int, str, dict]:
    """Port `source` (a path or a dict); (exit code, the YAML text written, the recipe it holds)."""
    if isinstance(source, dict):
        path = tmp_path / "axolotl.yml"
        path.write_text(yaml.safe_dump(source, sort_keys=False))
        source = path
    out = tmp_path / "recipe.yml"
    args = [a for o in overrides for a in ("--set", o)]
    code = main(["port", str(source), "-o", str(out), "--force", *args])
    text = out.read_text() if out.exists() else ""
    return code, text, yaml.safe_load(text) if text else {}


def _rl(rl: str, **keys) -> dict:
    return {"base_model": "org/model", "rl": rl, "datasets": [{"path": "pairs.jsonl", "type": "chatml.argilla_chat"}],
            "sequence_len": 512, **keys}


# --- axolotl's own examples ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in RL_ASSETS.glob("*.y*ml")))
def test_axolotl_preference_examples_port_and_validate(name, tmp_path, tiny_model_dir, capsys):
    source = yaml.safe_load((RL_ASSETS / name).read_text())
    code, text, recipe = _port(tmp_path, RL_ASSETS / name, f"base_model={tiny_model_dir}")
    assert code == 0, capsys.readouterr().err
    missing = [k for k in source if not _accounted_for(k, text, recipe)]
    assert not missing, f"{name}: keys neither ported nor commented: {missing}"
    for i, spec in enumerate(source["datasets"]):
        for key in spec:
            assert key in recipe["datasets"][i] or f"datasets[{i}].{key}" in text, (name, key)
    loaded = load_recipe(tmp_path / "recipe.yml")
    assert loaded.method == source["rl"]
    assert loaded.datasets[0].type == ("unpaired" if source["rl"] == "kto" else "preference")
    assert loaded.adapter == (source.get("adapter") or "none") and loaded.sample_packing is False
    assert "rl" not in recipe and "remove_unused_columns" not in recipe


def test_dpo_lora_example_reads_its_records_through_map(tmp_path, tiny_model_dir, capsys):
    """axolotl's chat_template.default with `field_messages: conversation`: the ported recipe reads axolotl's records
    as they are, through `map: {messages: conversation}` (issue 33 item 9: the records had to be renamed first)."""
    code, text, recipe = _port(tmp_path, RL_ASSETS / "llama-3-instruct-dpo-lora-8b.yml", f"base_model={tiny_model_dir}",
                               "datasets.0.path=pairs.jsonl", "attn_implementation=sdpa")
    printed = capsys.readouterr().out
    assert code == 0 and recipe["method"] == "dpo" and recipe["adapter"] == "lora"
    assert "convert the records" not in printed and recipe["datasets"][0]["map"] == {"messages": "conversation"}
    assert "datasets[0].field_messages: conversation: dropped, -> `map: {messages: conversation}`" in _flat(text)

    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    rng = random.Random(0)
    axolotl_records = [{"conversation": [{"role": "user", "content": sentence(rng)}],
                        "chosen": {"role": "assistant", "content": "yes " + sentence(rng)},
                        "rejected": {"role": "assistant", "content": "no " + sentence(rng)}} for _ in range(8)]
    write_jsonl(tmp_path / "pairs.jsonl", axolotl_records)
    ported = load_recipe(tmp_path / "recipe.yml")
    ported.cache_dir = str(tmp_path / "cache")
    prepared = build_dataset(ported, load_tokenizer(ported))
    assert prepared.stats["records"] == 8
    assert prepared.stats["train"]["examples"] + prepared.stats["eval"]["examples"] == 8


def test_orpo_example_ports_and_trains_on_its_records_as_they_are(tmp_path, tiny_model_dir, capsys):
    """axolotl's ORPO example reads UltraFeedback-style records (chat_template.argilla); ported, finetune reads the
    same records unchanged and trains. The overrides only fit the run to a CPU and the tiny model."""
    from finetune.train.run import run_training

    rng = random.Random(1)
    records = []
    for _ in range(12):
        question = {"role": "user", "content": sentence(rng)}
        records.append({"prompt": question["content"],
                        "chosen": [question, {"role": "assistant", "content": "yes " + sentence(rng)}],
                        "rejected": [question, {"role": "assistant", "content": "no " + sentence(rng)}]})
    write_jsonl(tmp_path / "ultrafeedback.jsonl", records)
    cpu = ["adapter=lora", "load_in_4bit=false", "attn_implementation=sdpa", "precision=fp32", "optimizer=adamw_torch",
           "sequence_len=128", "micro_batch_size=2", "gradient_accumulation_steps=1", "max_steps=3", "val_set_size=0",
           "report_to=[none]", "output_dir=out", "cache_dir=cache", "gradient_checkpointing=off"]
    code, text, recipe = _port(tmp_path, RL_ASSETS / "mistral-qlora-orpo.yml", f"base_model={tiny_model_dir}",
                               "datasets.0.path=ultrafeedback.jsonl", *cpu)
    assert code == 0, capsys.readouterr().err
    assert "convert the records" not in capsys.readouterr().out  # read as they are
    assert recipe["method"] == "orpo" and recipe["orpo_alpha"] == 0.1 and recipe["chat_template"] == "chatml"
    assert "axolotl's (TRL's ORPOTrainer) also scores the prompt's" in _flat(text)
    summary = run_training(load_recipe(tmp_path / "recipe.yml"))
    assert summary["steps"] == 3
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["method"] == "orpo" and run["preference"]["settings"] == {"orpo_alpha": 0.1}


def test_kto_example_keeps_its_weights_and_says_the_records_lose_their_turns(tmp_path, tiny_model_dir, capsys):
    code, text, recipe = _port(tmp_path, RL_ASSETS / "llama-3-qlora-1b-kto.yaml", f"base_model={tiny_model_dir}")
    printed = capsys.readouterr().out
    assert code == 0
    loaded = load_recipe(tmp_path / "recipe.yml")
    assert method_settings(loaded) == {"rl_beta": 0.5, "kto_desirable_weight": 0.2, "kto_undesirable_weight": 1.0}
    # llama3.ultra wraps plain strings in Llama 3 turns; finetune would read them as plain text
    assert "plain text, with no chat turns, where axolotl wraps them in Llama 3 turns" in _flat(text)
    assert '"completion": [{"role": "assistant", "content": ...}], "label": true | false}' in printed
    assert "finetune packs whole examples" in _flat(text)


# --- the dataset types, checked against finetune's own record reader -----------------------------------------

_Q, _A, _B = "What is two and two?", "Four.", "Five."
_CHAT_A = [{"role": "user", "content": _Q}, {"role": "assistant", "content": _A}]
_CHAT_B = [{"role": "user", "content": _Q}, {"role": "assistant", "content": _B}]
PAIR_SAMPLES = {  # one record per axolotl type, as axolotl's docs/rlhf.qmd shows them
    "default": {"system": "Be brief.", "question": _Q, "chosen": _A, "rejected": _B},
    "prompt_pairs": {"system": "Be brief.", "prompt": _Q, "chosen": _A, "rejected": _B},
    "intel": {"system": "Be brief.", "question": _Q, "chosen": _A, "rejected": _B},
    "icr": {"system": "Be brief.", "input": _Q, "chosen": _A, "rejected": _B},
    "argilla": {"system": "Be brief.", "instruction": _Q, "chosen_response": _A, "rejected_response": _B},
    "argilla_chat": {"chosen": _CHAT_A, "rejected": _CHAT_B},
    "ultra": {"prompt": _Q, "chosen": _CHAT_A, "rejected": _CHAT_B},
    "chat_template.argilla": {"prompt": _Q, "chosen": _CHAT_A, "rejected": _CHAT_B},
    "passthrough.default": {"prompt": _Q, "chosen": " " + _A, "rejected": " " + _B},
    "zephyr.nectar": {"prompt": _Q, "answers": [{"answer": _A, "rank": 1}, {"answer": _B, "rank": 2}]},
}
UNPAIRED_SAMPLES = {
    "prompt_pairs": {"system": "Be brief.", "prompt": _Q, "completion": _A, "label": True},
    "ultra": {"system": "Be brief.", "prompt": _Q, "completion": _A, "label": True},
    "intel": {"system": "Be brief.", "question": _Q, "completion": _A, "label": True},
    "argilla": {"system": "Be brief.", "instruction": _Q, "completion": _A, "label": True},
    "argilla_chat": {"completion": _CHAT_A, "label": True},
}


def _sample(samples: dict, name: str) -> dict:
    return samples.get(name) or samples[name.split(".", 1)[1]]


@pytest.mark.parametrize("method,name", [("dpo", n) for n in preference_records.PAIR_TYPES]
                         + [("kto", n) for n in preference_records.UNPAIRED_TYPES])
def test_what_the_port_says_of_a_dataset_type_is_what_the_reader_does(method, name):
    """reads: the reader takes axolotl's records as they are, as messages when axolotl writes chat turns; plain:
    the reader takes them, but as plain text (what the port warns of); otherwise the reader refuses them."""
    samples = UNPAIRED_SAMPLES if method == "kto" else PAIR_SAMPLES
    ported = preference_records.dataset({"path": "d.jsonl", "type": name}, method)
    layout = (preference_records.UNPAIRED_TYPES if method == "kto" else preference_records.PAIR_TYPES)[name]
    record = _sample(samples, name)
    if layout.reads or layout.plain:
        read = canonical(record, ported.type)
        assert isinstance(read["prompt"], list) == (layout.chat is not None and not layout.plain)
        answer = read["completion" if method == "kto" else "chosen"]
        assert (answer if isinstance(answer, str) else answer[-1]["content"]).strip() == _A
        assert bool(ported.convert) == layout.plain
    else:
        with pytest.raises(RecordProblem):
            canonical(record, ported.type)
        assert ported.convert.startswith("write each record as {")


@pytest.mark.parametrize("fields", [
    {"field_messages": "conversations"},
    {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
     "roles": {"user": ["human"], "assistant": ["gpt"]}},
    {"field_messages": "conversation"},
    {},  # axolotl's default `messages`
    {"field_messages": "conversations", "field_chosen": "better", "field_rejected": "worse"},
    {"field_messages": "conversations", "message_property_mappings": {"role": "speaker", "content": "text"}},
    {"field_messages": "dialog", "roles": {"user": ["me"], "assistant": ["bot"]}},
])
def test_chat_template_default_reads_every_layout_as_it_is(fields, tmp_path):
    """Every chat_template.default layout ports with no record to convert: other names through `map:` and `roles:`,
    read by finetune's records reader into the same canonical pair."""
    from finetune.ingest.records import read_records
    from finetune.ingest.records_source import materialize_records
    from finetune.recipe.data import DatasetSpec

    messages = fields.get("field_messages", "messages")
    role, content = ((fields.get("message_property_mappings") or {}).get(k, k) for k in ("role", "content"))
    user = {"from": "human"}.get(role, "me" if messages == "dialog" else "user")
    bot = {"from": "gpt"}.get(role, "bot" if messages == "dialog" else "assistant")
    record = {messages: [{role: user, content: _Q}], fields.get("field_chosen", "chosen"): {role: bot, content: _A},
              fields.get("field_rejected", "rejected"): {role: bot, content: _B}}
    ported = preference_records.dataset({"path": "d.jsonl", "type": "chat_template.default", **fields}, "dpo")
    assert ported.type == "preference" and ported.convert == ""
    write_jsonl(tmp_path / "d.jsonl", [record])
    spec = DatasetSpec(path=str(tmp_path / "d.jsonl"), type="preference", map=ported.map or None,
                       roles=ported.roles or None)
    path = materialize_records(spec, str(tmp_path / "cache")) if ported.map or ported.roles else spec.path
    assert read_records(path) == [("preference", {"prompt": [{"role": "user", "content": _Q}],
                                                  "chosen": [{"role": "assistant", "content": _A}],
                                                  "rejected": [{"role": "assistant", "content": _B}]})]


def test_user_defined_types_read_as_plain_text_unless_renamed_or_formatted():
    identity = preference_records.dataset({"type": {"field_prompt": "prompt", "prompt_format": "{prompt}"}}, "dpo")
    assert identity.type == "preference" and not identity.convert
    assert canonical({"prompt": _Q, "chosen": _A, "rejected": _B}, "preference")["prompt"] == _Q
    renamed = preference_records.dataset({"type": {"field_prompt": "question", "prompt_format": "[INST] {prompt}"}},
                                         "dpo")
    assert "rename `question` to `prompt`" in renamed.convert and "prompt_format \"[INST] {prompt}\"" in renamed.convert
    kto = preference_records.dataset({"type": {"field_label": "good"}}, "kto")
    assert kto.type == "unpaired" and "rename `good` to `label`" in kto.convert


def test_an_unmappable_dataset_type_says_what_the_records_must_be(tmp_path, capsys):
    code, text, recipe = _port(tmp_path, _rl("dpo", datasets=[{"path": "orca.jsonl", "type": "chatml.intel"},
                                                              {"path": "nectar.jsonl", "type": "zephyr.nectar"}]))
    printed, flat = capsys.readouterr().out, _flat(text)
    assert code == 0 and [d["type"] for d in recipe["datasets"]] == ["preference", "preference"]
    assert ('datasets[0].type: axolotl `chatml.intel` -> `preference`: {"system" (optional), "question", "chosen", '
            '"rejected"} strings: finetune does not read these field names (and axolotl wraps the strings in ChatML '
            "turns)") in flat
    assert ('convert the records of datasets[0] (orca.jsonl): write each record as {"prompt": [{"role": "user"'
            in printed)
    assert "to train on the same ChatML turns" in printed
    assert ('datasets[1].type: axolotl `zephyr.nectar` -> `preference`: {"prompt", "answers": [{"answer", "rank"}...]}'
            ": finetune does not read this layout") in flat
    assert recipe["chat_template"] == "chatml"  # chatml.* writes ChatML whatever chat_template says


# --- the rl keys --------------------------------------------------------------------------------------------


def test_keys_that_change_what_is_trained_block_the_recipe_until_decided(tmp_path, capsys):
    code, text, recipe = _port(tmp_path, _rl("dpo", dpo_use_weighting=True, dpo_loss_type=["hinge"], learning_rate=-1))
    err = capsys.readouterr().err
    assert code == 1
    assert recipe["dpo_use_weighting"] is True and recipe["dpo_loss_type"] == ["hinge"]  # kept as written
    assert "NEEDS YOUR DECISION: not in finetune: WPO weighting" in _flat(text)
    assert "`dpo_use_weighting: true`: not in finetune: WPO weighting" in err
    assert "`dpo_loss_type: [hinge]`: TRL's `hinge` loss is not in finetune" in err
    assert "learning_rate" in err  # the rest of the recipe is checked in the same run
    assert main(["validate", str(tmp_path / "recipe.yml")]) == 2
    assert "dpo_use_weighting" in capsys.readouterr().err
    edited = {k: v for k, v in recipe.items() if k not in ("dpo_use_weighting", "dpo_loss_type", "learning_rate")}
    (tmp_path / "edited.yml").write_text(yaml.safe_dump(edited))
    assert load_recipe(tmp_path / "edited.yml").method == "dpo"


@pytest.mark.parametrize("keys,method,settings", [
    ({"dpo_loss_type": ["ipo"], "dpo_label_smoothing": 0.1}, "ipo", {"rl_beta": 0.1, "rpo_alpha": 0.0}),
    ({"dpo_loss_type": ["sigmoid", "sft"], "dpo_loss_weights": [1.0, 0.3], "rl_beta": 0.2}, "dpo",
     {"rl_beta": 0.2, "dpo_label_smoothing": 0.0, "rpo_alpha": 0.3}),
    ({"dpo_label_smoothing": 0.1, "rpo_alpha": 0.5, "dpo_beta": 0.3}, "dpo",
     {"rl_beta": 0.3, "dpo_label_smoothing": 0.1, "rpo_alpha": 0.5}),
    ({"trl": {"beta": 0.4, "num_generations": 4}, "rl_beta": 0.2, "orpo_alpha": 0.7}, "dpo",
     {"rl_beta": 0.4, "dpo_label_smoothing": 0.0, "rpo_alpha": 0.0}),
    ({"orpo_alpha": 0.7}, "dpo", {"rl_beta": 0.7, "dpo_label_smoothing": 0.0, "rpo_alpha": 0.0}),
])
def test_dpo_loss_types_and_beta_port_as_axolotl_trains_them(tmp_path, keys, method, settings):
    """TRL's beta in axolotl is trl.beta, else rl_beta (dpo_beta), else orpo_alpha; `dpo_loss_type` picks IPO
    and carries the SFT weight; label smoothing reaches DPO's sigmoid loss only."""
    code, text, recipe = _port(tmp_path, _rl("dpo", **keys))
    assert code == 0
    loaded = load_recipe(tmp_path / "recipe.yml")
    assert loaded.method == method and method_settings(loaded) == settings
    for key in keys:
        assert _accounted_for(key, text, recipe), key


def test_simpo_writes_out_trl_cpo_defaults(tmp_path):
    """axolotl's SimPO is TRL's CPOTrainer (beta 0.1, gamma 0.5, cpo_alpha 1.0), not the paper's defaults."""
    _port(tmp_path, _rl("simpo"))
    settings = method_settings(load_recipe(tmp_path / "recipe.yml"))
    assert settings == {"rl_beta": 0.1, "rpo_alpha": 1.0, "simpo_gamma": 0.5}
    code, text, _ = _port(tmp_path, _rl("simpo", rl_beta=2.5, simpo_gamma=1.2, cpo_alpha=0.0, orpo_alpha=0.3))
    assert code == 0
    settings = method_settings(load_recipe(tmp_path / "recipe.yml"))
    assert settings == {"rl_beta": 2.5, "rpo_alpha": 0.0, "simpo_gamma": 1.2}
    assert re.search(r"^# orpo_alpha: 0.3 \^ dropped: ORPO's weight", _flat(text), re.M)


def test_orpo_reads_rl_beta_as_its_weight_and_kto_zero_weights_as_one(tmp_path):
    code, text, recipe = _port(tmp_path, _rl("orpo", rl_beta=0.25, orpo_alpha=0.1, dpo_label_smoothing=0.1))
    assert code == 0 and recipe["orpo_alpha"] == 0.25 and "rl_beta" not in recipe
    flat = _flat(text)
    assert "axolotl passes `rl_beta` as TRL's ORPO beta" in flat and "# dpo_label_smoothing: 0.1 ^ dropped" in flat
    assert method_settings(load_recipe(tmp_path / "recipe.yml")) == {"orpo_alpha": 0.25}
    _port(tmp_path, _rl("kto", kto_desirable_weight=0, kto_undesirable_weight=2.0, simpo_gamma=0.5,
                        datasets=[{"path": "kto.jsonl"}]))
    kto = load_recipe(tmp_path / "recipe.yml")
    assert kto.datasets[0].type == "unpaired"
    assert method_settings(kto) == {"rl_beta": 0.1, "kto_desirable_weight": 1.0, "kto_undesirable_weight": 2.0}


def test_no_op_keys_are_dropped_with_their_reason_and_padding_free_packs(tmp_path, capsys):
    keys = {"precompute_ref_log_probs": True, "rl_adapter_ref_model": True, "dpo_use_logits_to_keep": False,
            "max_prompt_len": 512, "remove_unused_columns": False, "dpo_norm_loss": False,
            "dpo_padding_free": True, "sample_packing": False, "train_on_inputs": False}
    code, text, recipe = _port(tmp_path, _rl("dpo", **keys))
    assert code == 0, capsys.readouterr().err
    flat = _flat(text)
    assert recipe["sample_packing"] is True and "train_on_inputs" not in recipe
    for key, reason in [("precompute_ref_log_probs", "finetune always precomputes"),
                        ("rl_adapter_ref_model", "no second model is loaded"),
                        ("max_prompt_len", "axolotl passes it to none of its"),
                        ("train_on_inputs", "preference losses score the answers only"),
                        ("dpo_norm_loss", "off is finetune's behaviour")]:
        assert re.search(rf"^# {key}: .* \^ dropped, .*{re.escape(reason)}", flat, re.M), key
    assert "from axolotl `dpo_padding_free: true`" in flat


def test_an_sft_adapter_to_continue_becomes_base_model(tmp_path):
    code, text, recipe = _port(tmp_path, _rl("dpo", lora_model_dir="outputs/sft-lora", adapter="lora"))
    assert code == 0 and recipe["base_model"] == "outputs/sft-lora"
    assert "axolotl's base_model `org/model` is the base the adapter names" in _flat(text)


def test_online_rl_is_refused_and_nothing_is_written(tmp_path, capsys):
    code, text, _ = _port(tmp_path, _rl("ebft"))  # `rl: grpo` ports: tests/test_port_grpo.py
    assert code == 2 and not text
    assert "online RL" in capsys.readouterr().err


def test_rl_keys_in_a_recipe_without_rl_are_dropped(tmp_path):
    source = {"base_model": "org/model", "datasets": [{"path": "d.jsonl", "type": "alpaca"}], "rl_beta": 0.1,
              "dpo_use_weighting": True}
    code, text, recipe = _port(tmp_path, source)
    assert code == 0 and "rl_beta" not in recipe and "dpo_use_weighting" not in recipe
    assert "# rl_beta: 0.1 ^ dropped: a preference-tuning key, which axolotl reads only with `rl:`" in _flat(text)


def test_validate_names_the_finetune_spelling_of_rl_keys(tmp_path, capsys):
    path = tmp_path / "a.yml"
    path.write_text(yaml.safe_dump({"base_model": "x", "rl": "dpo", "cpo_alpha": 1.0,
                                    "datasets": [{"path": "d.jsonl", "type": "chatml.intel"}]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "write `method: dpo`" in err and "write `rpo_alpha`" in err
    assert "axolotl's `chatml.intel` is a preference dataset type" in err


def test_deduplicate_dpo_example_trains_each_pair_once(tmp_path, tiny_model_dir, capsys):
    """Issue 33 items 6 and 9 on axolotl's lora-1b-deduplicate-dpo example: the same `{conversation, chosen,
    rejected}` dataset twice with `dataset_exact_deduplication: true`. Ported, it loads (exit 0), reads axolotl's
    records as they are through `map:`, and trains every pair once (it trained each twice, after the records had
    been renamed by hand)."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    code, text, recipe = _port(tmp_path, RL_ASSETS / "lora-1b-deduplicate-dpo.yml", f"base_model={tiny_model_dir}",
                               "datasets.0.path=pairs.jsonl", "datasets.1.path=pairs.jsonl", "load_in_8bit=false",
                               "attn_implementation=sdpa", "optimizer=adamw_torch")
    assert code == 0, capsys.readouterr().err
    assert recipe["dataset_exact_deduplication"] is True and "convert the records" not in capsys.readouterr().out
    assert [d["map"] for d in recipe["datasets"]] == [{"messages": "conversation"}] * 2
    rng = random.Random(2)
    write_jsonl(tmp_path / "pairs.jsonl", [
        {"conversation": [{"role": "system", "content": sentence(rng)}, {"role": "user", "content": sentence(rng)}],
         "chosen": {"role": "assistant", "content": "yes " + sentence(rng)},
         "rejected": {"role": "assistant", "content": "no " + sentence(rng)}} for _ in range(6)])
    ported = load_recipe(tmp_path / "recipe.yml")
    ported.cache_dir = str(tmp_path / "cache")
    stats = build_dataset(ported, load_tokenizer(ported)).stats
    assert stats["records"] == 6 and stats["dropped_duplicates"] == 6 and stats["train"]["examples"] == 6
