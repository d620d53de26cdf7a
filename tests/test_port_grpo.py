"""`finetune port` on axolotl's GRPO recipes: `rl: grpo` -> `method: grpo`, the `trl:` block key by key (ported,
dropped with why, or kept for a decision), reward_funcs -> `rewards:`, the vLLM keys dropped (generation runs in the
training process), and a dataset transform -> `type: prompt` plus the command that runs it once."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_jsonl
from finetune.cli import main
from finetune.recipe import load_recipe
from finetune.recipe.methods import method_settings
from test_port import _accounted_for
from test_port_preference import _port

GRPO_ASSETS = Path(__file__).parent / "assets" / "axolotl" / "rl" / "grpo"
QUICKSTART = "grpo-quickstart.yml"


def _quickstart(tmp_path) -> dict:
    """axolotl's quick-start config and its rewards.py, copied into tmp_path (the ported recipe is written there
    too, so `rewards.py:NAME` resolves beside it)."""
    for path in GRPO_ASSETS.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return yaml.safe_load((GRPO_ASSETS / QUICKSTART).read_text())


def _flat(text: str) -> str:
    """The recipe's comments with their wrapped lines joined (a dropped key's `^` line onto the key, `trl.KEY` too)."""
    return re.sub(r"\n#(?: {3,}| {2}(?=\^))", " ", text)


REWARDS = "def correct(completions, **kwargs):\n    return [1.0 for _ in completions]\n"


def _grpo(**keys) -> dict:
    """A GRPO recipe whose reward `rewards.correct` is importable: run the port from a folder holding rewards.py
    (validation imports every reward function)."""
    trl = {"num_generations": 4, "max_completion_length": 64, "reward_funcs": ["rewards.correct"], **keys.pop("trl", {})}
    return {"base_model": "org/model", "rl": "grpo", "adapter": "lora", "trl": trl, "sequence_len": 128,
            "micro_batch_size": 4, "gradient_accumulation_steps": 1, "datasets": [{"path": "prompts.jsonl"}], **keys}


def test_axolotl_grpo_quickstart_ports_with_only_the_model_to_point(tmp_path, tiny_model_dir, capsys):
    source = _quickstart(tmp_path)
    code, text, recipe = _port(tmp_path, tmp_path / QUICKSTART, f"base_model={tiny_model_dir}")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    missing = [k for k in source if not _accounted_for(k, text, recipe)]
    missing += [f"trl.{k}" for k in source["trl"] if not _accounted_for(f"trl.{k}", text, recipe)
                and f"`trl.{k}: " not in _flat(text)]
    assert not missing, f"keys neither ported nor commented: {missing}"
    for key in source["datasets"][0]:
        assert key in recipe["datasets"][0] or f"datasets[0].{key}" in text, key
    loaded = load_recipe(tmp_path / "recipe.yml")  # the file as written loads, comments and all
    assert loaded.method == "grpo" and loaded.adapter == "lora" and loaded.lora_target_modules == "all-linear"
    # a FILE is resolved against the recipe's folder when the recipe loads
    assert [(r.function, r.weight) for r in loaded.rewards] == [(f"{tmp_path / 'rewards.py'}:accuracy_reward", 1.0),
                                                               (f"{tmp_path / 'rewards.py'}:format_reward", 0.5)]
    settings = method_settings(loaded)
    assert settings["num_generations"] == 8 and settings["max_completion_length"] == 512
    assert settings["temperature"] == 0.7 and settings["rl_beta"] == 0.0  # no beta: TRL's 0, finetune's too
    assert settings["scale_rewards"] == "group" and settings["loss_type"] == "dapo"  # TRL 1.16's defaults
    # prompts keep the 512 tokens axolotl's sequence_len names, the completions come on top
    assert loaded.sequence_len == 1024 and loaded.micro_batch_size == 2 and loaded.gradient_accumulation_steps == 4
    assert loaded.datasets[0].type == "prompt" and recipe["datasets"][0]["path"] == "gsm8k.prompts.jsonl"
    assert "vllm" not in recipe and "trl" not in recipe and "skip_prepare_dataset" not in recipe
    flat = _flat(text)
    assert re.search(r"^# vllm:", text, re.M) and "no vLLM server to start" in flat
    for key in ("use_vllm", "vllm_server_host", "vllm_server_port", "vllm_lora_sync", "use_data_producer"):
        assert re.search(rf"^# trl\.{key}: .* \^ dropped, not needed: finetune generates", flat, re.M), key
    # what is left to do is said once the recipe is written: the transform's command, runnable as it is
    assert "before training, convert the records of datasets[0] (openai/gsm8k): run axolotl's transform" in printed.out
    assert ("datasets.load_dataset('openai/gsm8k', 'main', split='train').map(fn, **kw).to_json('gsm8k.prompts.jsonl')"
            in printed.out)


def _command(printed: str) -> list[str]:
    return shlex.split(re.search(r"`(python -c \"[^`]+\")`", printed).group(1))


def test_the_transforms_command_writes_the_records_the_ported_recipe_reads(tmp_path, tiny_model_dir, capsys):
    """The quick start with a local copy of GSM8K's fields: the printed command runs axolotl's own transform over
    them, and the ported recipe then reads what it wrote as prompt records, with the `answer` column the reward
    function reads."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    source = _quickstart(tmp_path)
    source["datasets"] = [{"path": "gsm8k.jsonl", "type": "rewards.prompt_transform", "split": "train"}]
    write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i}\n#### {2 * i}"}
                                           for i in range(12)])
    code, text, recipe = _port(tmp_path, source, f"base_model={tiny_model_dir}", "output_dir=out",
                               "cache_dir=cache", "precision=fp32", "attn_implementation=sdpa")
    printed = capsys.readouterr().out
    assert code == 0 and recipe["datasets"] == [{"path": "gsm8k.prompts.jsonl", "type": "prompt"}]
    command = _command(printed)
    assert "datasets.load_dataset('json', data_files='gsm8k.jsonl', split='train')" in command[-1]
    ran = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    written = [json.loads(line) for line in (tmp_path / "gsm8k.prompts.jsonl").read_text().splitlines()]
    assert len(written) == 12 and "question" not in written[0]  # the transform's remove_columns applied
    assert written[3]["answer"] == "6" and written[3]["prompt"][-1] == {"role": "user", "content": "What is 3 + 3?"}
    recipe = load_recipe(tmp_path / "recipe.yml")
    prepared = build_dataset(recipe, load_tokenizer(recipe))
    assert prepared.stats["train"]["examples"] == 12  # val_set_size 0.0: every prompt trains
    # each prompt keeps its record: the `answer` column accuracy_reward reads
    assert sorted(json.loads(prepared.train[0]["record"])) == ["answer", "prompt"]


