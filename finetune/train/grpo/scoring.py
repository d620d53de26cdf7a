"""Per-token log-probs (and entropies) of GRPO's completions, a prompt's G completions scored after one copy of it.

A row is a list of segments, packed up to `capacity` tokens; a segment is a prompt once, then its completions:

    input_ids     [prompt 0..P-1 | c1 P..P+L1-1 | c2 P..P+L2-1 | ... | cG P..P+LG-1 | next prompt 0.. | ...]
    position_ids   each completion's positions restart at P (the prompt's length)

On the per-example SDPA path (finetune/model/varlen_attention.py) a segment whose positions start at P > 0 is a
branch of the last one that started at 0: it attends to that one's first P keys (the prompt) and causally to its
own, never to another completion, so every completion scores exactly as after its own copy of the prompt (the
rotary angles come from position_ids). The prompt's last position predicts every completion's first token, which
labels shifted by one cannot say, so each row lists its targets explicitly: (predicting position, token id,
completion, offset in the completion). A prompt whose G completions do not fit `capacity` is split into segments
that each repeat the prompt; without sharing (other attention kernels read a branch as an example of its own,
without the prompt), every completion is a segment [prompt | completion] of its own.

`check_shared_scoring` proves on the model, before training, that shared rows give the padded computation's
log-probs (`padded_completion_logps`: each completion after its own prompt, one right-padded sequence each, full
logits, as TRL scores them); the caller packs without sharing when it says no.

Log-probs and entropies are of softmax(logits / temperature), the distribution sampled from (TRL 1.16 scores
with the same temperature). The LM head runs only on the predicting positions, chunk by chunk
(finetune/model/sequence_logps.py: a pre-hook on the head gathers their hidden states).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from finetune.compat import zero3_partitioned
from finetune.model.isolation import MAX_LEAK_FRACTION
from finetune.model.sequence_logps import _GatherRows
from finetune.model.supervised_logits import CHUNK_LOGITS


@dataclass
class ScoringRow:
    """One packed row: its tokens, positions, and for every completion token the position that predicts it."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    targets: list[tuple[int, int, int, int]] = field(default_factory=list)  # (position, token, completion, offset)
    completions: list[int] = field(default_factory=list)  # global indices of the completions it scores


class Scores(NamedTuple):
    """(n, width) fp32 tensors, completion n of `completions` in row n; `mask` True on its tokens."""

    logps: object
    entropies: object
    mask: object
    completions: object  # (n,) global completion indices, ascending


def pack_scoring_rows(prompt_ids: list[list[int]], completion_ids: list[list[int]], capacity: int,
                      share_prompt: bool = True) -> list[ScoringRow]:
    """Rows of at most `capacity` tokens (a segment longer than that gets a row alone). `completion_ids` are
    prompt-major: prompt i's G = len(completion_ids) // len(prompt_ids) completions at i * G .. i * G + G - 1."""
    segments = _segments(prompt_ids, completion_ids, capacity, share_prompt)
    lengths = [len(prompt) + sum(len(c) for _, c in group) for prompt, group in segments]
    return [_row([segments[k] for k in sorted(row)]) for row in _first_fit_decreasing(lengths, capacity)]


def _generations(prompt_ids, completion_ids) -> int:
    group, rest = divmod(len(completion_ids), max(len(prompt_ids), 1))
    if rest or group == 0:
        raise ValueError(f"{len(completion_ids)} completions for {len(prompt_ids)} prompts: expected G per prompt")
    if any(len(prompt) == 0 for prompt in prompt_ids):
        raise ValueError("an empty prompt: nothing would predict its completions' first tokens")
    return group


def _segments(prompt_ids, completion_ids, capacity: int, share_prompt: bool):
    """[(prompt, [(completion index, ids), ...])]: a prompt's completions in as few segments as fit `capacity`."""
    group_size = _generations(prompt_ids, completion_ids)
    segments = []
    for i, prompt in enumerate(prompt_ids):
        group, size = [], len(prompt)
        for n in range(i * group_size, (i + 1) * group_size):
            completion = list(completion_ids[n])
            if group and (not share_prompt or size + len(completion) > capacity):
                segments.append((list(prompt), group))
                group, size = [], len(prompt)
            group.append((n, completion))
            size += len(completion)
        segments.append((list(prompt), group))
    return segments


