"""How a preference run starts (issue 33, items 3 and 4).

3. The eval before training reads the reference table instead of scoring the eval split again: until the first
   training step the policy IS the reference, so its log-probs are the table's rows. The reference pass's time
   is its own (reference_pass_s), not the eval's runtime nor the training throughput's.
4. With dropout in the model being trained (an adapter continued with lora_dropout), step 1's loss is not log 2:
   the policy trains with dropout, the reference was scored without it. The run says so.
"""

from __future__ import annotations

import logging
import math
import random
import sys

import pytest
import yaml

from conftest import make_records, write_jsonl
from test_preference_data import chat_pair, dpo_recipe

LOG2 = math.log(2)


def _spy_forwards(monkeypatch) -> list[tuple[str, bool]]:
    """(caller, training) of every response_logps call: compute_table (the reference pass) or compute_loss."""
    import finetune.model.sequence_logps as sequence_logps

    calls, real = [], sequence_logps.response_logps

    def spy(model, *args, **kwargs):
        calls.append((sys._getframe(1).f_code.co_name, model.training))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sequence_logps, "response_logps", spy)
    return calls


def _kto_recipe(tmp_path, tiny_model_dir):
    rng = random.Random(5)
    records = []
    for _ in range(48):
        pair, good = chat_pair(rng), rng.random() < 0.5
        records.append({"prompt": pair["prompt"], "completion": pair["chosen" if good else "rejected"], "label": good})
    write_jsonl(tmp_path / "kto.jsonl", records)
    return dpo_recipe(tmp_path, tiny_model_dir, method="kto", datasets=[{"path": "kto.jsonl", "type": "unpaired"}])


@pytest.mark.parametrize("method", ["dpo", "kto"])
def test_the_eval_before_training_reads_the_reference_table(tmp_path, tiny_model_dir, monkeypatch, method):
    from finetune.train.run import run_training

    calls = _spy_forwards(monkeypatch)
    recipe = _kto_recipe(tmp_path, tiny_model_dir) if method == "kto" else dpo_recipe(tmp_path, tiny_model_dir)
    summary = run_training(recipe.model_copy(update={"max_steps": 3}))
    loss_calls = [training for caller, training in calls if caller == "compute_loss"]
    assert any(caller == "compute_table" for caller, _ in calls)  # the reference pass ran (once, before training)
    first_training = loss_calls.index(True)
    assert not any(not t for t in loss_calls[:first_training]), "the eval before training scored the eval split"
    assert any(not t for t in loss_calls[first_training:])  # the eval after training does score it
    # policy = reference: DPO's loss is exactly log 2; KTO's, with z = 0 and every reward 0, weight x sigmoid(0)
    assert summary["eval_loss_before"] == pytest.approx(LOG2 if method == "dpo" else 0.5, abs=1e-6)


def test_without_an_eval_split_the_reference_pass_is_not_training_time(tmp_path, tiny_model_dir, monkeypatch):
    """The pass then runs inside step 1: train_runtime and the throughput clock leave it out."""
    import time

    import finetune.train.preference.reference as reference
    from finetune.train.run import run_training

    real = reference.compute_table

    def slow(*args, **kwargs):  # a reference pass that takes a known, long time
        time.sleep(3.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "compute_table", slow)
    summary = run_training(dpo_recipe(tmp_path, tiny_model_dir, val_set_size=0).model_copy(update={"max_steps": 2}))
    final = next(e for e in summary["log_history"] if "train_runtime" in e)
    assert final["reference_pass_s"] >= 3.0
    assert final["train_runtime"] < summary["wall_time_s"] - 3.0
    tokens = summary["data"]["train"]["tokens"] if "train" in summary["data"] else None
    assert summary["throughput"]["tokens_per_second"] > 0 and tokens is not None
    # the rate counts the steps only: the tokens of 2 steps over less than the pass's 3 s
    assert summary["throughput"]["tokens_per_second"] * 3.0 > summary["plan"]["tokens_per_step"] * 2


@pytest.fixture(scope="module")
def sft_with_dropout(tmp_path_factory, tiny_model_dir):
    from finetune.cli import main as cli_main

    root = tmp_path_factory.mktemp("sft_dropout")
    write_jsonl(root / "chat.jsonl", make_records("chat", 16))
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 8, "lora_dropout": 0.3, "max_steps": 3, "micro_batch_size": 8,
              "learning_rate": 5e-2, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"]}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli_main(["train", str(root / "recipe.yml")]) == 0
    return root / "out"


def test_dropout_in_a_continued_adapter_is_why_step_1_is_not_log_2(tmp_path, sft_with_dropout, caplog):
    from finetune.train.run import run_training

    recipe = dpo_recipe(tmp_path, sft_with_dropout, learning_rate=1e-12).model_copy(update={"max_steps": 2})
    with caplog.at_level(logging.INFO, logger="finetune"):
        summary = run_training(recipe)
    step1 = summary["log_history"][0]
    assert step1["step"] == 1 and abs(step1["loss"] - LOG2) > 1e-4  # the policy ran with dropout
    assert summary["eval_loss_before"] == pytest.approx(LOG2, abs=1e-6)  # without it: exactly log 2
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "lora_dropout 0.3" in said and "not exactly log 2" in said, said


def test_without_dropout_step_1_is_log_2_and_nothing_is_said(tmp_path, tiny_model_dir, caplog):
    from finetune.train.run import run_training

    recipe = dpo_recipe(tmp_path, tiny_model_dir, learning_rate=1e-12).model_copy(update={"max_steps": 1})
    with caplog.at_level(logging.INFO, logger="finetune"):
        summary = run_training(recipe)
    assert summary["log_history"][0]["loss"] == pytest.approx(LOG2, abs=1e-5)
    assert "not exactly log 2" not in " ".join(r.getMessage() for r in caplog.records)
