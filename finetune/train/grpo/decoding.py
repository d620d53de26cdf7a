"""The decoding loop under GRPO's rollouts (finetune/train/grpo/generation.py is its public face): a batch of rows,
each a sequence being sampled, with its KV cache, that can be prefilled once and copied G times, sampled from,
extended by tokens that did not come from the model (a tool's result) and narrowed to some of its rows.

Sampling a prefilled batch is token-identical to transformers' `generate(do_sample=True,
num_return_sequences=G)` at the same seed (transformers 5.23), because each call the model sees is the one
`generate` makes, on the same values:
- the prefill runs the P prompts once (left-padded; positions counted from each prompt's first token, as
  `generate` derives them from the mask; no mask at all when no prompt is padded), then the cache and the last
  position's logits are repeated G times in a row (`Cache.batch_repeat_interleave`, prompt i's copies at rows
  i x G onward). A matmul's rows may round differently with the number of rows, but on this project's CPU
  (MKL) the prefill's keys, values and logits over P prompts are bit for bit those over P x G copies, and so is
  every step's logits after (tests/test_grpo_rollout.py checks each step's logits with torch.equal); where a
  kernel does round otherwise, a token can differ only where two candidates tie to the last bit;
- each decoding step feeds every row's new token with its position, the 2D mask grown by a column of ones (or
  None), the cache and `logits_to_keep=1`, as `generate`'s `prepare_inputs_for_generation` does; a finished row
  goes on being fed the pad token, as in `generate`;
- the draw is torch.multinomial(probs, 1)'s own algorithm (torch 2.13, aten/src/ATen/native/Distributions.cpp:
  q ~ Exp(1) over the whole [rows, vocab] tensor, argmax(probs / q)) without its validation passes, which cost as
  much again as the draw; every row draws, finished ones too, so the RNG stream is the one `generate` consumes
  (tests/test_grpo_rollout.py holds it equal to torch.multinomial and to `generate`).

Rows that finished early leave pad tokens in the cache, and the last token sampled in a row is not in it: `valid`
marks the cache columns that hold a row's real tokens, and `cached` counts them. Extending a batch feeds each row
the tokens its cache lacks and the new ones in one forward, masked so that no row sees padding or its own dropped
tokens, at the positions that continue the row; the logits that forward leaves are where the next sampling starts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class DecodeState:
    """A batch of rows being decoded. Columns are the cache's (one per position fed); a row's real tokens are its
    prompt and everything sampled or appended after it, the first `cached` of them in the cache's `valid` columns."""

    cache: object  # the model's KV cache (a transformers Cache), rows in its batch dimension
    mask: torch.Tensor | None  # [rows, columns] long: what the model is fed; None while generate would feed None
    valid: torch.Tensor  # [rows, columns] bool: the columns holding a real token of the row
    tokens: list[list[int]]  # per row: its real tokens, prompt first
    cached: list[int]  # per row: how many of its tokens the cache holds (the rest are fed by the next extend)
    logits: torch.Tensor | None  # [rows, vocab] float32: each row's next-token logits when fresh, else None
    positions: torch.Tensor | None = None  # [rows] long: the position fed next while sampling

    @property
    def rows(self) -> int:
        return len(self.tokens)


def prefill(lm, prompt_ids: list[list[int]], copies: int, pad_id: int) -> DecodeState:
    """Run each prompt once and hold its cache `copies` times (prompt i at rows i x copies onward). A model whose
    cache keeps recurrent states (linear attention) gets each prompt `copies` times instead, as `generate` does."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.config.get_text_config(decoder=True))  # the one generate makes
    shared = copies if attention_only(cache) else 1
    prompts = [list(p) for p in prompt_ids for _ in range(copies // shared)]
    device = next(lm.parameters()).device
    width = max(len(ids) for ids in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device)
    mask = valid.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generate's, from the mask
    fed_mask = None if bool(valid.all()) else mask  # generate drops an all-ones mask
    out = lm(**_inputs(lm, ids, fed_mask, positions, cache))
    cache = out.past_key_values
    if shared > 1:
        cache.batch_repeat_interleave(shared)
    tokens = [p for p in prompts for _ in range(shared)]
    return DecodeState(cache=cache, mask=None if fed_mask is None else fed_mask.repeat_interleave(shared, dim=0),
                       valid=valid.repeat_interleave(shared, dim=0), tokens=tokens, cached=[len(t) for t in tokens],
                       logits=out.logits[:, -1].to(dtype=torch.float32).repeat_interleave(shared, dim=0))


def attention_only(cache) -> bool:
    """Whether every layer of the cache holds keys and values only (no recurrent state): such a cache can be
    copied row by row and can skip masked columns."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    return all(isinstance(layer, DynamicLayer) and not isinstance(layer, LinearAttentionCacheLayerMixin)
               for layer in getattr(cache, "layers", []))