def test_trl_settings_port_as_axolotl_passes_them_to_trl(tmp_path, capsys):
    (tmp_path / "rewards.py").write_text("def correct(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    trl = {"beta": 0.04, "loss_type": "dr_grpo", "scale_rewards": False, "epsilon": 0.2, "epsilon_high": 0.28,
           "num_iterations": 2, "mask_truncated_completions": True, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
           "log_completions": True, "vllm_mode": "colocate", "importance_sampling_level": "token",
           "generation_batch_size": 16, "some_future_key": 3}
    code, text, recipe = _port(tmp_path, _grpo(trl=trl, rl_beta=0.5))
    assert code == 0, capsys.readouterr().err
    settings = method_settings(load_recipe(tmp_path / "recipe.yml"))
    assert settings["rl_beta"] == 0.04  # trl.beta wins over rl_beta, as in axolotl's builder
    assert settings["scale_rewards"] == "none"  # TRL reads False as "none"
    assert (settings["loss_type"], settings["epsilon_high"], settings["num_iterations"]) == ("dr_grpo", 0.28, 2)
    assert settings["mask_truncated_completions"] is True and (settings["top_p"], settings["top_k"]) == (0.9, 50)
    flat = _flat(text)
    assert "from axolotl `trl.scale_rewards: false`: TRL reads `False` as `none`" in flat
    assert re.search(r"^# rl_beta: 0.5 \^ dropped: axolotl passes `trl.beta` as TRL's beta instead", flat, re.M)
    for key, reason in [("min_p", "samples with temperature, top_p and top_k only"),
                        ("log_completions", "output_dir/completions.jsonl"), ("vllm_mode", "no vLLM server"),
                        ("importance_sampling_level", "finetune's behaviour already"),
                        ("generation_batch_size", "each optimizer step generates its own completions"),
                        ("some_future_key", "`trl.some_future_key` configures axolotl's GRPO trainer")]:
        assert re.search(rf"^# trl\.{key}: .* \^ dropped, .*{re.escape(reason)}", flat, re.M), key


@pytest.mark.parametrize("beta_keys, expected", [({"rl_beta": 0.02}, 0.02), ({"orpo_alpha": 0.03}, 0.03),
                                                 ({"rl_beta": 0.02, "orpo_alpha": 0.03}, 0.02), ({}, 0.0)])
def test_trls_beta_is_axolotls_trl_beta_else_rl_beta_else_orpo_alpha(tmp_path, beta_keys, expected):
    (tmp_path / "rewards.py").write_text(REWARDS)
    code, text, _ = _port(tmp_path, _grpo(**beta_keys))
    assert code == 0
    assert method_settings(load_recipe(tmp_path / "recipe.yml"))["rl_beta"] == expected


