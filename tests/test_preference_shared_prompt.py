"""Packed pairs that share their prompt (prompt once, then chosen, then rejected: finetune/data/preference/collate.py)
score exactly as pairs that repeat it: the same per-response log-probs, DPO loss and LoRA gradients, the same
reference table, honest token counts; the attention branch is the prompt's keys plus the response's own, causally;
the guard proves chosen, rejected and other pairs do not see each other; and the sharing is used only on the path
that can express it (CPU, SDPA run example by example), never for KTO, elsewhere nor unpacked.
Training end to end, shared packed == unpacked: tests/test_preference_guarantees.py; against TRL:
tests/test_preference_trainer_trl.py."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

from test_preference_data import _sequence_logps, dpo_recipe

TOLERANCE = 1e-5  # fp32: the same sums over other matmul shapes differ ~1e-7 of their size


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """(store, unshared collator, shared collator, two packed rows of pairs, LoRA model on the per-example path)."""
    from finetune.data import build_dataset
    from finetune.data.preference.collate import PreferenceCollator
    from finetune.data.preference.rows import PACKED
    from finetune.model import base_causal_lm, build_model
    from finetune.model.loader import load_tokenizer
    from finetune.model.varlen_attention import use_varlen_attention

    recipe = dpo_recipe(tmp_path_factory.mktemp("shared"), tiny_model_dir, n=12, val_set_size=0, sample_packing=True)
    tokenizer = load_tokenizer(recipe)
    prepared = build_dataset(recipe, tokenizer)
    torch.manual_seed(0)
    model, tokenizer = build_model(recipe, tokenizer, "fp32", "sdpa")
    assert use_varlen_attention(base_causal_lm(model))
    for name, param in model.named_parameters():  # lora_B off zero, so the adapter's gradients are all nonzero
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    unshared = PreferenceCollator(prepared.store, tokenizer.pad_token_id)
    shared = dataclasses.replace(unshared, share_prompt=True)
    rows = [prepared.train[i] for i in range(2)]
    assert all(len(row[PACKED]) >= 2 for row in rows)
    return prepared.store, unshared, shared, rows, model


def test_the_rejected_response_starts_at_its_prompt_position_and_targets_name_their_predictor(setup):
    store, _, shared, rows, _ = setup
    batch = shared(rows)
    item = batch["pair_ids"][0].item()
    (prompt, chosen), (_, rejected) = store.sequences(item)
    p, c, r = len(prompt), len(chosen), len(rejected)
    assert batch["input_ids"][0, :p + c + r].tolist() == prompt + chosen + rejected
    assert batch["position_ids"][0, :p + c + r].tolist() == list(range(p + c)) + list(range(p, p + r))
    assert batch["labels"][0, :p].eq(-100).all() and batch["labels"][0, p:p + c + r].tolist() == chosen + rejected
    rows_, positions, ids = batch["target_rows"], batch["target_positions"], batch["target_sequences"]
    first_rejected = (batch["target_sequences"] == batch["rejected_index"][0]).nonzero()[0, 0]
    assert positions[first_rejected].item() == p - 1  # the prompt's last position predicts both first tokens
    assert positions[0].item() == p - 1 and rows_[0].item() == 0 and ids[0].item() == batch["chosen_index"][0]
    assert batch["target_ids"][first_rejected].item() == rejected[0]
    assert batch["shared_prompt_tokens"][0].item() == p
    assert batch["target_ids"].numel() == int((batch["labels"] != -100).sum())


def test_shared_prompt_log_probs_loss_and_lora_gradients_equal_the_repeated_prompt(setup):
    from finetune.model.sequence_logps import response_logps
    from finetune.train.preference.loss import dpo_loss

    store, unshared, shared, rows, model = setup
    head = model.get_output_embeddings()
    model.eval()  # no dropout: the two layouts' forwards are otherwise the same function
    results = {}
    for name, collator in (("unshared", unshared), ("shared", shared)):
        batch = collator(rows)
        for full in (False, True):
            logps = response_logps(model, head, batch, full_logits=full)
            chosen, rejected = logps[batch["chosen_index"]], logps[batch["rejected_index"]]
            loss = dpo_loss(chosen, rejected, chosen.detach() + 0.3, rejected.detach() - 0.2, 0.1).sum()
            model.zero_grad(set_to_none=True)
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results[name, full] = (chosen.detach(), rejected.detach(), loss.detach(), grads)
        results[name, "tokens"] = int((batch["position_ids"] >= 0).sum()), batch["input_ids"].numel()
    model.zero_grad(set_to_none=True)
    reference = results["unshared", True]
    items = shared(rows)["pair_ids"].tolist()
    alone = _sequence_logps(model, [store.sequences(i)[0] for i in items] + [store.sequences(i)[1] for i in items])
    assert torch.cat(reference[:2]).tolist() == pytest.approx(alone, rel=TOLERANCE, abs=TOLERANCE)
    for key in [("unshared", False), ("shared", False), ("shared", True)]:
        chosen, rejected, loss, grads = results[key]
        assert torch.allclose(chosen, reference[0], rtol=0, atol=TOLERANCE), key
        assert torch.allclose(rejected, reference[1], rtol=0, atol=TOLERANCE), key
        assert loss.item() == pytest.approx(reference[2].item(), rel=TOLERANCE), key
        assert grads.keys() == reference[3].keys() and all("lora" in n for n in grads) and len(grads) > 4
        scale = max(g.abs().max().item() for g in reference[3].values())
        assert scale > 0 and max((grads[n] - reference[3][n]).abs().max().item() for n in grads) <= TOLERANCE * scale
    assert results["shared", "tokens"][1] < results["unshared", "tokens"][1]  # shorter rows: less work


def test_the_reference_table_is_the_same_shared_or_not(setup):
    from finetune.train.preference.reference import compute_table

    store, unshared, shared, _, model = setup
    head = model.get_output_embeddings()
    tables = [compute_table(model, head, c, store, 300, lambda b: b, False, 0, 1) for c in (unshared, shared)]
    assert not tables[0].isnan().any()
    assert torch.allclose(tables[0], tables[1], rtol=0, atol=TOLERANCE)


def test_throughput_counts_a_shared_prompt_once(setup):
    from finetune.train.callbacks.throughput import ThroughputCallback

    _, unshared, shared, rows, _ = setup
    counts = {}
    for name, collator in (("unshared", unshared), ("shared", shared)):
        callback = ThroughputCallback()
        batch = collator(rows)
        callback.count(batch)
        counts[name] = callback.counts
        real = sum(len(row) for row in batch["input_ids"].tolist()) - _padding(batch)
        assert callback.counts.tokens == real  # the tokens in the rows, no more
    assert counts["shared"].supervised == counts["unshared"].supervised
    assert counts["shared"].tokens < counts["unshared"].tokens
    assert counts["shared"].squares < counts["unshared"].squares


def _padding(batch) -> int:
    return int((batch["sequence_index"] == -1).sum())


def _oracle(q, k, v, positions):
    """Attention of a row with branches, by duplicating each branch's prompt: [prompt | response] per sequence,
    one causal SDPA each, the branch's own rows kept."""
    out = torch.empty_like(q)
    starts = [t for t in range(len(positions)) if t == 0 or positions[t] != positions[t - 1] + 1] + [len(positions)]
    trunk = 0
    for s, e in zip(starts, starts[1:]):
        shared = positions[s]
        trunk = s if shared == 0 else trunk
        index = list(range(trunk, trunk + shared)) + list(range(s, e))
        part = torch.nn.functional.scaled_dot_product_attention(q[:, :, index], k[:, :, index], v[:, :, index],
                                                                is_causal=True)
        out[:, :, s:e] = part[:, :, shared:]
    return out.transpose(1, 2)


