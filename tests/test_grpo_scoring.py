"""GRPO's completions: sampled reproducibly from the live adapter (finetune/train/grpo/generation.py), and scored in
packed rows that hold each prompt once before its G completions exactly as each completion after its own copy of
the prompt (finetune/train/grpo/scoring.py): the same per-token log-probs, entropies and LoRA gradients, with a guard
that says no where the attention path cannot express the sharing."""

from __future__ import annotations

import types

import pytest
import torch

# the oracle: each branch after its own copy of its prompt (the DPO shared-prompt tests hold the same path to it)
from test_preference_shared_prompt import _oracle

TOLERANCE = 1e-5  # fp32: the same sums over other matmul shapes differ ~1e-7 of their size


def _lora_model(model_dir, varlen: bool = True, seed: int = 0):
    """The tiny Llama with a LoRA adapter whose B weights are off zero (so it changes the logits), fp32."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from finetune.model import base_causal_lm
    from finetune.model.varlen_attention import use_varlen_attention

    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.1))
    torch.manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    if varlen:
        assert use_varlen_attention(base_causal_lm(model))
    return model


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return _lora_model(tiny_model_dir)


def _case(group_size: int, eos: int, max_length: int = 9, seed: int = 0):
    """Four prompts of 2-8 tokens, G completions each of 1..max_length tokens: some ended by `eos`, some truncated
    (max_length tokens, no EOS)."""
    gen = torch.Generator().manual_seed(seed)

    def draw(n):
        return torch.randint(5, 500, (n,), generator=gen).tolist()

    prompts = [draw(n) for n in (5, 2, 8, 3)]
    completions = []
    for n in range(len(prompts) * group_size):
        kind = n % 3
        if kind == 0:  # truncated
            completions.append(draw(max_length))
        else:  # ended by EOS, one token (EOS alone) up to max_length
            completions.append(draw(int(torch.randint(0, max_length, (1,), generator=gen))) + [eos])
    return prompts, completions


def _scores(model, prompts, completions, capacity, share=True):
    from finetune.train.grpo.scoring import completion_logps, pack_scoring_rows, padded_completion_logps

    rows = pack_scoring_rows(prompts, completions, capacity, share_prompt=share)
    return rows, completion_logps(model, rows), padded_completion_logps(model, prompts, completions)


# segments (a prompt and its G completions) of _case: G = 2: 13-23 tokens, G = 3: 25-35, G = 4: 31-41
@pytest.mark.parametrize("group_size, capacity, layout", [(2, 40, "several"), (3, 56, "several"),
                                                          (4, 72, "several"), (4, 36, "split")])
def test_packed_shared_prompt_scores_equal_the_padded_ones(model, group_size, capacity, layout):
    prompts, completions = _case(group_size, eos=0)
    model.eval()
    with torch.no_grad():
        rows, packed, padded = _scores(model, prompts, completions, capacity)
    assert packed.completions.tolist() == list(range(len(completions)))
    assert packed.mask.equal(padded.mask)
    assert packed.mask.sum().item() == sum(map(len, completions)) == sum(len(r.targets) for r in rows)
    assert torch.allclose(packed.logps, padded.logps, rtol=0, atol=TOLERANCE)
    assert torch.allclose(packed.entropies, padded.entropies, rtol=0, atol=TOLERANCE)
    assert (packed.logps[packed.mask] < 0).all() and (packed.entropies[packed.mask] > 0).all()
    assert packed.logps[~packed.mask].eq(0).all()
    assert all(len(r.input_ids) <= capacity for r in rows)
    prompt_copies = sum(r.position_ids.count(0) for r in rows)
    if layout == "several":
        assert max(r.position_ids.count(0) for r in rows) >= 2 and prompt_copies == len(prompts)
    else:  # a prompt's completions over two segments, each with a copy of the prompt
        assert prompt_copies > len(prompts)
    tokens_in_rows = sum(len(r.input_ids) for r in rows)
    assert tokens_in_rows < sum(len(prompts[n // group_size]) + len(c) for n, c in enumerate(completions))


def test_a_row_holds_the_prompt_once_and_each_completion_restarts_at_its_length():
    from finetune.train.grpo.scoring import pack_scoring_rows

    prompts, completions = [[7, 8, 9]], [[10, 11], [12], [13, 14, 15]]
    (row,) = pack_scoring_rows(prompts, completions, capacity=100)
    assert row.input_ids == [7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert row.position_ids == [0, 1, 2, 3, 4, 3, 3, 4, 5]
    # (predicting position, token, completion, offset): the prompt's last position (2) predicts every first token
    assert row.targets == [(2, 10, 0, 0), (3, 11, 0, 1), (2, 12, 1, 0), (2, 13, 2, 0), (6, 14, 2, 1), (7, 15, 2, 2)]
    unshared = pack_scoring_rows(prompts, completions, capacity=100, share_prompt=False)
    assert [r.position_ids for r in unshared] == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]
    split = pack_scoring_rows(prompts, completions, capacity=7)  # 3 + 2 + 1 fits, 3 + 3 another segment
    assert sorted(r.input_ids for r in split) == [[7, 8, 9, 10, 11, 12], [7, 8, 9, 13, 14, 15]]
    with pytest.raises(ValueError, match="G per prompt"):
        pack_scoring_rows(prompts + [[1]], completions, capacity=100)  # 3 completions, 2 prompts


def test_padded_reference_equals_each_completion_scored_alone(model):
    from finetune.train.grpo.scoring import padded_completion_logps

    prompts, completions = _case(2, eos=0)
    model.eval()
    with torch.no_grad():
        padded = padded_completion_logps(model, prompts, completions, temperature=0.7)
        for n, completion in enumerate(completions):
            prompt = prompts[n // 2]
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / 0.7
            alone = logits[len(prompt) - 1:-1].log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            assert torch.allclose(padded.logps[n, :len(completion)], alone, rtol=0, atol=TOLERANCE)


def test_lora_gradients_of_packed_scores_equal_the_padded_ones(model):
    prompts, completions = _case(3, eos=0, seed=1)
    model.eval()  # no dropout: the two layouts' forwards are otherwise the same function
    grads = {}
    for name in ("packed", "padded"):
        model.zero_grad(set_to_none=True)
        _, packed, padded = _scores(model, prompts, completions, capacity=40)
        scores = packed if name == "packed" else padded
        (scores.logps.sum() + 0.1 * scores.entropies.sum()).backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert grads["packed"].keys() == grads["padded"].keys() and len(grads["packed"]) > 4
    assert all("lora" in n for n in grads["packed"])
    scale = max(g.abs().max().item() for g in grads["padded"].values())
    assert scale > 0
    gap = max((grads["packed"][n] - grads["padded"][n]).abs().max().item() for n in grads["packed"])
    assert gap <= TOLERANCE * scale


@pytest.mark.parametrize("group_size", [3, 5, 8])
def test_the_attention_path_gives_every_one_of_g_branches_the_prompt_and_itself(group_size):
    """[prompt | c1 | ... | cG] with every ci's positions starting at the prompt's length, several prompts a row,
    one-token completions among them: outputs and q/k/v gradients equal each branch after its own prompt."""
    from finetune.model.varlen_attention import varlen_sdpa_forward

    gen = torch.Generator().manual_seed(group_size)
    positions = []
    for _ in range(3):
        p = int(torch.randint(1, 9, (1,), generator=gen))
        positions += list(range(p))
        for _ in range(group_size):
            c = int(torch.randint(1, 7, (1,), generator=gen))
            positions += list(range(p, p + c))
    length, module = len(positions), types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)

    def run(fn):
        q, k, v = (torch.randn(1, 2, length, 8, generator=torch.Generator().manual_seed(i)).requires_grad_()
                   for i in range(3))
        out = fn(q, k, v)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9)))
        return out, q.grad, k.grad, v.grad

    got = run(lambda q, k, v: varlen_sdpa_forward(module, q, k, v, None, position_ids=torch.tensor([positions]))[0])
    want = run(lambda q, k, v: _oracle(q, k, v, positions))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_the_guard_passes_shared_rows_and_catches_broken_layouts(tiny_model_dir):
    from finetune.model import base_causal_lm
    from finetune.model.isolation import MAX_LEAK_FRACTION
    from finetune.model.varlen_attention import restore_sdpa
    from finetune.train.grpo import scoring

    model = _lora_model(tiny_model_dir)
    model.train()
    assert scoring.shared_scoring_leak(model) < 1e-4 and scoring.check_shared_scoring(model)
    assert model.training and all(m.training for m in model.modules())  # the guard put the modes back

    def positions_run_on(prompts, completions, capacity, share_prompt=True):
        segments = scoring._segments(prompts, completions, capacity, share_prompt)
        return [scoring._row(segments, restart=False)]

    def last_target_off_by_one(prompts, completions, capacity, share_prompt=True):
        rows = scoring.pack_scoring_rows(prompts, completions, capacity, share_prompt)
        position, token, n, j = rows[0].targets[-1]
        rows[0].targets[-1] = (position - 1, token, n, j)
        return rows

    assert not scoring.check_shared_scoring(model, pack=positions_run_on)
    assert scoring.shared_scoring_leak(model, pack=last_target_off_by_one) > MAX_LEAK_FRACTION

    # stock SDPA reads a completion whose positions restart at the prompt's length as an example of its own,
    # without the prompt (as flash-attn and flex_attention would): the guard says no, and rows without sharing,
    # each completion after its own prompt, still score as the padded reference does
    restore_sdpa(base_causal_lm(model))
    assert scoring.shared_scoring_leak(model) > MAX_LEAK_FRACTION and not scoring.check_shared_scoring(model)
    prompts, completions = _case(3, eos=0)
    model.eval()
    with torch.no_grad():
        _, unshared, padded = _scores(model, prompts, completions, capacity=40, share=False)
    assert torch.allclose(unshared.logps, padded.logps, rtol=0, atol=TOLERANCE)


# --- generation ------------------------------------------------------------------------------------------------

EOS_IDS = [0] + list(range(100, 160))  # the tokenizer's EOS (id 0) and 60 more: ~1 in 8 draws ends a completion


def _generate(model, seed, prompts=None, **kwargs):
    from finetune.train.grpo.generation import generate_completions

    prompts = prompts or [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
    settings = dict(num_generations=4, max_completion_length=12, seed=seed, eos_ids=EOS_IDS, pad_id=3)
    return generate_completions(model, prompts, **{**settings, **kwargs})


def test_the_same_seed_samples_the_same_completions_and_leaves_the_global_rng_alone(model):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, again, other = _generate(model, seed=7), _generate(model, seed=7), _generate(model, seed=8)
    assert torch.equal(torch.get_rng_state(), before)  # training's dropout and shuffles are not shifted
    assert first == again and first.ids != other.ids
    assert len(first.ids) == 12 and first.num_generations == 4 and first.prompt_index(5) == 1
    assert len(set(map(tuple, first.ids[:4]))) > 1  # a prompt's G completions differ from each other


def test_completions_stop_after_their_first_eos_and_truncation_is_flagged(model):
    completions = _generate(model, seed=3)
    eos = set(EOS_IDS)
    assert any(completions.is_truncated) and not all(completions.is_truncated)
    for ids, truncated in zip(completions.ids, completions.is_truncated):
        ends = [t for t, token in enumerate(ids) if token in eos]
        if truncated:
            assert ends == [] and len(ids) == 12
        else:
            assert ends == [len(ids) - 1]  # the EOS is kept, nothing after it
    assert completions.lengths == [len(ids) for ids in completions.ids]


def test_completions_are_what_the_model_samples_with_those_settings(model):
    """Against transformers' own sampling of the same distribution with the same seed: the completions are its
    tokens up to the first EOS, and temperature / top_k / top_p reach the sampler."""
    from transformers import GenerationConfig

    prompts = [[5, 6, 7], [9, 10, 11]]  # equal lengths: no padding to reproduce
    config = GenerationConfig(max_new_tokens=12, do_sample=True, num_return_sequences=4, temperature=0.8, top_k=40,
                              top_p=0.9, eos_token_id=EOS_IDS, pad_token_id=3, use_cache=True)
    model.eval()
    torch.manual_seed(11)
    raw = model.generate(input_ids=torch.tensor(prompts), generation_config=config)[:, 3:].tolist()
    # a checkpoint's generation_config.json fills every knob left unset: not ours, which sets them all
    own = model.get_base_model().generation_config
    own.repetition_penalty, own.min_p = 3.0, 0.2
    try:
        got = _generate(model, seed=11, prompts=prompts, temperature=0.8, top_k=40, top_p=0.9)
    finally:
        own.repetition_penalty = own.min_p = None
    for ids, tokens in zip(got.ids, raw):
        assert tokens[:len(ids)] == ids and (len(ids) == 12 or tokens[len(ids):] == [3] * (len(tokens) - len(ids)))
    assert _generate(model, seed=11, prompts=prompts).ids != got.ids  # the settings change what is drawn


def test_generation_samples_in_eval_mode_with_the_cache_and_restores_each_module(tiny_model_dir):
    from finetune.model import base_causal_lm

    model = _lora_model(tiny_model_dir)
    model.train()
    base_causal_lm(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # as the packing guard leaves it
    frozen = base_causal_lm(model).model.norm
    frozen.eval()  # a module its owner keeps in eval mode stays so
    seen = []
    embed = base_causal_lm(model).get_input_embeddings()
    handle = embed.register_forward_pre_hook(lambda module, args: seen.append((model.training, args[0].shape[1])))
    try:
        _generate(model, seed=0)
    finally:
        handle.remove()
    assert seen[0] == (False, 6) and len(seen) > 2
    assert all(training is False and width == 1 for training, width in seen[1:])  # cached: one new token a step
    assert model.training and not frozen.training
    assert all(m.training for m in model.modules() if m is not frozen)


def test_the_adapter_is_live_during_generation(tiny_model_dir):
    model = _lora_model(tiny_model_dir)
    before = _generate(model, seed=5)
    with model.disable_adapter():
        without = _generate(model, seed=5)
    assert without.ids != before.ids
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n and "o_proj" in n).add_(0.5)
    assert _generate(model, seed=5).ids != before.ids


def test_decoding_drops_special_tokens(tiny_tokenizer):
    from finetune.train.grpo.generation import Completions, decode_completions

    ids = tiny_tokenizer("the cat sat")["input_ids"]
    completions = Completions(ids=[ids + [tiny_tokenizer.eos_token_id], ids], is_truncated=[False, True],
                              num_generations=2)
    assert decode_completions(tiny_tokenizer, completions) == ["the cat sat", "the cat sat"]


def test_bad_arguments_say_what_to_fix(model):
    with pytest.raises(ValueError, match="temperature"):
        _generate(model, seed=0, temperature=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        _generate(model, seed=0, prompts=[[1, 2], []])
