"""GRPO's rollouts (finetune/train/grpo/generation.py, decoding.py): each prompt prefilled once and its cache held G
times, sampled token for token as transformers' `generate(num_return_sequences=G)` samples at the same seed (fp32,
the LoRA adapter live, a left-padded batch of several prompts); and episodes of several turns continued from their
cache exactly as sampling from the concatenated ids would."""

from __future__ import annotations

import pytest
import torch
from test_grpo_scoring import _lora_model

EOS_IDS = [0] + list(range(100, 160))  # the tokenizer's EOS and 60 more: ~1 in 8 draws ends a completion
PAD = 3
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18], [19, 20, 21, 22, 23, 24, 25, 26, 27]]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return _lora_model(tiny_model_dir)


def _generate_oracle(model, prompts, group, limit, seed, temperature=1.0, top_p=1.0, top_k=0):
    """What generate_completions did before: one `generate` with num_return_sequences, cut after the first EOS."""
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(max_new_tokens=limit, do_sample=True, num_return_sequences=group, temperature=temperature,
                              top_p=top_p, top_k=top_k, eos_token_id=EOS_IDS, pad_token_id=PAD, bos_token_id=None,
                              use_cache=True)
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    finally:
        model.train(was_training)
    out = []
    for row in rows:
        end = next((t for t, token in enumerate(row) if token in EOS_IDS), None)
        out.append(row[:end + 1] if end is not None else row)
    return out


def _widths(model, fn):
    """(batch, width) of every forward the model makes while fn() runs, and fn's result."""
    from finetune.model import base_causal_lm

    seen = []
    embed = base_causal_lm(model).get_input_embeddings()
    handle = embed.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    try:
        return seen, fn()
    finally:
        handle.remove()


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7, "top_k": 50, "top_p": 0.9}])
def test_one_prefill_per_prompt_samples_exactly_what_generate_samples(model, settings):
    from finetune.train.grpo.generation import generate_completions

    group, limit = 4, 12
    for seed in (0, 1, 2):
        seen, got = _widths(model, lambda: generate_completions(
            model, PROMPTS, group, limit, seed=seed, eos_ids=EOS_IDS, pad_id=PAD, **settings))
        assert got.ids == _generate_oracle(model, PROMPTS, group, limit, seed, **settings)
        assert [len(ids) == limit and ids[-1] not in EOS_IDS for ids in got.ids] == got.is_truncated
        assert seen[0] == (len(PROMPTS), 9)  # each prompt once, not G times
        assert all(shape == (len(PROMPTS) * group, 1) for shape in seen[1:])  # then one token a row a step
    assert any(got.is_truncated) and not all(got.is_truncated)


def test_every_steps_logits_are_generates_bit_for_bit(model):
    """The reason the tokens match: each step's logits are generate's, bit for bit (the LM head of the one prefill
    is computed once per prompt and copied G times)."""
    from transformers import GenerationConfig

    from finetune.model import base_causal_lm
    from finetune.train.grpo import decoding

    group, limit, seen = 4, 6, []
    width = max(map(len, PROMPTS))
    config = GenerationConfig(max_new_tokens=limit, do_sample=True, num_return_sequences=group, eos_token_id=[0],
                              pad_token_id=PAD, bos_token_id=None, return_dict_in_generate=True, output_logits=True,
                              top_k=0)
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        reference = model.generate(input_ids=torch.tensor([[PAD] * (width - len(p)) + p for p in PROMPTS]),
                                   attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS]),
                                   generation_config=config)
        torch.manual_seed(0)
        state = decoding.prefill(base_causal_lm(model), PROMPTS, group, PAD)
        decoding.sample(base_causal_lm(model), state, [limit] * len(PROMPTS) * group, [0], PAD,
                        lambda ids, scores: seen.append(scores) or scores)
    assert len(seen) == len(reference.logits) == limit
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(seen, reference.logits))


def test_the_draw_is_torch_multinomials():
    from finetune.train.grpo.decoding import draw

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 997, generator=gen) * 4
    scores[2, 10:] = -float("inf")  # a top-k cut: ten candidates left
    for seed in range(20):
        torch.manual_seed(seed)
        expected = torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(draw(scores), expected)
        assert int(draw(scores)[2]) < 10


