"""The GRPO clipped surrogate loss as a pure function of per-token log-probs, equal to TRL 1.16's
GRPOTrainer._compute_loss (importance_sampling_level="token", no delta / entropy mask / vLLM correction /
entropy bonus) for loss_type grpo, dr_grpo, dapo and bnpo.

Per completion token t of sequence i (A_i its advantage, pi / old / ref the log-probs under the policy, the
policy that generated it, and the reference):

    ratio   r = exp(pi - old)                      old = pi.detach() with one update per generation (r = 1)
    clip    L = -min(r A, clamp(r, 1 - eps_low, 1 + eps_high) A)
    KL      L += beta (exp(ref - pi) - (ref - pi) - 1)        k3 estimator, only when beta > 0

THE NORMALIZATION. An optimizer step is split into micro batches (gradient accumulation) and processes; the
update must not depend on that split. So the step's normalizer is computed ONCE, from every completion of the
step (`step_normalizer`), and `grpo_loss` returns this micro batch's SUM divided by it. Summing the returned
losses over every micro batch of the step gives the step's loss exactly; the trainer does not divide further.
(Under DDP, whose all-reduce AVERAGES gradients over P processes, each process's loss is multiplied by P, as the
HF Trainer does for losses normalized by a global token count.)

    loss_type  micro batch sum                   step normalizer          TRL 1.16 per micro batch
    grpo       per-sequence token means           sequences in the step    mean of sequence means / GA
    dr_grpo    token sum                          sequences x max length   sum / (B x max length) / GA
    dapo       token sum                          tokens in the step       sum / (generation-batch tokens / P
                                                                              x GA / steps_per_generation)
    bnpo       token sum                          tokens in the step       sum / local micro batch tokens / GA

grpo and dr_grpo equal TRL for any split into equal-size micro batches (TRL's only split). dapo equals TRL when a
generation batch is one optimizer step (steps_per_generation = GA); with several steps per generation TRL uses
the generation batch's mean tokens per step, we use the step's own count. TRL's bnpo normalizes each micro batch
by its own tokens, so its update changes with the split (TRL's docs say so); ours normalizes by the step's tokens,
which makes our bnpo the same function as our dapo. Both equal TRL's bnpo (and TRL's dapo) when the step is one
micro batch on one process, and that is where the tests hold them equal.

Torch is imported inside the functions (no work at import time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")


@dataclass(frozen=True)
class GRPOLoss:
    """One micro batch's part of a step's loss, and its metrics."""

    loss: torch.Tensor  # this micro batch's sum / the step normalizer; sum these over the step
    # TRL's names; each a token mean over this micro batch (0-d, detached): clip_ratio/low_mean, /high_mean,
    # /region_mean, kl (beta > 0), entropy (entropies given)
    metrics: dict[str, torch.Tensor]
    num_tokens: torch.Tensor  # completion tokens in the mask: weigh `metrics` by it for the step's token mean


def drop_truncated(completion_mask: torch.Tensor, completion_ids: torch.Tensor,
                   stop_token_ids: Iterable[int]) -> torch.Tensor:
    """TRL's mask_truncated_completions: the mask with every completion whose last token is not a stop token
    (EOS; TRL also lists the pad token) zeroed. The mask must be right-padded (ones, then zeros). Apply it BEFORE
    `step_normalizer`, so the masked completions' tokens are not counted."""
    import torch

    lengths = completion_mask.sum(dim=1).long()
    last_token = completion_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    stops = torch.tensor(list(stop_token_ids), device=completion_ids.device, dtype=completion_ids.dtype)
    ended = torch.isin(last_token, stops) & (lengths > 0)
    return completion_mask * ended.unsqueeze(1).to(completion_mask.dtype)