def sliding_window(cache) -> int | None:
    """The narrowest sliding window among the cache's layers; None when no layer slides. Its mask and its cache
    count columns, padding included: a row with padding between its turns sees fewer real tokens than a fresh run
    once its columns pass the window."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    windows = [layer.sliding_window for layer in getattr(cache, "layers", [])
               if isinstance(layer, DynamicSlidingWindowLayer)]
    return min(windows) if windows else None


def sample(lm, state: DecodeState, limits: list[int], eos_ids: list[int], pad_id: int,
           warpers) -> tuple[list[list[int]], list[bool]]:
    """Sample each row up to its first EOS (kept) or `limits[row]` tokens, from the state's fresh logits, with the
    global RNG (the caller seeds it). Returns (each row's new tokens, whether it hit its limit without an EOS)."""
    if state.logits is None:  # after a sampling: the last tokens drawn were never fed
        extend(lm, state, [[] for _ in range(state.rows)], pad_id)
    device = state.logits.device
    rows, longest = state.rows, max(limits)
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    limit = torch.tensor(limits, device=device)
    eos = torch.tensor(eos_ids, device=device)
    logits, drawn = state.logits, []
    state.logits, state.positions = None, torch.tensor([len(t) for t in state.tokens], device=device)
    for step in range(longest):
        tokens = draw(warpers(None, logits))
        tokens = tokens * unfinished + pad_id * (1 - unfinished)
        drawn.append(tokens)
        unfinished = unfinished & ~torch.isin(tokens, eos) & (limit > step + 1).long()
        if step + 1 == longest or not bool(unfinished.any()):
            break
        logits = _step(lm, state, tokens)
    return _cut(state, torch.stack(drawn, dim=1).tolist(), limits, set(eos_ids))


def draw(scores: torch.Tensor) -> torch.Tensor:
    """One token per row, as torch.multinomial(softmax(scores), 1) draws it (the same random numbers, the same
    tokens): argmax(probs / q), q ~ Exp(1) for every (row, token)."""
    probs = torch.softmax(scores, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


def extend(lm, state: DecodeState, ids: list[list[int]], pad_id: int) -> None:
    """Append `ids[row]` to each row and feed the model every token of the row its cache lacks, right-aligned in
    one forward (the gaps masked, each token at the position that continues its row), so that the next `sample`
    continues after them. A row with nothing to feed re-feeds its last token. Needs an attention-only cache:
    a recurrent state (linear attention) cannot skip the padding a row leaves between its turns."""
    _continuable(state)
    for row, new in enumerate(ids):
        state.tokens[row] = state.tokens[row] + list(new)
        if state.cached[row] == len(state.tokens[row]):  # its logits are gone with the others': feed it again
            state.valid[row, int(state.valid[row].nonzero()[-1])] = False
            state.cached[row] -= 1
    chunk = [t[c:] for t, c in zip(state.tokens, state.cached)]
    width = max(len(c) for c in chunk)
    device = state.valid.device
    new_ids = torch.tensor([[pad_id] * (width - len(c)) + c for c in chunk], device=device)
    new_valid = torch.tensor([[False] * (width - len(c)) + [True] * len(c) for c in chunk], device=device)
    offsets = new_valid.long().cumsum(-1) - 1
    positions = (torch.tensor(state.cached, device=device)[:, None] + offsets).masked_fill(~new_valid, 0)
    state.valid = torch.cat([state.valid, new_valid], dim=-1)
    state.mask = state.valid.long()
    out = lm(**_inputs(lm, new_ids, state.mask, positions, state.cache))
    state.cache, state.cached = out.past_key_values, [len(t) for t in state.tokens]
    state.logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)


def keep(state: DecodeState, rows: list[int]) -> None:
    """Narrow the batch to `rows` (in that order)."""
    _continuable(state)
    index = torch.tensor(rows, dtype=torch.long, device=state.valid.device)
    state.cache.batch_select_indices(index)
    state.valid = state.valid[index]
    state.mask = None if state.mask is None else state.mask[index]
    state.tokens, state.cached = [state.tokens[r] for r in rows], [state.cached[r] for r in rows]
    state.logits = None if state.logits is None else state.logits[index]


def _continuable(state: DecodeState) -> None:
    if not attention_only(state.cache):
        raise ValueError("continuing rows from their cache needs a model whose layers all use softmax attention: "
                         "this one keeps recurrent (linear attention) states, which the padding between turns "
                         "would change")


def _step(lm, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
    """Feed every row its drawn token (generate's decoding step); the next-token logits."""
    if state.mask is not None:
        state.mask = torch.cat([state.mask, state.mask.new_ones(state.rows, 1)], dim=-1)
    out = lm(**_inputs(lm, tokens[:, None], state.mask, state.positions[:, None], state.cache))
    state.cache, state.positions = out.past_key_values, state.positions + 1
    return out.logits[:, -1].to(copy=True, dtype=torch.float32)


def _cut(state: DecodeState, drawn: list[list[int]], limits: list[int], eos: set[int]):
    """Each row's tokens up to its first EOS or its limit, appended to the row; the cache columns this sampling
    fed marked (a row's real tokens, except its last, which the next extend feeds)."""
    ids, truncated, fed = [], [], len(drawn[0]) - 1  # the last token drawn was never fed
    valid = torch.zeros((state.rows, fed), dtype=torch.bool, device=state.valid.device)
    for row, tokens in enumerate(drawn):
        end = next((t for t, token in enumerate(tokens[:limits[row]]) if token in eos), None)
        kept = tokens[:end + 1] if end is not None else tokens[:limits[row]]
        ids.append(kept)
        truncated.append(end is None)
        valid[row, :len(kept) - 1] = True
        state.tokens[row] = state.tokens[row] + kept
        state.cached[row] += len(kept) - 1
    state.valid, state.positions = torch.cat([state.valid, valid], dim=-1), None
    return ids, truncated


def _inputs(lm, ids, mask, positions, cache) -> dict:
    kwargs = {"input_ids": ids, "position_ids": positions, "attention_mask": mask, "use_cache": True,
              "return_dict": True}
    if cache is not None:
        kwargs["past_key_values"] = cache
    if _accepts(lm, "logits_to_keep"):
        kwargs["logits_to_keep"] = 1
    return kwargs


def _accepts(lm, name: str) -> bool:
    return name in inspect.signature(lm.forward).parameters