def test_a_continued_episode_samples_what_the_concatenated_ids_would(model):
    """Turn 1, some rows go on, tool results appended (two appends, one row given nothing the second time), turn 2
    from the cache: the same tokens as sampling the concatenated ids from scratch, and no prefix is re-run."""
    from finetune.model import base_causal_lm
    from finetune.train.grpo import decoding
    from finetune.train.grpo.generation import Episodes, generate_completions

    group, limit = 3, 10
    episodes = Episodes(model, PROMPTS, group, pad_id=PAD)
    first = episodes.sample(limit, seed=4, eos_ids=EOS_IDS)
    assert first.ids == _generate_oracle(model, PROMPTS, group, limit, 4)
    rows = [1, 4, 5, 8, 10]
    episodes.keep(rows)
    assert episodes.prompt_index == [0, 1, 1, 2, 3]
    results = [[40, 41, 42], [43], [44, 45], [46, 47, 48, 49], [50]]
    more = [[51], [], [52, 53], [], [54]]
    seen, _ = _widths(model, lambda: (episodes.append(results), episodes.append(more)))
    assert seen == [(5, 5), (5, 2)]  # the rows' new tokens only: [last sampled] + results, then [re-fed] + more
    whole = [PROMPTS[i // group] + first.ids[i] + r + m for i, r, m in zip(rows, results, more)]
    assert episodes.tokens == whole
    with torch.no_grad():  # the next-token logits from the cache are those of the whole ids run from scratch
        model.eval()
        scratch = decoding.prefill(base_causal_lm(model), whole, 1, PAD).logits
    assert torch.allclose(episodes._state.logits, scratch, rtol=0, atol=1e-5)
    second = episodes.sample(limit, seed=9, eos_ids=EOS_IDS)
    fresh = generate_completions(model, whole, 1, limit, seed=9, eos_ids=EOS_IDS, pad_id=PAD)
    assert second.ids == fresh.ids and second.is_truncated == fresh.is_truncated
    # and once more, straight after a turn (nothing appended): the last sampled tokens are fed first
    third = episodes.sample(limit, seed=11, eos_ids=EOS_IDS)
    again = generate_completions(model, [w + s for w, s in zip(whole, second.ids)], 1, limit, seed=11,
                                 eos_ids=EOS_IDS, pad_id=PAD)
    assert third.ids == again.ids


def test_each_row_stops_at_its_own_budget(model):
    from finetune.train.grpo.generation import Episodes

    episodes = Episodes(model, PROMPTS[:2], 2, pad_id=PAD)
    turn = episodes.sample([1, 3, 12, 12], seed=1, eos_ids=[0])  # only the tokenizer's EOS: the long rows go on
    assert [len(ids) for ids in turn.ids[:2]] == [1, 3] and turn.is_truncated[:2] == [True, True]
    assert episodes.tokens == [PROMPTS[i // 2] + ids for i, ids in enumerate(turn.ids)]
    with pytest.raises(ValueError, match="one limit for each of the 4 rows"):
        episodes.sample([3, 3], seed=1, eos_ids=[0])
    with pytest.raises(ValueError, match="keep: rows between 0 and 3"):
        episodes.keep([4])


def test_a_recurrent_cache_is_prefilled_per_copy_and_cannot_be_continued(tiny_tokenizer):
    """Qwen3-Next keeps linear-attention states: its G copies are prefilled as generate does (the family matrix holds
    its tokens equal to generate's), and continuing a row, which would feed a state padding, is refused."""
    from tiny import family_config
    from transformers import AutoModelForCausalLM

    from finetune.train.grpo.generation import Episodes

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config("qwen3_next", tiny_tokenizer)).float()
    seen, episodes = _widths(model, lambda: Episodes(model, PROMPTS[:2], 2, pad_id=PAD))
    assert seen == [(4, 7)]  # each prompt twice
    episodes.sample(3, seed=0, eos_ids=EOS_IDS)
    for call in (lambda: episodes.append([[5]] * 4), lambda: episodes.keep([0])):
        with pytest.raises(ValueError, match="softmax attention: this one keeps recurrent"):
            call()
