"""An agent's turns continued from the KV cache (finetune/train/grpo/turns.py, CachedTurns: the run's) give the same
episodes as sampling every turn from the whole ids (Reprefill over generate_completions: what the run did before),
on the tiny Llama with LoRA live, fp32, left-padded prompts of several lengths, with a scripted tool environment: the
same ids, masks, rollbacks and budgets, while the prefix is never run again."""

from __future__ import annotations

import pytest
from test_grpo_rollout import EOS_IDS, PAD, PROMPTS, _widths
from test_grpo_scoring import _lora_model

from finetune.train.grpo.tool_calls import Turn
from finetune.train.grpo.tools import ToolOutcome

GROUP, LIMIT, SEED = 3, 24, 7  # LIMIT: max_completion_length; ~1 draw in 8 is an EOS


def parse(ids, prefix, schemas):
    """The script's 'tool calls': a turn whose first token is not a multiple of 3 calls `look` with it."""
    calls = [] if ids[0] % 3 == 0 else [{"type": "function", "function": {"name": "look", "arguments": {"n": ids[0]}}}]
    return Turn(content=str(ids), calls=calls)


def call_tools(calls):
    return [ToolOutcome(ok=True, value="x" * (1 + args["n"] % 5), seconds=0.0) for _, _, args in calls]


def suffix_ids(messages):
    """The tool results' ids (1 to 5 tokens each, then a header token), as the template's suffix would be."""
    return [t for m in messages for t in [40 + len(m["content"])] * len(m["content"])] + [31]


def episodes(model, prompt_ids, sampler):
    from finetune.train.grpo.episodes import EpisodeSettings, run_episodes

    settings = EpisodeSettings(LIMIT, 3, 10_000, 4096, tuple(EOS_IDS))
    return run_episodes(prompt_ids, GROUP, sampler, parse, call_tools, suffix_ids, len, [], settings)


def samplers(model):
    from finetune.train.grpo.generation import generate_completions
    from finetune.train.grpo.turns import CachedTurns, Reprefill, turn_seed

    sampling = {"eos_ids": EOS_IDS, "pad_id": PAD}
    reprefill = Reprefill(lambda prompts, group, limit, turn: generate_completions(
        model, prompts, group, limit, seed=turn_seed(SEED, turn), **sampling).ids)
    return CachedTurns(model, SEED, **sampling), reprefill


def fed(model, prompt_ids, sampler):
    """(the episodes, every forward's (batch, width))."""
    seen, batch = _widths(model, lambda: episodes(model, prompt_ids, sampler))
    return batch, seen


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return _lora_model(tiny_model_dir)


@pytest.mark.parametrize("shared", [True, False], ids=["group-prompts", "a-prompt-per-rollout"])
def test_cached_turns_sample_the_episodes_reprefilling_samples_and_never_rerun_the_prefix(model, shared):
    # a group's rollouts share their prompt (prefilled once for G rows), or each has its own (reset() observations)
    prompt_ids = [p + ([] if shared else [60 + g]) for p in PROMPTS for g in range(GROUP)]
    cached, reprefill = samplers(model)
    ours, ours_fed = fed(model, prompt_ids, cached)
    theirs, theirs_fed = fed(model, prompt_ids, reprefill)
    assert ours.ids == theirs.ids and ours.masks == theirs.masks
    assert episodes(model, prompt_ids, samplers(model)[0]).ids == ours.ids  # seeded by (step, turn): resume replays
    for a, b in zip(ours.episodes, theirs.episodes):
        assert (a.rounds, a.rolled_back, a.cut_by_cap, a.truncated, a.calls) == \
               (b.rounds, b.rolled_back, b.cut_by_cap, b.truncated, b.calls)
    # the script goes where the loop branches: later turns, tool tokens, a rollback, a turn cut by the budget
    rounds = [e.rounds for e in ours.episodes]
    assert max(rounds) >= 2 and 0 in ours.masks[rounds.index(max(rounds))]
    assert any(e.rolled_back for e in ours.episodes)
    assert any(e.rounds and e.truncated for e in ours.episodes)
    # the first forward is the prefill (each prompt once when shared); after it, a turn feeds one token a row, and
    # a continued turn only its last sampled token and the tool results: never the prompt or the episode so far
    assert ours_fed[0] == (len(PROMPTS) if shared else len(prompt_ids), max(map(len, prompt_ids)))
    assert all(width <= 1 + 6 for _, width in ours_fed[1:]), ours_fed  # 5 result tokens + a header + the last token
    assert max(width for _, width in theirs_fed[1:]) > max(map(len, prompt_ids))  # reprefilling runs the prefix
    ours_tokens, theirs_tokens = (sum(b * w for b, w in f) for f in (ours_fed, theirs_fed))
    assert ours_tokens < theirs_tokens, (ours_tokens, theirs_tokens)
    print(f'positions fed: cached {ours_tokens}, reprefilled {theirs_tokens}')