def _first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of segment indices: longest first, each into the first row with room (hundreds of segments a step)."""
    rows, rooms = [], []
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        fit = next((r for r, room in enumerate(rooms) if room >= lengths[k]), None)
        if fit is None:
            rows.append([k])
            rooms.append(capacity - lengths[k])
        else:
            rows[fit].append(k)
            rooms[fit] -= lengths[k]
    return rows


def _row(segments, restart: bool = True) -> ScoringRow:
    """The row of `segments`. restart=False continues positions across completions instead: a completion then
    reads the ones before it (the guard's yardstick of a leak)."""
    row = ScoringRow()
    for prompt, group in segments:
        row.input_ids += prompt
        row.position_ids += range(len(prompt))
        last_prompt = len(row.input_ids) - 1  # predicts every completion's first token
        for n, completion in group:
            start = len(row.input_ids)
            first = len(prompt) if restart else row.position_ids[-1] + 1
            row.targets += [(last_prompt if j == 0 else start + j - 1, token, n, j)
                            for j, token in enumerate(completion)]
            row.input_ids += completion
            row.position_ids += range(first, first + len(completion))
            row.completions.append(n)
    return row


def _token_scores(head, hidden, targets, temperature: float):
    """(log p(target), entropy) in nats of softmax(head(hidden) / temperature), fp32."""
    logps = (head(hidden).float() / temperature).log_softmax(-1)
    return logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logps.exp() * logps).sum(-1)


def _chunked_scores(head, hidden, targets, temperature: float):
    import torch
    from torch.utils.checkpoint import checkpoint

    # at most one chunk's logits exist at a time: 2**26 fp32 logits = 256 MiB whatever the vocabulary
    chunk_rows = max(1, CHUNK_LOGITS // (getattr(head, "out_features", None) or head.weight.shape[0]))
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        part = slice(start, start + chunk_rows)
        if torch.is_grad_enabled() and hidden.shape[0] > chunk_rows:  # one chunk: nothing to save by recomputing
            pair = checkpoint(_token_scores, head, hidden[part], targets[part], temperature, use_reentrant=False)
        else:
            pair = _token_scores(head, hidden[part], targets[part], temperature)
        logps.append(pair[0])
        entropies.append(pair[1])
    return torch.cat(logps), torch.cat(entropies)


def _row_scores(model, head, row: ScoringRow, temperature: float, device):
    """(log-probs, entropies) of the row's targets in their order: one forward, the head on the targets only."""
    import torch

    positions = torch.tensor([t[0] for t in row.targets], device=device)
    targets = torch.tensor([t[1] for t in row.targets], device=device)
    input_ids = torch.tensor([row.input_ids], device=device)
    # ZeRO-3: the head runs once inside the forward on the gathered rows (sequence_logps.py says why)
    in_forward = zero3_partitioned(head)
    gather = _GatherRows(input_ids.shape, torch.zeros_like(positions), positions, keep=in_forward)
    handle = head.register_forward_pre_hook(gather)
    try:
        out = model(input_ids=input_ids, position_ids=torch.tensor([row.position_ids], device=device),
                    use_cache=False)
    finally:
        handle.remove()
    if gather.rows is None:
        raise RuntimeError("the LM head was not called on the hidden states: this model cannot be scored this way")
    if in_forward:
        logps = (out.logits.float() / temperature).log_softmax(-1)
        return logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logps.exp() * logps).sum(-1)
    return _chunked_scores(head, gather.rows, targets, temperature)


def completion_logps(model, rows: list[ScoringRow], temperature: float = 1.0, width: int | None = None,
                     head=None) -> Scores:
    """Scores of every completion in `rows`, one forward per row (the model in whatever mode the caller holds it;
    gradients flow when enabled). `model`: what the Trainer calls (wrapped or not); `head`: its LM head module
    (default: the model's output embeddings). `width`: columns of the output (default: the longest completion)."""
    device = next(model.parameters()).device
    head = model.get_output_embeddings() if head is None else head
    completions = sorted(n for row in rows for n in row.completions)
    local = {n: k for k, n in enumerate(completions)}
    lengths = [0] * len(completions)
    for row in rows:
        for _, _, n, j in row.targets:
            lengths[local[n]] = max(lengths[local[n]], j + 1)
    width = max(lengths, default=0) if width is None else width
    logps, entropies, out_rows, out_cols = [], [], [], []
    for row in rows:
        if row.targets:
            row_logps, row_entropies = _row_scores(model, head, row, temperature, device)
            logps.append(row_logps)
            entropies.append(row_entropies)
            out_rows += [local[n] for _, _, n, _ in row.targets]
            out_cols += [j for _, _, _, j in row.targets]
    return _scatter(logps, entropies, out_rows, out_cols, (len(completions), width), completions, device)


def _scatter(logps, entropies, out_rows, out_cols, shape, completions, device) -> Scores:
    import torch

    index = (torch.tensor(out_rows, dtype=torch.long, device=device),
             torch.tensor(out_cols, dtype=torch.long, device=device))
    mask = torch.zeros(shape, dtype=torch.bool, device=device).index_put(index, torch.ones_like(index[0]).bool())
    zeros = torch.zeros(shape, dtype=torch.float32, device=device)
    if not logps:
        return Scores(zeros, zeros.clone(), mask, torch.tensor(completions, dtype=torch.long))
    return Scores(zeros.index_put(index, torch.cat(logps)), zeros.index_put(index, torch.cat(entropies)), mask,
                  torch.tensor(completions, dtype=torch.long))


