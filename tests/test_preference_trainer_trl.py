"""The whole training path of each preference method (our tokenization's token ids, our collator packed and
unpacked, the gathered-head log-probs, the precomputed reference table, the objective, KTO's KL pass) against
TRL 1.16's own trainers on the same token ids and the same weights: loss and every gradient within 1e-5.

DPO, DPO + SFT term (rpo_alpha), IPO and KTO go through TRL's DPOTrainer / KTOTrainer compute_loss, fed
TRL's own collator with our store's (prompt, response) ids. SimPO and ORPO (TRL's experimental CPO / ORPO
trainers collate differently) are held to plain full-logit forwards through the loss functions that
tests/test_preference_loss.py holds equal to those trainers. The policy differs from the reference (the
fixture of test_preference_loss), so no loss is at its starting value.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from conftest import write_jsonl
from finetune.recipe import load_recipe
from test_preference_loss import PAIRS, _assert_same, _backward, _load, model_dirs, trl  # noqa: F401 (fixtures)

MORE_PAIRS = PAIRS + [
    {"prompt": "name a colour", "chosen": " red or blue", "rejected": " the number seven is odd"},
    {"prompt": "say hi", "chosen": " hi there", "rejected": " go away now please"},
]


def _prepared(tmp_path, policy, method, packed, **settings):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    write_jsonl(tmp_path / "pairs.jsonl", MORE_PAIRS)
    recipe = {"base_model": str(policy), "method": method, "sequence_len": 64, "micro_batch_size": 2,
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}], "sample_packing": packed,
              "output_dir": "out", "cache_dir": "cache", "val_set_size": 0, "precision": "fp32",
              "report_to": ["none"], **settings}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    recipe = load_recipe(tmp_path / "recipe.yml")
    return recipe, build_dataset(recipe, load_tokenizer(recipe))


def _ours(tmp_path, model_dirs, method, packed, **settings):
    """(our loss and gradients on one micro batch of every row, the batch, the store, our trainer). `packed`:
    False, True, or "shared" (pairs hold their prompt once, on the per-example attention path)."""
    from transformers import TrainingArguments

    from finetune.data.preference.collate import PreferenceCollator
    from finetune.model.varlen_attention import use_varlen_attention
    from finetune.train.preference.trainer import PreferenceTrainer
    from finetune.train.preference.objective import Objective
    from finetune.train.preference.reference import compute_table

    policy, reference = model_dirs
    recipe, prepared = _prepared(tmp_path, policy, method, bool(packed), **settings)
    store = prepared.store
    collator = PreferenceCollator(store, pad_token_id=0, share_prompt=packed == "shared")
    ref_model, model = _load(reference).eval(), _load(policy)
    if packed == "shared":
        assert use_varlen_attention(ref_model) and use_varlen_attention(model)
    table = compute_table(ref_model, ref_model.get_output_embeddings(), collator, store, 256, lambda b: b, False, 0, 1)
    args = TrainingArguments(output_dir=str(tmp_path / "ours"), report_to="none", use_cpu=True)
    trainer = PreferenceTrainer(model=model, args=args, objective=Objective(recipe), store=store,
                                head=model.get_output_embeddings(), full_logits=False, reference=table,
                                data_collator=collator, train_dataset=prepared.train)
    model.train()
    rows = [prepared.train[i] for i in range(len(prepared.train))]
    assert (len(rows) < len(store)) == bool(packed)  # packed: several items share a row
    batch = collator(rows)
    assert ("shared_prompt_tokens" in batch) == (packed == "shared" and method != "kto")
    return _backward(model, trainer.compute_loss(model, batch)), batch, store


def _trl_trainer(trainer_cls, config_cls, model_dirs, tmp_path, records, **config):
    from datasets import Dataset
    from transformers import AutoTokenizer

    policy, reference = model_dirs
    args = config_cls(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=len(records), **config)
    trainer = trainer_cls(model=_load(policy), args=args, train_dataset=Dataset.from_list(records),
                          processing_class=AutoTokenizer.from_pretrained(policy), ref_model=_load(reference))
    trainer.model.train()
    return trainer


@pytest.mark.parametrize("packed", [False, True, "shared"], ids=["unpacked", "packed", "shared-prompt"])
@pytest.mark.parametrize("method, ours, theirs", [
    ("dpo", {"rl_beta": 0.3}, {"beta": 0.3}),
    ("dpo", {"rl_beta": 0.1, "rpo_alpha": 0.5}, {"beta": 0.1, "loss_type": ["sigmoid", "sft"],
                                                  "loss_weights": [1.0, 0.5]}),
    ("ipo", {"rl_beta": 0.5}, {"beta": 0.5, "loss_type": "ipo"}),
], ids=["dpo", "dpo-rpo", "ipo"])
def test_paired_training_path_equals_trl_dpo_trainer(trl, model_dirs, tmp_path, method, ours, theirs, packed):
    mine, batch, store = _ours(tmp_path, model_dirs, method, packed, **ours)
    items = batch["pair_ids"].tolist()
    rows = [{"prompt_ids": store.prompts[i], "chosen_ids": store.responses[i][0], "rejected_ids": store.responses[i][1]}
            for i in items]
    trainer = _trl_trainer(trl.DPOTrainer, trl.DPOConfig, model_dirs, tmp_path, PAIRS, **theirs)
    _assert_same(mine, _backward(trainer.model, trainer.compute_loss(trainer.model, trainer.data_collator(rows))))
    assert 0.05 < mine[0].item()  # not a degenerate case


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_kto_training_path_equals_trl_kto_trainer(trl, model_dirs, tmp_path, packed):
    """Pairs under KTO: each pair is a desirable and an undesirable example; each example's KL sequence is its
    prompt with its KL partner's completion, handed to TRL as KL_completion_ids."""
    mine, batch, store = _ours(tmp_path, model_dirs, "kto", packed, rl_beta=0.2, kto_desirable_weight=1.3,
                               kto_undesirable_weight=0.7)
    items = batch["pair_ids"].tolist()
    assert set(store.labels[i] for i in items) == {True, False}
    assert all(store.kl_partner[i] != i for i in items)
    rows = [{"prompt_ids": store.prompts[i], "completion_ids": store.responses[i][0], "label": store.labels[i],
             "KL_completion_ids": store.responses[store.kl_partner[i]][0]} for i in items]
    records = [{"prompt": p["prompt"], "completion": p["chosen"], "label": True} for p in PAIRS]
    trainer = _trl_trainer(trl.KTOTrainer, trl.KTOConfig, model_dirs, tmp_path, records, beta=0.2,
                           desirable_weight=1.3, undesirable_weight=0.7)
    _assert_same(mine, _backward(trainer.model, trainer.compute_loss(trainer.model, trainer.data_collator(rows))))


