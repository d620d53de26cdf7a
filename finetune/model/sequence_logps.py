"""Per-sequence log-probabilities of the response tokens, the quantity every preference loss is made of.

For a batch from finetune/data/preference/collate.py: one forward pass of the model as the Trainer holds it
(DDP / DeepSpeed wrappers included, so their gradient hooks run), then, for every supervised token, log p(token)
at the position that predicts it (the one before it; where pairs share their prompt, the prompt's last position
predicts both responses' first tokens), summed per sequence. The LM head runs only on those
positions: a pre-hook on the output embeddings takes the hidden states of the supervised positions and hands
the head zero rows; the head and log-softmax then run on the gathered rows chunk by chunk, each chunk under
activation checkpointing when gradients are on (at most one chunk's logits exist at a time: a 152k vocabulary
makes 4,096 rows of fp32 logits 2.5 GB). Under DeepSpeed ZeRO-3 the head instead runs once, inside the forward,
on the gathered rows (all their logits at once): every call of a partitioned head is a collective, so every
process must call it as often as the others.
`probe_gathered_head` proves on the real model, before training, that this equals log-softmax over the model's
own full logits (a model that post-processes its logits, e.g. soft-capping, fails the probe and is run with full
logits instead).
"""

from __future__ import annotations

from finetune.compat import zero3_partitioned
from finetune.contract import IGNORE_INDEX
from finetune.model.supervised_logits import CHUNK_LOGITS

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")
PROBE_TOLERANCE = 1e-4  # fp32 sums of the same terms in another order differ ~1e-7 of their size


class _GatherRows:
    """Forward pre-hook on the LM head: keep the hidden states at (`rows`, `positions`) of a (batch, seq) `shape`
    (a position may be listed twice: a shared prompt's last one); give the head none of them, or (`keep`) only
    them."""

    def __init__(self, shape, rows, positions, keep: bool = False):
        self.shape, self.index, self.keep, self.rows = tuple(shape), (rows, positions), keep, None

    def __call__(self, module, args):
        hidden = args[0]
        if self.rows is not None or tuple(hidden.shape[:-1]) != self.shape:
            return None
        self.rows = hidden[self.index]
        return (self.rows if self.keep else self.rows[:0], *args[1:])


def supervised_targets(batch: dict):
    """(rows, positions, target ids, sequences): for every supervised token, the position whose hidden state
    predicts it, the token, and the sequence it belongs to. A batch whose pairs share their prompt lists them
    (finetune/data/preference/collate.py); otherwise position t predicts the label at t + 1."""
    import torch.nn.functional as F

    from finetune.data.preference.collate import TARGET_KEYS

    if TARGET_KEYS[0] in batch:
        return tuple(batch[key] for key in TARGET_KEYS)
    shifted = F.pad(batch["labels"], (0, 1), value=IGNORE_INDEX)[:, 1:]  # position t predicts token t + 1
    mask = shifted != IGNORE_INDEX
    owner = F.pad(batch["sequence_index"], (0, 1), value=-1)[:, 1:][mask]  # the sequence of each target
    rows, positions = mask.nonzero(as_tuple=True)  # row-major: the order of shifted[mask]
    return rows, positions, shifted[mask], owner


def _token_logps(head, hidden, targets):
    logits = head(hidden).float()
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _chunked_logps(head, rows, targets, chunk_rows: int):
    import torch
    from torch.utils.checkpoint import checkpoint

    if rows.shape[0] == 0:
        return rows.new_zeros(0, dtype=torch.float32)
    pieces = []
    for start in range(0, rows.shape[0], chunk_rows):
        part = slice(start, start + chunk_rows)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_token_logps, head, rows[part], targets[part], use_reentrant=False))
        else:
            pieces.append(_token_logps(head, rows[part], targets[part]))
    return torch.cat(pieces)


def response_logps(model, head, batch: dict, full_logits: bool = False):
    """(summed log-probs per sequence (S,), fp32): S = the batch's sequences, as `sequence_lengths` lists them.
    `model` is what the Trainer calls (wrapped or not); `head` its LM head module."""
    import torch

    from finetune.data.preference.collate import VISION_INPUTS

    rows, positions, targets, owner = supervised_targets(batch)
    # a vision-language model's pixels and modality ids beside the ids (finetune/data/preference/collate.py)
    inputs = {**{k: batch[k] for k in MODEL_INPUTS if k in batch}, **batch.get(VISION_INPUTS, {})}
    if full_logits:
        logits = model(**inputs, use_cache=False).logits
        token_logps = logits[rows, positions].float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    else:
        # ZeRO-3 gathers the head's weight from every process at each call of the head: a number of chunks that
        # differs between processes (their batches hold different numbers of response tokens) would leave them
        # waiting in different collectives (a hang), and a chunk recomputed in the backward would find the weight
        # freed again. Under ZeRO-3 the head runs once, in the forward, on the gathered rows, on every process.
        in_forward = zero3_partitioned(head)
        gather = _GatherRows(batch["input_ids"].shape, rows, positions, keep=in_forward)
        handle = head.register_forward_pre_hook(gather)
        try:
            out = model(**inputs, use_cache=False)
        finally:
            handle.remove()
        if gather.rows is None:
            raise RuntimeError("the LM head was not called on the hidden states: use full logits for this model")
        if in_forward:
            logits = out.logits
            if logits.dim() != 2 or logits.shape[0] != targets.shape[0]:  # the probe then picks full logits
                raise RuntimeError("the model's forward reshaped the gathered rows' logits")
            token_logps = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        else:
            chunk_rows = max(1, CHUNK_LOGITS // (getattr(head, "out_features", None) or head.weight.shape[0]))
            token_logps = _chunked_logps(head, gather.rows, targets, chunk_rows)
    sequences = batch["sequence_lengths"].shape[0]
    return torch.zeros(sequences, dtype=torch.float32, device=token_logps.device).index_add(0, owner, token_logps)


def probe_gathered_head(model, head, collator_batch: dict) -> bool:
    """True when the gathered-rows path gives the full-logits path's numbers on this model (eval mode, no grad)."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = response_logps(model, head, collator_batch, full_logits=True)
            try:
                gathered = response_logps(model, head, collator_batch)
            except Exception:  # a forward that does not call the head on the hidden states
                return False
    finally:
        model.train(was_training)
    scale = max(full.abs().max().item(), 1.0)
    return (gathered - full).abs().max().item() <= PROBE_TOLERANCE * scale