def padded_completion_logps(model, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                            temperature: float = 1.0, pad_id: int = 0, width: int | None = None) -> Scores:
    """The plain way (TRL's): every completion after its own copy of its prompt, one right-padded sequence each,
    one forward with full logits. The reference the packed rows are held to (tests, `check_shared_scoring`)."""
    import torch
    import torch.nn.functional as F

    group_size = _generations(prompt_ids, completion_ids)
    device = next(model.parameters()).device
    sequences = [list(prompt_ids[n // group_size]) + list(c) for n, c in enumerate(completion_ids)]
    longest = max(len(s) for s in sequences)
    input_ids = torch.tensor([s + [pad_id] * (longest - len(s)) for s in sequences], device=device)
    attention_mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sequences], device=device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    width = max(len(c) for c in completion_ids) if width is None else width
    rows = []
    for n, completion in enumerate(completion_ids):
        start, length = len(prompt_ids[n // group_size]) - 1, len(completion)  # position t predicts token t + 1
        logps = (logits[n, start:start + length].float() / temperature).log_softmax(-1)
        token = logps.gather(-1, torch.tensor(completion, dtype=torch.long, device=device).view(-1, 1)).squeeze(-1)
        entropy = -(logps.exp() * logps).sum(-1)
        rows.append((F.pad(token, (0, width - length)), F.pad(entropy, (0, width - length))))
    mask = torch.tensor([[j < len(c) for j in range(width)] for c in completion_ids], device=device)
    return Scores(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), mask,
                  torch.arange(len(completion_ids)))


def shared_scoring_leak(model, pack=pack_scoring_rows) -> float:
    """max |shared - padded| / max |glued - padded| over the per-token log-probs of six completions of two prompts
    (G = 3, a one-token completion among them) packed in one row by `pack` (a parameter so a test can hand it a
    broken layout). Glued: the same row with positions running on, so each completion reads the ones before it:
    the scale of a leak. Eval mode, no gradients; four forward passes of ~40 tokens."""
    import torch

    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    draw = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (5, 7, 4, 1, 6, 3, 5, 2)]
    prompts, completions = draw[:2], draw[2:]
    capacity = sum(map(len, draw))  # everything in one row
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            padded = padded_completion_logps(model, prompts, completions)
            shared = completion_logps(model, pack(prompts, completions, capacity, share_prompt=True))
            glued = completion_logps(model, [_row(_segments(prompts, completions, capacity, True), restart=False)])
    finally:
        for module, training in modes:
            module.training = training
    mask = padded.mask
    if not (shared.mask.equal(mask) and shared.completions.equal(padded.completions)):
        return float("inf")  # the packed rows do not score the completions' tokens one for one
    gap = (shared.logps - padded.logps)[mask].abs().max().item()
    leak = (glued.logps - padded.logps)[mask].abs().max().item()
    return gap / leak if leak > 0 else (0.0 if gap == 0 else float("inf"))


def check_shared_scoring(model, pack=pack_scoring_rows) -> bool:
    """True when a prompt's completions may share it in packed rows on this model (attention implementation
    included); False: pack them with `share_prompt=False`."""
    return shared_scoring_leak(model, pack) <= MAX_LEAK_FRACTION


def score_batch(model, batch: dict, settings):
    """(per-token log-probs [B, T], entropies [B, T]) of one GRPO micro batch's completions, T the width of its
    completion mask. The micro batch holds whole groups, or (micro_batch_size < G) a run of one group's completions:
    each run of completions of one prompt is packed after that prompt; runs of unequal sizes are scored apart."""
    import torch

    groups, width = batch["group"], batch["completion_mask"].shape[1]
    inner = getattr(model, "module", model)  # DDP: the forward goes through the wrapper, the head is the model's
    head = inner.get_output_embeddings()
    runs, start = [], 0
    for k in range(1, len(groups) + 1):
        if k == len(groups) or groups[k] != groups[start]:
            runs.append((start, k))
            start = k
    sizes = {end - begin for begin, end in runs}
    parts = [runs] if len(sizes) == 1 else [[run] for run in runs]
    logps, entropies = [], []
    for part in parts:
        prompts = [batch["prompt_ids"][begin] for begin, _ in part]
        completions = [batch["completion_ids"][k] for begin, end in part for k in range(begin, end)]
        rows = pack_scoring_rows(prompts, completions, settings.capacity, share_prompt=settings.share_prompt)
        scores = completion_logps(model, rows, temperature=settings.temperature, width=width, head=head)
        logps.append(scores.logps)
        entropies.append(scores.entropies)
    return torch.cat(logps), torch.cat(entropies)