@pytest.mark.parametrize("seed", range(3))
def test_a_branch_attends_to_its_prompt_and_itself_causally(seed):
    """The per-example attention on a row of pairs [prompt | chosen | rejected] (rejected's positions restarting
    at the prompt's length), single-token responses included, equals each response after its own copy of the
    prompt: outputs and q/k/v gradients."""
    from finetune.model.varlen_attention import varlen_sdpa_forward

    gen = torch.Generator().manual_seed(seed)
    positions = []
    for _ in range(4):
        p, c, r = (int(torch.randint(1, 12, (1,), generator=gen)) for _ in range(3))
        positions += list(range(p + c)) + list(range(p, p + r))
    positions += list(range(3))  # padding: positions of its own
    length, module = len(positions), types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)

    def run(fn):
        q, k, v = (torch.randn(1, 2, length, 8, generator=torch.Generator().manual_seed(seed + i)).requires_grad_()
                   for i in range(3))
        out = fn(q, k, v)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 9)))
        return out, q.grad, k.grad, v.grad

    got = run(lambda q, k, v: varlen_sdpa_forward(module, q, k, v, None, position_ids=torch.tensor([positions]))[0])
    want = run(lambda q, k, v: _oracle(q, k, v, positions))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_grouped_key_value_heads_are_read_as_they_are_not_repeated():
    """SmolLM2 has 9 query heads and 3 key/value heads: the per-example path passes the 3 to SDPA (enable_gqa), the
    same outputs and gradients as repeating them, without 3x copies kept for the backward pass."""
    from finetune.model.varlen_attention import varlen_sdpa_forward

    positions = list(range(7)) + list(range(4, 9)) + list(range(5))  # a pair sharing a 4-token prompt, a sequence
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, len(positions), 8, generator=gen).requires_grad_()
    k, v = (torch.randn(1, 2, len(positions), 8, generator=gen).requires_grad_() for _ in range(2))
    grad = torch.randn(1, len(positions), 6, 8, generator=gen)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = varlen_sdpa_forward(module, q, k, v, None, position_ids=torch.tensor([positions]))[0]
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    repeated = lambda t: t.repeat_interleave(3, dim=1)  # noqa: E731  (transformers' repeat_kv)
    want_out = _oracle(q, repeated(k), repeated(v), positions)
    want = (want_out, *torch.autograd.grad(want_out, (q, k, v), grad))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    element = 4 * len(positions) * 8
    assert sum(saved.values()) < (6 + 2 + 2 + 6 + 6) * element  # q, k, v, out and the pieces; repeated: + 8 heads


