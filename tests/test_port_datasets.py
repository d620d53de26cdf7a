"""axolotl recipes whose datasets are hub ids with field mappings port with nothing to fix by hand (issue 22): the
Llama-3 full fine-tune on `tatsu-lab/alpaca` and the Falcon-H1 QLoRA on `cgato/SlimOrcaDedupCleaned` (sharegpt
turns under `conversations`, from/value). The recipes are written here shaped like axolotl's examples
(examples/llama-3/fft-8b.yaml, examples/falcon-h1/falcon-h1-1b-deep-qlora.yaml). With the data in a hub-shaped
folder of that name beside the recipe (parquet shards and a card, as `hf download` leaves it), the
ported recipe trains; the `--set` overrides only fit the run to a CPU and the tiny model."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from finetune.cli import main
from finetune.errors import DataError
from finetune.recipe import load_recipe
from tests.conftest import make_records

LLAMA3_FFT = """
base_model: NousResearch/Meta-Llama-3.1-8B
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
dataset_prepared_path: last_run_prepared
val_set_size: 0.05
output_dir: ./outputs/out
sequence_len: 8192
sample_packing: true
gradient_accumulation_steps: 8
micro_batch_size: 1
num_epochs: 1
optimizer: paged_adamw_8bit
lr_scheduler: cosine
learning_rate: 2e-5
bf16: auto
tf32: false
gradient_checkpointing: true
logging_steps: 1
flash_attention: true
warmup_steps: 100
evals_per_epoch: 2
saves_per_epoch: 1
weight_decay: 0.0
special_tokens:
  pad_token: <|end_of_text|>
"""

FALCON_H1_QLORA = """
base_model: tiiuae/Falcon-H1-1.5B-Deep-Instruct
load_in_8bit: false
load_in_4bit: true
datasets:
  - path: cgato/SlimOrcaDedupCleaned
    type: chat_template
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
dataset_prepared_path: last_run_prepared
val_set_size: 0.0
output_dir: ./outputs/out
adapter: qlora
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
sequence_len: 2048
sample_packing: false
gradient_accumulation_steps: 4
micro_batch_size: 1
num_epochs: 1
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
tf32: true
gradient_checkpointing: true
logging_steps: 1
flash_attention: true
warmup_ratio: 0.1
evals_per_epoch: 1
saves_per_epoch: 1
weight_decay: 0.0
"""

CPU = ["adapter=lora", "load_in_4bit=false", "attn_implementation=sdpa", "precision=fp32", "optimizer=adamw_torch",
       "sequence_len=256", "micro_batch_size=2", "gradient_accumulation_steps=1", "max_steps=2", "report_to=[none]",
       "output_dir=out", "cache_dir=cache", "gradient_checkpointing=off"]


def _port(tmp_path, text: str, *overrides: str) -> tuple[int, str, dict]:
    source = tmp_path / "axolotl.yml"
    source.write_text(text)
    out = tmp_path / "recipe.yml"
    code = main(["port", str(source), "-o", str(out), "--force", *[a for o in overrides for a in ("--set", o)]])
    return code, out.read_text(), yaml.safe_load(out.read_text())


def _hub_folder(root, rows: list[dict], shards: int = 2):
    """A dataset folder as the hub stores it: data/train-0000i-of-0000n.parquet and a README.md card."""
    from datasets import Dataset

    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                    "    path: data/train-*\n---\n# dataset card\n")
    for i in range(shards):
        Dataset.from_list(rows[i::shards]).to_parquet(str(root / "data" / f"train-{i:05d}-of-{shards:05d}.parquet"))


def slimorca_rows(n: int) -> list[dict]:
    names = {"user": "human", "assistant": "gpt"}
    return [{"conversations": [{"from": "system", "value": "You are an AI assistant.", "weight": None}]
             + [{"from": names[m["role"]], "value": m["content"], "weight": float(m["role"] == "assistant")}
                for m in r["messages"]]} for r in make_records("chat", n)]


def test_sharegpt_recipe_ports_its_field_mappings_and_nothing_is_left_to_fix(tmp_path, capsys):
    code, text, recipe = _port(tmp_path, FALCON_H1_QLORA)
    printed = capsys.readouterr().out
    assert code == 0 and "is a valid finetune recipe" in printed
    assert recipe["datasets"] == [{"path": "cgato/SlimOrcaDedupCleaned", "type": "chat",
                                   "map": {"messages": "conversations", "role": "from", "content": "value"}}]
    assert "before training" not in printed and "rename the field" not in text
    assert "are read from the Hugging Face hub when training" in printed
    # offline, the hub id is one message saying how to get the files
    from finetune.data import build_dataset

    with pytest.raises(DataError, match="hf download --repo-type dataset cgato/SlimOrcaDedupCleaned"):
        build_dataset(load_recipe(tmp_path / "recipe.yml"), None)


def test_field_keys_roles_and_hub_options_port_to_map_and_roles(tmp_path, capsys):
    code, text, recipe = _port(tmp_path, """