def test_an_unpadded_row_continued_by_several_tokens_sees_its_whole_prefix(model):
    """One row, no padding anywhere (the mask all ones): the tool results appended after a turn are run through the
    model after its cache, and the next-token logits are those of the whole ids run from scratch. (The per-example
    attention once read such a mask as 'no mask' and SDPA's is_causal then aligned the new tokens to the cache's first
    key: they saw the first few tokens of the prompt only.)"""
    import torch

    from finetune.model import base_causal_lm
    from finetune.train.grpo import decoding
    from finetune.train.grpo.generation import Episodes

    episodes = Episodes(model, PROMPTS[:1], 1, pad_id=PAD)
    turn = episodes.sample(4, seed=0, eos_ids=[0])
    episodes.append([[40, 41, 42]])
    with torch.no_grad():
        model.eval()
        scratch = decoding.prefill(base_causal_lm(model), [PROMPTS[0] + turn.ids[0] + [40, 41, 42]], 1, PAD).logits
    assert torch.allclose(episodes._state.logits, scratch, rtol=0, atol=1e-5)


def test_a_recurrent_cache_samples_later_turns_by_reprefilling(tiny_tokenizer):
    """Qwen3-Next keeps linear-attention states, which cannot be continued over the padding between turns: the first
    turn is the cached one (generate_completions), the later ones re-run the whole ids, and the episodes are those
    of reprefilling every turn."""
    import torch
    from tiny import family_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config("qwen3_next", tiny_tokenizer)).float()
    prompt_ids = [p for p in PROMPTS[:2] for _ in range(GROUP)]
    cached, reprefill = samplers(model)
    ours, theirs = episodes(model, prompt_ids, cached), episodes(model, prompt_ids, reprefill)
    assert cached.fallback is not None and cached.episodes is None
    assert ours.ids == theirs.ids and ours.masks == theirs.masks
    assert max(e.rounds for e in ours.episodes) >= 1


@pytest.mark.parametrize("window", [6, 512])
def test_a_sliding_window_continues_from_the_cache_only_while_the_episode_fits_in_it(tiny_tokenizer, window):
    """Gemma 3's sliding-window layer counts the cache's columns, padding between turns included: past the window a
    continued row would see padding in place of its real tokens (its logits off by ~0.1-0.4 from a fresh run, and
    other tokens sampled). Within the window the turns go on from the cache; past it they re-run the whole ids. Either
    way the episodes are those of reprefilling every turn."""
    import torch
    from tiny import family_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = family_config("gemma3_text", tiny_tokenizer)
    config.sliding_window = window
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    prompt_ids = [p for p in PROMPTS for _ in range(GROUP)]
    cached, reprefill = samplers(model)
    ours, theirs = episodes(model, prompt_ids, cached), episodes(model, prompt_ids, reprefill)
    assert max(e.rounds for e in ours.episodes) >= 1
    assert ours.ids == theirs.ids and ours.masks == theirs.masks
    assert (cached.fallback is not None) == (window == 6) and (cached.episodes is None) == (window == 6)
