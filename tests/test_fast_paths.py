"""train.py's exact speedups: supervised-only logits and per-example attention for packed rows on CPU.

Each must leave the numbers unchanged (same loss, same gradients; the Trainer-level proof is in
test_equivalence.py) and step aside where it cannot apply."""

from __future__ import annotations

import json
import types

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from finetune.data.collate import Collator
from finetune.model.supervised_logits import attach
from finetune.model.varlen_attention import NAME, restore_sdpa, segments, use_varlen_attention


def tiny(tiny_model_dir, lora: bool = False, cls=AutoModelForCausalLM, **load):
    torch.manual_seed(0)
    model = cls.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa", **load)
    model.config.use_cache = False
    return add_lora(model) if lora else model


def add_lora(model, dropout: float = 0.1):
    """r=4 LoRA on every linear layer, with lora_B drawn instead of zero so the adapter matters."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def packed_attention_log() -> str:
    """What a packed run logs about its attention on this machine: example by example on CPU; on CUDA the
    kernel `attn_implementation: auto` chose (flex_attention or flash-attn), with its reason."""
    import types

    from finetune.model.attention import choose_attention

    if not torch.cuda.is_available():
        return "attention runs example by example"
    choice, reason = choose_attention(types.SimpleNamespace(attn_implementation="auto", sample_packing=True),
                                      supports_flex=lambda recipe: (True, ""))  # the tiny model
    return f"attention {choice} ({reason})"


def batch_with_prompts(vocab: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (2, 40), generator=gen)
    labels = ids.clone()
    labels[:, :12] = -100  # prompts
    labels[1, 31:] = -100  # padding
    return {"input_ids": ids, "labels": labels}


def loss_and_grads(model, batch: dict) -> tuple[float, dict]:
    model.train()
    model.zero_grad()
    torch.manual_seed(3)  # the same dropout masks
    loss = model(**batch, num_items_in_batch=torch.tensor(47)).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_supervised_logits_give_the_same_loss_and_gradients_from_fewer_head_rows(tiny_model_dir):
    plain, fast = tiny(tiny_model_dir, lora=True), tiny(tiny_model_dir, lora=True)
    assert attach(fast) is not None
    rows = []
    fast.get_base_model().lm_head.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    batch = batch_with_prompts(plain.config.vocab_size)
    loss_a, grads_a = loss_and_grads(plain, batch)
    loss_b, grads_b = loss_and_grads(fast, batch)
    assert rows == [int((batch["labels"][:, 1:] != -100).sum())] == [47]  # 28 + 19 supervised next tokens
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in k for k in grads_a)
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-6
    fast.eval()  # evaluation and generation see every position's logits
    assert fast(**batch).logits.shape == (2, 40, plain.config.vocab_size)


class InlineLossLlama(LlamaForCausalLM):
    """A model that computes its own cross-entropy from full logits instead of calling `loss_function`."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, **kwargs)
        if labels is not None:
            logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
            out.loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
        return out


def test_supervised_logits_step_aside_when_the_model_computes_its_own_loss(tiny_model_dir):
    model = tiny(tiny_model_dir, cls=InlineLossLlama)
    assert attach(model) is None
    batch = batch_with_prompts(model.config.vocab_size)
    model.train()
    assert model(**batch).logits.shape[:2] == (2, 40)  # no hook left behind


def packed_batch(seed: int = 0, collator: Collator = Collator(0)) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def row(total):
        ids, pos = [], []
        while len(ids) < total:
            n = int(torch.randint(2, 30, (1,), generator=gen))
            ids += torch.randint(1, 500, (n,), generator=gen).tolist()
            pos += list(range(n))
        return {"input_ids": ids[:total], "position_ids": pos[:total], "labels": ids[:total]}

    return collator([row(120), row(75)])  # the second row padded with positions 0, 1, ... of its own


def test_segments_follow_position_restarts():
    assert segments([0, 1, 2, 0, 1, 0, 0, 1, 2, 3]) == [(0, 3), (3, 5), (5, 6), (6, 10)]
    assert segments([0, 1, 2, 3]) == [(0, 4)]
    assert segments([5, 6, 7]) == [(0, 3)]


