"""`finetune port` on axolotl's reward-model recipes: `reward_model: true` -> `method: reward`, its keys, its
`bradley_terry.*` dataset types, and what stays refused (process reward models; a reward model and `rl:` together)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from finetune.cli import main
from finetune.recipe import load_recipe
from test_port import _accounted_for, _flat
from test_port_preference import _port

REWARD_ASSETS = Path(__file__).parent / "assets" / "axolotl" / "reward"


@pytest.mark.parametrize("name", sorted(p.name for p in REWARD_ASSETS.glob("*.y*ml")))
def test_axolotl_reward_model_examples_port_and_validate(name, tmp_path, tiny_model_dir, capsys):
    source = yaml.safe_load((REWARD_ASSETS / name).read_text())
    code, text, recipe = _port(tmp_path, REWARD_ASSETS / name, f"base_model={tiny_model_dir}",
                               "chat_template=chatml", "optimizer=adamw_torch", "precision=fp32")
    assert code == 0, capsys.readouterr().err
    missing = [k for k in source if not _accounted_for(k, text, recipe)]
    assert not missing, f"{name}: keys neither ported nor commented: {missing}"
    loaded = load_recipe(tmp_path / "recipe.yml")
    assert loaded.method == "reward" and loaded.datasets[0].type == "preference"
    flat = _flat(text)
    assert '{"system" (optional), "input", "chosen", "rejected"} strings' in flat
    assert "BEFORE TRAINING, write each record as" in flat  # strings in chat turns: the records need converting
    assert "`sample_packing: true` packs whole pairs with each prompt held once" in flat
    assert "pad_to_sequence_len" not in recipe and "num_labels" not in recipe and "model_type" not in recipe


def test_centering_ports_and_a_multi_label_head_is_kept_for_a_decision(tmp_path):
    source = {"base_model": "org/model", "reward_model": True, "center_rewards_coefficient": 0.01, "num_labels": 3,
              "datasets": [{"path": "pairs.jsonl", "type": "bradley_terry.chat_template"}], "train_on_inputs": True}
    code, text, recipe = _port(tmp_path, source)
    assert recipe["method"] == "reward" and recipe["center_rewards_coefficient"] == 0.01
    assert recipe["num_labels"] == 3 and code == 1  # kept as written: the recipe does not load until decided
    assert "NEEDS YOUR DECISION: num_labels 3: a reward model scores with one output" in _flat(text)
    assert "train_on_inputs" not in recipe


def test_process_reward_models_and_a_reward_model_under_rl_are_refused(tmp_path, capsys):
    for source, said in (({"base_model": "x", "process_reward_model": True}, "TRL moved its PRMTrainer"),
                         ({"base_model": "x", "reward_model": True, "rl": "dpo"}, "a reward model or a policy")):
        src = tmp_path / "a.yml"
        src.write_text(yaml.safe_dump(source))
        assert main(["port", str(src), "-o", str(tmp_path / "r.yml")]) == 2
        assert said in capsys.readouterr().err and not (tmp_path / "r.yml").exists()


def test_a_grpo_reward_model_folder_ports_as_a_model_reward(tmp_path, tiny_model_dir):
    from test_port_grpo import _grpo

    folder = tmp_path / "rm"
    folder.mkdir()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(architectures=["LlamaForSequenceClassification"], id2label={"0": "LABEL_0"})
    (folder / "config.json").write_text(json.dumps(config))
    code, text, recipe = _port(tmp_path, _grpo(trl={"reward_funcs": ["rm", "rewards.correct"],
                                                    "reward_weights": [0.5, 1.0]}))
    assert recipe["rewards"][0] == {"model": "rm", "weight": 0.5}
    assert "`rm` is a reward model, scored in the training process" in _flat(text)