def test_what_finetune_cannot_honour_is_kept_for_a_decision(tmp_path, capsys):
    trl = {"loss_type": "cispo", "importance_sampling_level": "sequence", "temperature": 0.9,
           "multi_objective_aggregation": "normalize_then_sum"}
    code, text, recipe = _port(tmp_path, _grpo(trl=trl))
    err = capsys.readouterr().err
    assert code == 1 and "needs edits before it trains" in err
    assert recipe["trl"] == {"loss_type": "cispo", "importance_sampling_level": "sequence",
                             "multi_objective_aggregation": "normalize_then_sum"}
    assert recipe["temperature"] == 0.9  # the rest ported as usual
    flat = _flat(text)
    assert "NEEDS YOUR DECISION: `trl.loss_type`: TRL's `cispo` loss is not in finetune" in flat
    assert "sequence-level importance ratios (GSPO)" in flat and "(GDPO) is not in finetune" in flat


def test_a_reward_model_is_kept_for_a_decision(tmp_path, capsys):
    trl = {"reward_funcs": ["OpenAssistant/reward-model-deberta-v3-large-v2", "rewards.correct"],
           "reward_weights": [1.0, 0.3]}
    code, text, recipe = _port(tmp_path, _grpo(trl=trl))
    assert code == 1 and "rewards" not in recipe and recipe["trl"]["reward_funcs"][0].startswith("OpenAssistant/")
    assert recipe["trl"]["reward_weights"] == [1.0, 0.3]  # kept beside the functions they weigh
    assert "a reward model finetune cannot find as a folder beside the recipe (a hub id" in _flat(text)
    assert "write `rewards: [{model: DIR}]`" in _flat(text)


def test_reward_functions_become_a_file_beside_the_recipe_or_a_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "scoring.py").write_text("def exact(completions, **kwargs):\n    return []\n")
    trl = {"reward_funcs": ["pkg.scoring.exact", "rewards.rand_reward_func"], "reward_weights": [2, 1]}
    code, text, recipe = _port(tmp_path, _grpo(trl=trl))
    assert recipe["rewards"] == [{"function": "pkg/scoring.py:exact", "weight": 2.0},
                                 {"function": "rewards:rand_reward_func", "weight": 1.0}]
    assert "no rewards.py beside the recipe, so it must be importable when training" in _flat(text)
    assert code == 1  # and validation, which imports each reward, says that it is not


def test_axolotl_rlhf_docs_grpo_example_ports_and_names_its_one_edit(tmp_path, capsys):
    """The GRPO example of axolotl's docs/rlhf.qmd (commit 067b021): a full fine-tune with `trl.beta: 0.001`. finetune
    reads GRPO's reference as the model with its adapter switched off, so a KL term needs an adapter: the port
    writes the recipe and says so, rather than guess."""
    source = {"base_model": "Qwen/Qwen2.5-1.5B-Instruct", "rl": "grpo",
              "trl": {"beta": 0.001, "max_completion_length": 256, "use_vllm": True, "num_generations": 4,
                      "reward_funcs": ["rewards.rand_reward_func"], "reward_weights": [1.0]},
              "datasets": [{"path": "openai/gsm8k", "name": "main", "type": "rewards.oai_gsm8k_transform"}],
              "micro_batch_size": 4}
    code, text, recipe = _port(tmp_path, source)
    err = capsys.readouterr().err
    assert code == 1 and recipe["rl_beta"] == 0.001 and recipe["method"] == "grpo"
    assert "`rl_beta` > 0 compares the policy with the starting model" in err and "adapter: lora" in err
    assert recipe["rewards"] == [{"function": "rewards:rand_reward_func", "weight": 1.0}]
    assert recipe["datasets"] == [{"path": "gsm8k.prompts.jsonl", "type": "prompt"}]


@pytest.mark.parametrize("rl", ["gdpo", "ebft"])
def test_online_rl_finetune_does_not_train_is_refused(tmp_path, capsys, rl):
    code, text, _ = _port(tmp_path, _grpo(rl=rl))
    assert code == 2 and not text
    assert "rl: grpo" in capsys.readouterr().err


def test_validate_on_an_axolotl_grpo_recipe_names_the_equivalents(tmp_path, capsys):
    path = tmp_path / "a.yml"
    path.write_text(yaml.safe_dump({"base_model": "x", "vllm": {"host": "0.0.0.0"}, "skip_prepare_dataset": True,
                                    "datasets": [{"path": "d.jsonl", "type": "rewards.prompt_transform"}]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no vLLM server to start" in err and "tokenizes the prompt records once" in err
    assert "`finetune port` writes the command that runs the transform once" in err
