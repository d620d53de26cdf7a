"""`finetune eval` of a preference run measures it against the model the run started from (its reference),
for every way of starting: an SFT adapter continued, an SFT adapter merged and fully fine-tuned (issue 33,
item 1). Its rewards on the held-out pairs equal the run's own final eval rewards on the same pairs."""

from __future__ import annotations

import json
import random

import pytest
import yaml

from conftest import make_records, sentence, write_jsonl
from finetune.cli import main as cli_main


@pytest.fixture(scope="module")
def sft(tmp_path_factory, tiny_model_dir):
    """An SFT LoRA run of the tiny model that moves it far from where it started (a high learning rate)."""
    root = tmp_path_factory.mktemp("sft")
    write_jsonl(root / "chat.jsonl", make_records("chat", 32))
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 8, "lora_dropout": 0.0, "max_steps": 6, "micro_batch_size": 8,
              "learning_rate": 5e-2, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"],
              "logging_steps": 2}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli_main(["train", str(root / "recipe.yml")]) == 0
    return root / "out"


def _dpo_from(sft_out, root, adapter: str) -> dict:
    rng = random.Random(5)
    pairs = [{"prompt": sentence(rng), "chosen": " yes good " + sentence(rng), "rejected": " no bad " + sentence(rng)}
             for _ in range(24)]
    write_jsonl(root / "pairs.jsonl", pairs)
    recipe = {"base_model": str(sft_out), "method": "dpo", "rl_beta": 0.5, "adapter": adapter,
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}], "val_set_size": 8, "max_steps": 3,
              "micro_batch_size": 8, "learning_rate": 1e-2 if adapter != "none" else 1e-3, "output_dir": "out",
              "cache_dir": "cache", "report_to": ["none"], "logging_steps": 1}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli_main(["train", str(root / "recipe.yml")]) == 0
    assert cli_main(["eval", str(root / "out"), "--generations", "0"]) == 0
    run = json.loads((root / "out" / "run.json").read_text())
    report = json.loads((root / "out" / "eval" / "report.json").read_text())
    return {"trained": run["preference"]["eval_metrics"], "report": report}


@pytest.mark.parametrize("adapter", ["lora", "none", "lora on merged"])
def test_eval_rewards_of_a_dpo_run_from_an_sft_adapter_are_the_runs_own(sft, tmp_path, adapter):
    """lora: the SFT adapter keeps training; none: it is merged into its base, then fully fine-tuned; lora on
    merged: a fresh LoRA on the SFT run merged by `finetune merge`. Every way the reference was base + SFT, so
    eval's base is too: its rewards are the run's last eval rewards, not the SFT stage counted as reward."""
    start = sft
    if adapter == "lora on merged":
        start = tmp_path / "merged"
        assert cli_main(["merge", str(sft), "--output", str(start)]) == 0
        adapter = "lora"
    got = _dpo_from(start, tmp_path, adapter)
    reward, trained = got["report"]["preference"]["reward"], got["trained"]
    assert reward["pairs"] == 8
    assert reward["chosen_reward"] == pytest.approx(trained["eval_rewards/chosen"], abs=2e-4)
    assert reward["rejected_reward"] == pytest.approx(trained["eval_rewards/rejected"], abs=2e-4)
    assert reward["reward_margin"] == pytest.approx(trained["eval_rewards/margins"], abs=2e-4)
    # the report names the base it compared with: the SFT model the run started from
    assert str(start) in got["report"]["base"]


def test_a_run_whose_starting_adapter_is_gone_is_refused(sft, tmp_path, capsys):
    """Without the adapter it continued, the model the run started from cannot be rebuilt: comparing with the
    adapter's own base instead would count the SFT stage as this run's gain. One message, no traceback."""
    import shutil

    start = tmp_path / "sft_copy"
    shutil.copytree(sft, start)
    _dpo_from(start, tmp_path, "lora")
    shutil.rmtree(start)
    capsys.readouterr()
    assert cli_main(["eval", str(tmp_path / "out"), "--generations", "0"]) != 0
    err = capsys.readouterr().err
    assert f"started from `{start}`, which is gone" in err and "Traceback" not in err, err
