"""IPO, SimPO, ORPO and KTO train end to end like DPO: each learns held-out pairs from the tiny model, the
reference-free methods skip the reference pass, KTO reads unpaired records and pairs, and its KL partners
are a seeded derangement within each split."""

from __future__ import annotations

import json
import random

import pytest

from conftest import sentence, write_jsonl
from test_preference_data import chat_pair, dpo_recipe


@pytest.mark.parametrize("method", ["ipo", "simpo", "orpo"])
def test_paired_methods_learn_held_out_pairs(tmp_path, tiny_model_dir, method):
    from finetune.train.run import run_training

    summary = run_training(dpo_recipe(tmp_path, tiny_model_dir, method=method, sample_packing=method == "simpo"))
    last = [e for e in summary["log_history"] if "eval_rewards/accuracies" in e][-1]
    assert last["eval_rewards/accuracies"] > 0.75 and last["eval_rewards/margins"] > 0
    assert last["eval_loss"] < summary["eval_loss_before"]
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["method"] == method
    has_reference = method == "ipo"
    assert (record["preference"]["reference_pass_s"] is not None) == has_reference
    assert (tmp_path / "cache" / "prepared" / "reference").is_dir() == has_reference
    if method == "orpo":
        assert "eval_log_odds_ratio" in last and record["preference"]["settings"] == {"orpo_alpha": 0.1}


def test_kto_learns_from_unpaired_records(tmp_path, tiny_model_dir):
    from finetune.train.run import run_training

    rng = random.Random(5)
    records = []
    for _ in range(48):
        pair = chat_pair(rng)
        good = rng.random() < 0.5
        records.append({"prompt": pair["prompt"], "completion": pair["chosen" if good else "rejected"], "label": good})
    write_jsonl(tmp_path / "kto.jsonl", records)
    recipe = dpo_recipe(tmp_path, tiny_model_dir, method="kto", datasets=[{"path": "kto.jsonl", "type": "unpaired"}],
                        kto_desirable_weight=1.5)
    summary = run_training(recipe)
    # at the start, policy == reference and z = 0: every example's loss is weight x 0.5
    assert 0.5 < summary["eval_loss_before"] < 0.75  # desirable examples weigh 1.5, undesirable 1.0
    last = [e for e in summary["log_history"] if "eval_rewards/margins" in e][-1]
    assert last["eval_rewards/margins"] > 0.05
    assert last["eval_loss"] < summary["eval_loss_before"] and "eval_kl" in last
    assert "rewards/accuracies" not in json.dumps(summary["log_history"])  # KTO has no pairs to rank


def test_kto_kl_partners_are_a_seeded_derangement_within_each_split():
    from datasets import Dataset

    from finetune.data.preference.rows import PairStore

    def split(n, offset):
        return Dataset.from_dict({"prompt_ids": [[offset + i] for i in range(n)],
                                  "completion_ids": [[100 + offset + i] for i in range(n)],
                                  "label": [i % 2 == 0 for i in range(n)]})

    store = PairStore(split(7, 0), split(3, 50), seed=1)
    partners = store.kl_partner
    assert sorted(partners[:7]) == list(range(7)) and sorted(partners[7:]) == list(range(7, 10))
    assert all(partner != item for item, partner in enumerate(partners))
    assert store.kl_sequences(0) == [([0], [100 + partners[0]])]
    assert PairStore(split(7, 0), split(3, 50), seed=1).kl_partner == partners
    assert PairStore(split(7, 0), split(3, 50), seed=2).kl_partner != partners
    assert PairStore(split(1, 0), seed=0).kl_partner == [0]  # one example: its own completion (as TRL's last chunk)


def test_kto_with_one_label_is_refused(tmp_path, tiny_model_dir):
    from finetune.data import build_dataset
    from finetune.errors import DataError
    from finetune.model.loader import load_tokenizer

    rng = random.Random(2)
    write_jsonl(tmp_path / "kto.jsonl", [{"prompt": sentence(rng), "completion": sentence(rng), "label": True}
                                         for _ in range(6)])
    recipe = dpo_recipe(tmp_path, tiny_model_dir, method="kto", datasets=[{"path": "kto.jsonl", "type": "unpaired"}])
    with pytest.raises(DataError, match="needs both labels"):
        build_dataset(recipe, load_tokenizer(recipe))
