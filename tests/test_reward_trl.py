"""The reward model's training path (our tokenization's ids, our collator unpacked, packed and with the prompt shared,
the score read at each sequence's last token, the per-pair Bradley-Terry loss over the step) against TRL 1.16's
RewardTrainer.compute_loss on the same token ids and the same weights, fp32: loss and every gradient within 1e-5,
margins and centering included. And TRL's own tokenization of these plain-text pairs gives our ids.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from conftest import write_jsonl
from test_preference_loss import _assert_same, _backward  # loss and every gradient within 1e-5 of TRL's
PAIRS = [  # plain text, a margin each (TRL's `margin` column), responses of different lengths so rows pad
    {"prompt": "what is the cat on", "chosen": " the mat", "rejected": " a big red river tree", "margin": 0.5},
    {"prompt": "say yes or no", "chosen": " yes", "rejected": " no no no", "margin": 0.0},
    {"prompt": "count to three please", "chosen": " one two three", "rejected": " four", "margin": 1.5},
    {"prompt": "name a colour", "chosen": " red or blue", "rejected": " the number seven", "margin": -0.25},
    {"prompt": "say hi", "chosen": " hi there", "rejected": " go away now please", "margin": 2.0},
]


@pytest.fixture(scope="module")
def reward_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model as a sequence-classification model with a score head drawn away from its tiny start (so
    scores differ by more than noise)."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.normal_(0, 0.5)
    out = tmp_path_factory.mktemp("rm") / "model"
    model.save_pretrained(out)
    return out


def _load(path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)


def _prepared(tmp_path, tiny_model_dir, packed: bool, margins: bool):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.recipe import load_recipe

    pairs = PAIRS if margins else [{k: v for k, v in p.items() if k != "margin"} for p in PAIRS]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    recipe = {"base_model": str(tiny_model_dir), "method": "reward", "sequence_len": 64, "micro_batch_size": 2,
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}], "sample_packing": packed,
              "output_dir": "out", "cache_dir": "cache", "val_set_size": 0, "precision": "fp32", "report_to": ["none"]}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    recipe = load_recipe(tmp_path / "recipe.yml")
    tokenizer = load_tokenizer(recipe)
    return recipe, build_dataset(recipe, tokenizer), tokenizer


def _ours(tmp_path, tiny_model_dir, reward_dir, packed, center: float, margins: bool):
    from transformers import TrainingArguments

    from finetune.data.preference.collate import PreferenceCollator
    from finetune.model.varlen_attention import use_varlen_attention
    from finetune.train.reward.trainer import RewardTrainer

    recipe, prepared, tokenizer = _prepared(tmp_path, tiny_model_dir, bool(packed), margins)
    model = _load(reward_dir)
    if packed == "shared":
        assert use_varlen_attention(model)
    collator = PreferenceCollator(prepared.store, tokenizer.pad_token_id, share_prompt=packed == "shared")
    args = TrainingArguments(output_dir=str(tmp_path / "ours"), report_to="none", use_cpu=True)
    trainer = RewardTrainer(model=model, args=args, center_coefficient=center, data_collator=collator,
                            train_dataset=prepared.train)
    model.train()
    rows = [prepared.train[i] for i in range(len(prepared.train))]
    assert (len(rows) < len(PAIRS)) == bool(packed)
    batch = collator(rows)
    assert ("margin" in batch) == margins and ("shared_prompt_tokens" in batch) == (packed == "shared")
    return _backward(model, trainer.compute_loss(model, batch)), prepared.store


def _trl(tmp_path, tiny_model_dir, reward_dir, store, center: float, margins: bool):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    records = [{"chosen_ids": store.prompts[i] + store.responses[i][0],
                "rejected_ids": store.prompts[i] + store.responses[i][1],
                **({"margin": store.margins[i]} if margins else {})} for i in range(len(store))]
    args = RewardConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                        per_device_train_batch_size=len(records), center_rewards_coefficient=center or None)
    model = _load(reward_dir)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(records),
                            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    model.train()
    batch = trainer.data_collator(records)
    return _backward(model, trainer.compute_loss(model, batch))


@pytest.mark.parametrize("packed, center, margins", [(False, 0.0, False), (True, 0.01, True), ("shared", 0.05, True)],
                         ids=["unpacked", "packed-margin-centered", "shared-prompt-margin-centered"])
def test_loss_and_gradients_equal_trl_reward_trainer(tmp_path, tiny_model_dir, reward_dir, packed, center, margins):
    ours, store = _ours(tmp_path, tiny_model_dir, reward_dir, packed, center, margins)
    _assert_same(ours, _trl(tmp_path, tiny_model_dir, reward_dir, store, center, margins))


def test_trl_tokenizes_these_pairs_as_we_do(tmp_path, tiny_model_dir):
    """TRL's RewardTrainer on the raw plain-text pairs (EOS appended, prompt + response tokenized whole) gives the ids
    our pairs hold: the same sequences end on the same EOS, where both read the score."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    _, prepared, tokenizer = _prepared(tmp_path, tiny_model_dir, False, False)
    store = prepared.store
    args = RewardConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False)
    trainer = RewardTrainer(model=_load_tiny_rm(tiny_model_dir), args=args, processing_class=tokenizer,
                            train_dataset=Dataset.from_list([{k: p[k] for k in ("prompt", "chosen", "rejected")}
                                                             for p in PAIRS]))
    theirs = trainer.train_dataset
    for i in range(len(PAIRS)):
        assert theirs[i]["chosen_ids"] == store.prompts[i] + store.responses[i][0]
        assert theirs[i]["rejected_ids"] == store.prompts[i] + store.responses[i][1]
        assert store.responses[i][0][-1] == tokenizer.eos_token_id


def _load_tiny_rm(tiny_model_dir):
    from finetune.compat import quiet_head_swap_report

    with quiet_head_swap_report():
        return _load(tiny_model_dir)