def test_per_example_attention_matches_the_masked_kernel_on_packed_rows(tiny_model_dir):
    plain, fast = tiny(tiny_model_dir), tiny(tiny_model_dir)
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads  # GQA is exercised
    assert use_varlen_attention(fast) and fast.config._attn_implementation == NAME
    batch = packed_batch()
    loss_a, grads_a = loss_and_grads(plain, batch)
    loss_b, grads_b = loss_and_grads(fast, batch)
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-6
    with torch.no_grad():  # logits of every position, padding row included
        logits_a = plain(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        logits_b = fast(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    assert (logits_a - logits_b).abs().max().item() < 1e-5
    # an unpacked, padded batch and generation take the stock SDPA path unchanged
    ids = batch["input_ids"][:, :20]
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    plain.eval()
    fast.eval()
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits, fast(input_ids=ids, attention_mask=mask).logits)
    assert torch.equal(plain.generate(ids[:1, :6], max_new_tokens=4, do_sample=False),
                       fast.generate(ids[:1, :6], max_new_tokens=4, do_sample=False))
    restore_sdpa(fast)
    assert fast.config._attn_implementation == "sdpa"


def _sliced_attention(query, key, value, position_ids, groups, repeat=False):
    """The oracle: one causal SDPA call per example on plain slices (the first implementation); `repeat`
    repeats the key/value heads first (transformers' repeat_kv) instead of SDPA's enable_gqa."""
    from transformers.integrations.sdpa_attention import repeat_kv

    if repeat:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    rows = []
    for b, positions in enumerate(position_ids.expand(query.shape[0], -1).tolist()):
        rows.append(torch.cat([torch.nn.functional.scaled_dot_product_attention(
            query[b:b + 1, :, s:e], key[b:b + 1, :, s:e], value[b:b + 1, :, s:e], is_causal=e - s > 1,
            enable_gqa=groups > 1 and not repeat)
            for s, e in segments(positions)], dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous()


@pytest.mark.parametrize("seed", range(6))
def test_per_example_attention_is_bit_identical_to_one_slice_per_example(seed):
    """The unbind + split form (a cheaper backward) gives the same output and q/k/v gradients, bit for bit,
    on varied rows: 1-2 rows, GQA or not, single-token examples, a row that is one example."""
    from finetune.model.varlen_attention import varlen_sdpa_forward

    gen = torch.Generator().manual_seed(seed)
    batch, heads, groups, length = 1 + seed % 2, 4, (1, 2, 4)[seed % 3], (7, 64, 160)[seed % 3]
    positions = []
    for _ in range(batch):
        row = []
        while len(row) < length:
            row += list(range(1 if seed == 5 else int(torch.randint(1, 40, (1,), generator=gen))))
        positions.append(row[:length] if seed != 4 else list(range(length)))
    position_ids = torch.tensor(positions)
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=True)

    def run(fn):
        q = torch.randn(batch, heads, length, 16, generator=torch.Generator().manual_seed(seed)).requires_grad_()
        k, v = (torch.randn(batch, heads // groups, length, 16, generator=torch.Generator().manual_seed(seed + i))
                .requires_grad_() for i in (10, 20))
        out = fn(q, k, v)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 30)))
        return out, q.grad, k.grad, v.grad

    new = run(lambda q, k, v: varlen_sdpa_forward(module, q, k, v, None, position_ids=position_ids)[0])
    old = run(lambda q, k, v: _sliced_attention(q, k, v, position_ids, groups))
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    # and enable_gqa gives, to float rounding, what repeating the key/value heads gave
    repeated = run(lambda q, k, v: _sliced_attention(q, k, v, position_ids, groups, repeat=True))
    for a, b in zip(new, repeated):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_per_example_attention_is_not_used_where_it_would_change_the_numbers(tiny_model_dir):
    model = tiny(tiny_model_dir)
    model.config.sliding_window = 8  # a sliding window the per-example calls would ignore
    assert not use_varlen_attention(model) and model.config._attn_implementation == "sdpa"
    eager = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert not use_varlen_attention(eager)  # only replaces SDPA


def test_a_vision_language_models_window_is_read_from_its_language_model():
    """A LLaVA whose language model slides a window (a Mistral with `sliding_window`): the window is in text_config,
    not on the outer config, and the per-example path (which applies none) is not taken; without one it is."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, MistralConfig

    from finetune.model.families import per_example_attention

    tower = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    windowed = LlavaConfig(vision_config=tower, text_config=MistralConfig(sliding_window=8))
    assert getattr(windowed, "sliding_window", None) is None  # what the outer config says
    assert per_example_attention(windowed) == (False, "this checkpoint's config sets a sliding window")
    assert per_example_attention(LlavaConfig(vision_config=tower, text_config=LlamaConfig())) == (True, "")


def test_packed_full_fine_tune_saves_a_config_any_loader_reads(make_recipe, tmp_path, capfd):
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    run_training(load_recipe(make_recipe("chat", n=12, adapter="none", sample_packing=True, max_steps=2)))
    assert packed_attention_log() in capfd.readouterr().err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert NAME not in json.dumps(config)
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))  # loads without our registration
