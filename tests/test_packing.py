"""Sample packing: the packer is exact best-fit decreasing and deterministic; packed rows keep every token;
packed examples are isolated (logits equal to the example run alone, sdpa and eager); the loss and the
gradients of a packed batch equal those of the same examples unpacked; the encoder gives the same labels
as the per-record oracle; a packed training run takes exactly the planned number of steps."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from finetune.contract import IGNORE_INDEX
from finetune.data.collate import Collator
from finetune.data.encode import encode_batch, encode_stream
from finetune.data.packing import pack_dataset, pack_lengths
from finetune.errors import ModelError, RecipeError
from finetune.model.isolation import check_packed_isolation, guard_packing
from finetune.recipe import load_recipe
from finetune.train import run_training
from conftest import make_records
from oracle_encoder import encode
from test_fast_paths import packed_attention_log


def naive_best_fit_decreasing(lengths, capacity, seed):
    order = np.random.default_rng(seed).permutation(len(lengths))
    order = order[np.argsort(-np.asarray(lengths)[order], kind="stable")]
    rooms, bins = [], []
    for i in order:
        fits = [b for b, room in enumerate(rooms) if room >= lengths[i]]
        if not fits:
            rooms.append(capacity - lengths[i])
            bins.append([i])
            continue
        best = min(fits, key=lambda b: rooms[b])
        rooms[best] -= lengths[i]
        bins[best].append(i)
    return bins


def test_packer_is_exact_best_fit_decreasing_and_deterministic():
    rng = np.random.default_rng(1)
    for trial in range(150):
        capacity = int(rng.integers(5, 60))
        lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 80)))
        bins = pack_lengths(lengths, capacity, seed=trial)
        reference = naive_best_fit_decreasing(lengths, capacity, seed=trial)
        assert len(bins) == len(reference)
        # bins with equal room may be swapped, so compare the fill of every bin, not their contents
        assert sorted(int(lengths[b].sum()) for b in bins) == sorted(int(lengths[b].sum()) for b in reference)
        assert sorted(np.concatenate(bins).tolist()) == list(range(len(lengths)))
        assert all(lengths[b].sum() <= capacity for b in bins)
    lengths = rng.integers(1, 200, size=5000)
    first, again = pack_lengths(lengths, 512, seed=3), pack_lengths(lengths, 512, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again)
    assert sum(lengths) / (len(first) * 512) > 0.99


def test_packer_rejects_examples_longer_than_a_row():
    with pytest.raises(Exception, match="sequence_len"):
        pack_lengths([3, 9], capacity=8)


def small_dataset(lengths, seed=0):
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    ids = [rng.integers(5, 400, size=n).tolist() for n in lengths]
    labels = [[IGNORE_INDEX] * (n // 2) + row[n // 2:] for n, row in zip(lengths, ids)]
    return Dataset.from_dict({"input_ids": ids, "labels": labels}), ids, labels


def test_packed_rows_keep_every_token_and_restart_positions():
    lengths = [30, 7, 19, 12, 25, 3, 40, 9]
    dataset, ids, labels = small_dataset(lengths)
    packed, stats = pack_dataset(dataset, sequence_len=48, seed=0)
    assert stats["rows"] == len(packed) and stats["tokens"] == sum(lengths)
    assert stats["efficiency"] == pytest.approx(sum(lengths) / (len(packed) * 48), abs=1e-4)
    seen = []
    for row in packed:
        assert len(row["input_ids"]) == len(row["labels"]) == len(row["position_ids"]) <= 48
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
        for lo, hi in zip(starts, starts[1:]):
            assert row["position_ids"][lo:hi] == list(range(hi - lo))
            example = ids.index(row["input_ids"][lo:hi])
            # the first label is never a target alone; packed, it must not be the previous example's target
            assert row["labels"][lo:hi] == [IGNORE_INDEX] + labels[example][1:]
            seen.append(example)
    assert sorted(seen) == list(range(len(lengths)))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    def load(attn):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn)
        model.config.use_cache = False
        return model.eval()

    return load


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("flatten", [False, True])
def test_packed_example_logits_equal_the_example_alone(tiny_model, attn, flatten):
    model = tiny_model(attn)
    lengths = [11, 6, 9, 14, 5]
    dataset, ids, _ = small_dataset(lengths, seed=2)
    packed, _ = pack_dataset(dataset, sequence_len=24, seed=0)
    rows = [packed[i] for i in range(len(packed))]
    batch = Collator(pad_token_id=0, flatten=flatten)(rows)
    assert "attention_mask" not in batch and len(rows) > 1
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    offset, compared = 0, 0
    for r, row in enumerate(rows):
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
        for lo, hi in zip(starts, starts[1:]):
            with torch.no_grad():
                alone = model(input_ids=torch.tensor([row["input_ids"][lo:hi]])).logits[0]
            got = logits[0, offset + lo:offset + hi] if flatten else logits[r, lo:hi]
            torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
            compared += 1
        if flatten:
            offset += len(row["input_ids"])
    assert compared == len(lengths)


def test_guard_refuses_a_model_that_would_cross_attend(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    model.config.use_cache = True  # the default: a KV cache built in the forward disables the packed mask
    with pytest.raises(ModelError, match="sample_packing: false"):
        check_packed_isolation(model, Collator(0), "sdpa")
    assert guard_packing(model, Collator(0), "sdpa") < 1e-4 and model.config.use_cache is False


def trainer_num_items(batch):
    # transformers 5 Trainer: labels[..., 1:] that are not -100, summed over the accumulated micro batches
    return batch["labels"][..., 1:].ne(IGNORE_INDEX).sum()


def loss_and_grads(model, batch, num_items):
    model.zero_grad()
    loss = model(**batch, num_items_in_batch=num_items).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_batch_gives_the_same_loss_and_gradients(tiny_model, tiny_tokenizer):
    model = tiny_model("sdpa").train()
    records = make_records("chat", 6, seed=5)
    examples = [encode(tiny_tokenizer, "chat", r, train_on_inputs=False) for r in records]
    from datasets import Dataset

    dataset = Dataset.from_dict({"input_ids": [e.input_ids for e in examples],
                                 "labels": [e.labels for e in examples]})
    collate = Collator(pad_token_id=tiny_tokenizer.pad_token_id)
    unpacked = collate([dataset[i] for i in range(len(dataset))])
    packed_rows, _ = pack_dataset(dataset, sequence_len=128, seed=0)
    packed = collate([packed_rows[i] for i in range(len(packed_rows))])
    assert packed["input_ids"].numel() < unpacked["input_ids"].numel()  # packing removed padding
    n_unpacked, n_packed = trainer_num_items(unpacked), trainer_num_items(packed)
    assert n_unpacked == n_packed > 0
    loss_u, grads_u = loss_and_grads(model, unpacked, n_unpacked)
    loss_p, grads_p = loss_and_grads(model, packed, n_packed)
    torch.testing.assert_close(loss_p, loss_u, atol=1e-5, rtol=1e-5)
    for name, grad in grads_u.items():
        torch.testing.assert_close(grads_p[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("shape", ["completion", "instruction", "chat"])
@pytest.mark.parametrize("train_on_inputs", [False, True])
def test_batched_encoding_equals_the_per_record_oracle(tiny_tokenizer, shape, train_on_inputs):
    records = make_records(shape, 40, seed=7)
    one_by_one = [encode(tiny_tokenizer, shape, r, train_on_inputs) for r in records]
    batched = encode_batch(tiny_tokenizer, [(shape, r) for r in records], train_on_inputs)
    assert [(e.input_ids, e.labels) for e in batched] == [(e.input_ids, e.labels) for e in one_by_one]
    assert any(IGNORE_INDEX in e.labels for e in batched) != train_on_inputs or shape == "completion"


def test_encoding_over_processes_keeps_order_and_labels(tiny_tokenizer, monkeypatch):
    import finetune.data.encode as encoder

    monkeypatch.setattr(encoder, "CHUNK_RECORDS", 7)  # several chunks, spread over the two workers
    shaped = [(s, r) for s in ("chat", "instruction") for r in make_records(s, 15, seed=1)]
    expected = [encode(tiny_tokenizer, s, r, False) for s, r in shaped]
    got = [example for _, example in encode_stream(tiny_tokenizer, iter(shaped), False, processes=2)]
    assert [(e.input_ids, e.labels) for e in got] == [(e.input_ids, e.labels) for e in expected]


def test_packed_training_runs_the_planned_steps_and_records_efficiency(make_recipe, tmp_path, capfd):
    recipe = load_recipe(make_recipe("chat", n=40, adapter="lora", lora_r=4, sample_packing=True,
                                     sequence_len=160, micro_batch_size=2, val_set_size=8, num_epochs=2))
    summary = run_training(recipe)
    packing = summary["data"]["packing"]
    assert packing["train"]["examples"] == 32 and packing["train"]["rows"] < 32 and "eval" in packing
    assert packing["train"]["efficiency"] > 0.8
    assert summary["plan"]["train_rows"] == packing["train"]["rows"]
    assert summary["steps"] == summary["plan"]["total_steps"] == 2 * -(-packing["train"]["rows"] // 2)
    assert summary["final_train_loss"] < summary["first_train_loss"]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["data"]["packing"]["train"]["efficiency"] == packing["train"]["efficiency"]
    err = capfd.readouterr().err
    assert "efficiency" in err and "isolated" in err
    assert packed_attention_log() in err and "supervised positions only" in err


def test_group_by_length_trains_and_conflicts_with_packing(make_recipe):
    summary = run_training(load_recipe(make_recipe("instruction", n=16, group_by_length=True, max_steps=2)))
    assert summary["steps"] == 2
    with pytest.raises(RecipeError, match="group_by_length"):
        load_recipe(make_recipe("instruction", n=4, group_by_length=True, sample_packing=True))
