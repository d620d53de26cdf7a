"""plan/activations.py against the tensors autograd actually saves (CPU, saved_tensors_hooks)."""

from __future__ import annotations

import contextlib

import pytest

from finetune.plan.activations import activation_memory


def saved_bytes(run, parameters) -> int:
    """Bytes of distinct storages autograd saves for backward while `run()` runs, `parameters` excluded."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in parameters}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _saved_bytes(model, ids) -> int:
    return saved_bytes(lambda: model(input_ids=ids, labels=ids), model.parameters())


@pytest.mark.parametrize("compute,attn,checkpointing", [
    ("fp32", "sdpa", False), ("fp32", "eager", False), ("bf16", "sdpa", False), ("bf16", "eager", False),
    ("fp32", "sdpa", True), ("autocast", "sdpa", False),
])
def test_predicted_activation_bytes_match_saved_tensors(compute, attn, checkpointing):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune.plan.model_size import model_shape

    # deliberately not a shape the formula was fitted on
    config = LlamaConfig(vocab_size=600, hidden_size=80, intermediate_size=208, num_hidden_layers=3,
                         num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=128,
                         attn_implementation=attn, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if compute == "bf16":
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    seq_len, micro_batch = 40, 2
    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if compute == "autocast" else contextlib.nullcontext()
    with autocast:
        actual = _saved_bytes(model, ids)
    predicted = activation_memory(model_shape(model), seq_len, micro_batch, compute=compute, attn=attn,
                                  gradient_checkpointing=checkpointing)
    expected = predicted.saved_bytes + predicted.autocast_cache_bytes
    assert expected == pytest.approx(actual, rel=0.03)


def test_checkpointing_and_sdpa_cut_activation_memory():
    from finetune.plan.shape import ModelShape

    shape = ModelShape(num_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                       num_kv_heads=32, vocab_size=32000, total_params=6_738_415_616, embedding_params=131_072_000,
                       quantizable_params=6_476_005_376)
    eager = activation_memory(shape, 2048, 1, "bf16", "eager").saved_bytes
    sdpa = activation_memory(shape, 2048, 1, "bf16", "sdpa").saved_bytes
    ckpt = activation_memory(shape, 2048, 1, "bf16", "sdpa", gradient_checkpointing=True).saved_bytes
    double = activation_memory(shape, 2048, 2, "bf16", "sdpa").saved_bytes
    assert ckpt < sdpa / 10 < eager / 10
    assert double == pytest.approx(2 * sdpa)