def step_normalizer(loss_type: str, completion_masks: Iterable[torch.Tensor], num_sequences_in_step: int,
                    max_completion_length: int) -> float:
    """What every micro batch's sum is divided by, for the WHOLE optimizer step (all micro batches, all
    processes). `completion_masks`: the step's loss masks (any widths); each is summed, so a process may pass the
    all-reduced token count of the step as a one-element tensor instead. `num_sequences_in_step`: completions in
    the step over all processes, masked (truncated) ones included, as TRL counts them."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type is {loss_type!r}; use one of {', '.join(LOSS_TYPES)}")
    if num_sequences_in_step < 1:
        raise ValueError(f"an optimizer step needs at least one completion, got {num_sequences_in_step}")
    if loss_type == "grpo":
        return float(num_sequences_in_step)
    if loss_type == "dr_grpo":
        if max_completion_length < 1:
            raise ValueError(f"dr_grpo divides by max_completion_length, got {max_completion_length}")
        return float(num_sequences_in_step * max_completion_length)
    tokens = sum(int(mask.sum().item()) for mask in completion_masks)
    return float(max(tokens, 1))  # a step with every completion masked: loss 0, not 0/0 (TRL clamps at 1 too)


def _check(logps, advantages, completion_mask, old_logps, ref_logps, entropies, loss_type, beta) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type is {loss_type!r}; use one of {', '.join(LOSS_TYPES)}")
    if logps.dim() != 2 or advantages.shape != logps.shape[:1]:
        raise ValueError(f"logps must be [B, T] and advantages [B]: got {tuple(logps.shape)} and "
                         f"{tuple(advantages.shape)}")
    for name, tensor in (("completion_mask", completion_mask), ("old_logps", old_logps),
                         ("ref_logps", ref_logps), ("entropies", entropies)):
        if tensor is not None and tensor.shape != logps.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logps {tuple(logps.shape)}: they must match")
    if beta < 0:
        raise ValueError(f"beta (the KL coefficient) must be >= 0, got {beta}")
    if beta > 0 and ref_logps is None:
        raise ValueError(f"beta is {beta}: the KL term needs the reference model's log-probs (ref_logps)")


def grpo_loss(logps: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor, *, loss_type: str,
              normalizer: float, epsilon_low: float, epsilon_high: float, beta: float,
              old_logps: torch.Tensor | None = None, ref_logps: torch.Tensor | None = None,
              entropies: torch.Tensor | None = None) -> GRPOLoss:
    """This micro batch's share of the step's loss: logps / old_logps / ref_logps / entropies / completion_mask
    are [B, T] over the completion tokens, advantages [B]; `normalizer` from `step_normalizer` for the whole
    step. old_logps None means one update per generation (old = logps.detach())."""
    import torch

    _check(logps, advantages, completion_mask, old_logps, ref_logps, entropies, loss_type, beta)
    old_logps = logps.detach() if old_logps is None else old_logps
    advantages = advantages.unsqueeze(1)  # [B, 1]: one advantage for every token of a completion
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if beta > 0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + beta * kl

    mask = completion_mask.to(per_token.dtype)
    if loss_type == "grpo":  # each sequence's token mean; an empty sequence counts, with 0 (as in TRL)
        total = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum()
    else:
        total = (per_token * mask).sum()
    metrics = _metrics(ratio.detach(), advantages, mask, epsilon_low, epsilon_high, kl, entropies)
    return GRPOLoss(loss=total / normalizer, metrics=metrics, num_tokens=mask.sum().detach())


def _metrics(ratio, advantages, mask, epsilon_low, epsilon_high, kl, entropies) -> dict:
    """TRL's logged token means. A token counts as clipped only where the clip takes away its gradient: below
    1 - eps_low with A < 0, above 1 + eps_high with A > 0 (TRL's definitions)."""
    tokens = mask.sum().clamp(min=1.0)

    def token_mean(values):
        return (values.detach().to(mask.dtype) * mask).sum() / tokens

    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    metrics = {"clip_ratio/low_mean": token_mean(low), "clip_ratio/high_mean": token_mean(high),
               "clip_ratio/region_mean": token_mean(low | high)}
    if kl is not None:
        metrics["kl"] = token_mean(kl)
    if entropies is not None:
        metrics["entropy"] = token_mean(entropies)
    return metrics