def test_the_guard_passes_shared_prompts_and_falls_back_when_a_response_sees_the_other(setup):
    from finetune.model.isolation import MAX_LEAK_FRACTION, shared_prompt_leak
    from finetune.train.preference.setup import probe_preference

    _, _, shared, _, model = setup
    assert shared_prompt_leak(model, shared) < 1e-4
    collator = dataclasses.replace(shared)
    assert probe_preference(model, collator, collator.pad_token_id, "sdpa", packed=True) is False
    assert collator.share_prompt

    # stock SDPA reads the rejected response (positions restarting at the prompt's length) as an example of its
    # own, without the prompt: what flash-attn and flex_attention would do. The guard notices, and the pairs are
    # packed with their own prompts instead
    from finetune.model import base_causal_lm
    from finetune.model.varlen_attention import restore_sdpa, use_varlen_attention

    restore_sdpa(base_causal_lm(model))
    try:
        assert shared_prompt_leak(model, shared) > MAX_LEAK_FRACTION
        assert probe_preference(model, collator, collator.pad_token_id, "sdpa", packed=True) is False
        assert not collator.share_prompt
    finally:
        assert use_varlen_attention(base_causal_lm(model))


def test_sharing_only_where_the_attention_path_can_express_it(tmp_path, tiny_model_dir, capfd):
    """CPU + SDPA packed DPO shares (the run says so and records it); eager attention, unpacked rows and KTO do
    not, and train the same layout as before."""
    from finetune.train.run import run_training

    line = "pairs share their prompt in packed rows"
    cases = {"sdpa": ({"sample_packing": True}, True), "eager": ({"sample_packing": True,
                                                                  "attn_implementation": "eager"}, False),
             "unpacked": ({}, False), "kto": ({"sample_packing": True, "method": "kto"}, False)}
    for name, (settings, expected) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        summary = run_training(dpo_recipe(folder, tiny_model_dir, n=8, val_set_size=0, max_steps=1,
                                          micro_batch_size=1 if settings else 4, **settings))
        assert summary["preference"]["shared_prompt"] is expected, name
        assert (line in capfd.readouterr().err) is expected, name
        record = json.loads((folder / "out" / "run.json").read_text())
        assert record["preference"]["shared_prompt"] is expected
        in_rows, counted = record["preference"]["train_tokens_in_rows"], record["data"]["train"]["tokens"]
        assert in_rows < counted if expected else in_rows == counted


def test_a_flattened_micro_batch_scores_the_same_without_its_padding(setup):
    """On the per-example path a micro batch of packed rows is one row (finetune/train/run.py): the rows' padding
    to the longest went through every layer (docs/performance.md, DPO memory)."""
    from finetune.model.sequence_logps import response_logps

    store, _, shared, rows, model = setup
    flat = dataclasses.replace(shared, flatten=True)
    head = model.get_output_embeddings()
    model.eval()
    padded, flattened = shared(rows), flat(rows)
    assert flattened["input_ids"].shape[0] == 1 and int((flattened["sequence_index"] < 0).sum()) == 0
    assert flattened["input_ids"].numel() == int((padded["sequence_index"] >= 0).sum())  # the real tokens only
    with torch.no_grad():
        assert torch.allclose(response_logps(model, head, flattened), response_logps(model, head, padded),
                              rtol=0, atol=TOLERANCE)


def test_a_packed_preference_run_on_cpu_trains_on_flattened_micro_batches(tmp_path, tiny_model_dir):
    """...and with its LoRA dropouts keeping their masks as bool (finetune/model/mask_dropout.py: the same numbers)."""
    from transformers import TrainerCallback

    from finetune.model.mask_dropout import MaskDropout
    from finetune.train.run import run_training

    seen, dropouts = [], []

    class FirstBatch(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, model=None, **kwargs):
            seen.append(next(iter(train_dataloader)))
            dropouts.extend(type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout))

    run_training(dpo_recipe(tmp_path, tiny_model_dir, n=12, val_set_size=0, max_steps=1, sample_packing=True,
                            micro_batch_size=2, lora_dropout=0.05), extra_callbacks=[FirstBatch()])
    batch = seen[0]
    assert batch["input_ids"].shape[0] == 1 and int((batch["sequence_index"] < 0).sum()) == 0
    assert dropouts and set(dropouts) == {MaskDropout}