def _plain_logps(model, store, items, side):
    """Summed response log-probs and response lengths from one full-logit forward per sequence."""
    sums, counts = [], []
    for i in items:
        prompt, response = store.sequences(i)[side]
        ids = torch.tensor([prompt + response])
        logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        sums.append(logps[len(prompt) - 1:].sum())
        counts.append(len(response))
    return torch.stack(sums), torch.tensor(counts)


@pytest.mark.parametrize("packed", [False, True, "shared"], ids=["unpacked", "packed", "shared-prompt"])
@pytest.mark.parametrize("method", ["simpo", "orpo"])
def test_reference_free_training_path_equals_the_trl_checked_losses(model_dirs, tmp_path, method, packed):
    from finetune.train.preference import loss as L

    settings = {"rl_beta": 2.0, "simpo_gamma": 0.8, "rpo_alpha": 0.3} if method == "simpo" else {"orpo_alpha": 0.2}
    mine, batch, store = _ours(tmp_path, model_dirs, method, packed, **settings)
    items = batch["pair_ids"].tolist()
    model = _load(model_dirs[0]).train()
    (pc, nc), (pr, nr) = _plain_logps(model, store, items, 0), _plain_logps(model, store, items, 1)
    if method == "simpo":
        loss = L.simpo_loss(pc, pr, nc, nr, 2.0, 0.8).mean() + 0.3 * -pc.sum() / nc.sum()
    else:  # ORPO's SFT term: the chosen responses' tokens (TRL's also scores the prompt: see the module docs)
        loss = L.orpo_loss(pc, pr, nc, nr, 0.2)[0].mean() + -pc.sum() / nc.sum()
    _assert_same(mine, _backward(model, loss))
