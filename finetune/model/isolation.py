"""Prove, on the model about to be trained, that packed examples cannot attend to each other.

Isolation depends on the architecture's mask code and the attention kernel, both outside our control, so
it is measured rather than assumed: a short example `b` is run (1) alone, (2) packed after another
example `a` through the real collator, in a batch with a second, padded row, and (3) glued to `a` as one
sequence (what cross-attention would look like). Packed logits must match the alone logits far more
closely than the glued ones do; otherwise training refuses to start. Three forward passes of ~20 tokens.

Pairs that share their prompt (finetune/data/preference/collate.py) are checked the same way with their own
layout: a pair packed after another, prompt once then chosen then rejected, must give its chosen and its rejected
response the logits each has after its own prompt alone; glued (the whole row one sequence, so the rejected
response sees the chosen one and the other pair) is the scale of a leak.
"""

from __future__ import annotations

from finetune.errors import ModelError

# The packed-vs-alone gap must be under this fraction of the glued-vs-alone gap: numeric noise (bf16,
# different kernels for different shapes) is ~1e-3 of it; any real leak is of the order of 1.
MAX_LEAK_FRACTION = 0.05


def _row(ids: list[int], positions: list[int]) -> dict:
    return {"input_ids": ids, "labels": ids, "position_ids": positions}


def _logits(model, batch: dict):
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"})
    return out.logits.float()


def packed_isolation_gap(model, collator) -> tuple[float, float]:
    """(max |packed - alone|, max |glued - alone|) over the logits of the second example."""
    import torch

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (7, 9, 5))
    n_a, n_b = len(a), len(b)
    was_training = model.training
    model.eval()
    try:
        packed = collator([_row(a + b, list(range(n_a)) + list(range(n_b))), _row(c, list(range(len(c))))])
        alone = {"input_ids": torch.tensor([b]), "position_ids": torch.tensor([list(range(n_b))])}
        glued = {"input_ids": torch.tensor([a + b]), "position_ids": torch.tensor([list(range(n_a + n_b))])}
        packed_b = _logits(model, packed)[0, n_a:n_a + n_b]
        alone_b = _logits(model, alone)[0]
        glued_b = _logits(model, glued)[0, n_a:]
    finally:
        model.train(was_training)
    return (packed_b - alone_b).abs().max().item(), (glued_b - alone_b).abs().max().item()


def check_packed_isolation(model, collator, attn_implementation: str) -> float:
    """Raise ModelError unless packed examples are isolated; returns the measured leak fraction."""
    gap, glued = packed_isolation_gap(model, collator)
    fraction = gap / glued if glued > 0 else (0.0 if gap == 0 else float("inf"))
    if fraction > MAX_LEAK_FRACTION:
        raise ModelError(
            f"sample packing is not safe with this model and attention `{attn_implementation}`: a packed example's "
            f"logits move by {gap:.3g} when another example shares its row (vs {glued:.3g} with full "
            "cross-attention), so packed examples would attend to each other. Set `sample_packing: false` (and "
            "`eval_sample_packing: false`), or try `attn_implementation: sdpa` / `eager` / `flash_attention_2`."
        )
    return fraction


def guard_packing(model, collator, attn_implementation: str) -> float:
    """Make the model honour packed rows, then prove it; returns the measured leak fraction."""
    # With use_cache on, the forward builds a KV cache even in training, and transformers then skips the
    # packed-sequence mask: every token would see the whole row. Training never reads the cache.
    model.config.use_cache = False
    return check_packed_isolation(model, collator, attn_implementation)


class _Pairs:
    """A stand-in PairStore: (prompt, chosen, rejected) token lists by id."""

    unpaired = False

    def __init__(self, pairs: list[tuple[list[int], list[int], list[int]]]):
        self.pairs = pairs

    def sequences(self, item: int) -> list[tuple[list[int], list[int]]]:
        prompt, chosen, rejected = self.pairs[item]
        return [(prompt, chosen), (prompt, rejected)]


def shared_prompt_gap(model, collator) -> tuple[float, float]:
    """(max |shared - alone|, max |glued - alone|) over the logits of the second pair's chosen and rejected
    responses (and its prompt), the pair packed after another with prompts shared, in a batch with a second,
    padded row. `collator`: a PreferenceCollator that shares prompts."""
    import dataclasses

    import torch

    from finetune.data.preference.rows import PACKED

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    draw = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (6, 5, 4, 7, 6, 5, 3, 4, 4)]
    a, b, c = draw[0:3], draw[3:6], draw[6:9]  # (prompt, chosen, rejected) of three pairs
    shared = dataclasses.replace(collator, store=_Pairs([tuple(a), tuple(b), tuple(c)]), share_prompt=True)
    batch = shared([{PACKED: [0, 1]}, {PACKED: [2]}])
    start, (prompt, chosen, rejected) = sum(map(len, a)), b
    was_training = model.training
    model.eval()
    try:
        row = _logits(model, {k: batch[k] for k in ("input_ids", "position_ids")})[0]
        packed_c = row[start:start + len(prompt) + len(chosen)]
        packed_r = row[start + len(prompt) + len(chosen):start + len(prompt) + len(chosen) + len(rejected)]
        alone_c = _logits(model, _alone(prompt + chosen))[0]
        alone_r = _logits(model, _alone(prompt + rejected))[0, len(prompt):]
        glued = _logits(model, _alone(sum(a, []) + prompt + chosen + rejected))[0, start:]
        glued_c, glued_r = glued[:len(prompt) + len(chosen)], glued[len(prompt) + len(chosen):]
    finally:
        model.train(was_training)
    gap = max((packed_c - alone_c).abs().max().item(), (packed_r - alone_r).abs().max().item())
    return gap, max((glued_c - alone_c).abs().max().item(), (glued_r - alone_r).abs().max().item())


def _alone(ids: list[int]) -> dict:
    import torch

    return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([list(range(len(ids)))])}


def shared_prompt_leak(model, collator) -> float:
    """The leak fraction of pairs sharing their prompt: over MAX_LEAK_FRACTION, they must not share it."""
    gap, glued = shared_prompt_gap(model, collator)
    return gap / glued if glued > 0 else (0.0 if gap == 0 else float("inf"))