base_model: m
datasets:
  - path: org/chats
    type: sharegpt
    name: en
    split: train[:80%]
    revision: v2
    data_files: [data/en-*.parquet]
    ds_type: parquet
    field_messages: dialog
    message_field_role: speaker
    message_field_content: text
    field_system: sys
    roles:
      user: [human, me]
      assistant: [gpt, bot]
      tool: [fn]
  - path: org/qa
    type: alpaca
    field_instruction: question
    field_input: context
    field_output: answer
    field_system: sys
""")
    assert code == 0, capsys.readouterr()
    chat, qa = recipe["datasets"]
    assert chat == {"path": "org/chats", "type": "chat", "name": "en", "split": "train[:80%]", "revision": "v2",
                    "data_files": ["data/en-*.parquet"],
                    "map": {"messages": "dialog", "role": "speaker", "content": "text", "system": "sys"},
                    "roles": {"me": "user", "bot": "assistant"}}
    assert qa == {"path": "org/qa", "type": "instruction",
                  "map": {"instruction": "question", "input": "context", "output": "answer", "system": "sys"}}
    flat = re.sub(r"\n#\s+", " ", text)
    assert "datasets[0].field_messages: dialog -> `map: {messages: dialog}`" in flat
    assert "roles tool: dropped, finetune's turns are system, user and assistant" in flat
    assert "datasets[0].ds_type: parquet: dropped, not needed" in flat


def test_falcon_h1_sharegpt_recipe_ports_and_trains_from_a_hub_shaped_folder(tmp_path, tiny_model_dir, capsys):
    from finetune.train import run_training

    _hub_folder(tmp_path / "cgato" / "SlimOrcaDedupCleaned", slimorca_rows(12))
    code, _, recipe = _port(tmp_path, FALCON_H1_QLORA, f"base_model={tiny_model_dir}", *CPU)
    assert code == 0, capsys.readouterr()
    assert recipe["datasets"][0]["path"] == "cgato/SlimOrcaDedupCleaned"  # as axolotl wrote it: no hand edit
    summary = run_training(load_recipe(tmp_path / "recipe.yml"))
    assert summary["steps"] == 2
    err = capsys.readouterr().err
    assert "12 read, 12 mapped" in err
    report = json.loads(next((tmp_path / "cache" / "ingested").glob("*.report.json")).read_text())
    assert report["records_mapped"] == 12 and report["dropped"] == {}


def test_llama3_alpaca_recipe_ports_and_trains_from_a_hub_shaped_folder(tmp_path, tiny_model_dir, capsys):
    from finetune.train import run_training

    rows = [{**r, "text": f"{r['instruction']}\n{r['output']}"} for r in make_records("instruction", 16)]
    _hub_folder(tmp_path / "tatsu-lab" / "alpaca", rows, shards=1)
    code, _, recipe = _port(tmp_path, LLAMA3_FFT, f"base_model={tiny_model_dir}", *CPU, "adapter=none",
                            "sample_packing=false", "val_set_size=0", "special_tokens={}")
    assert code == 0, capsys.readouterr()
    assert recipe["datasets"] == [{"path": "tatsu-lab/alpaca", "type": "instruction"}]
    summary = run_training(load_recipe(tmp_path / "recipe.yml"))
    assert summary["steps"] == 2 and summary["trainable_parameters"] == summary["total_parameters"]
