"""Preference losses as pure functions of per-sequence log-probs, each held equal to TRL 1.16's (loss and
gradients, tests/test_preference_loss.py).

Inputs are tensors of shape (pairs,) (KTO: (examples,)): `policy_*` and `ref_*` are the SUMMED log-probs of a
response's supervised tokens (log p(y|x), prompt excluded) under the policy and the reference; `*_tokens` are
those responses' supervised token counts, for the methods that normalize by length. Every loss is returned
PER PAIR (per example), never reduced: the caller sums them and divides by the pairs of the whole optimizer
step, so packing and gradient accumulation do not change the objective. TRL takes the mean per micro batch,
which is the same number when a step is one micro batch.

    DPO    -log sig(b d),  d = (pc - rc) - (pr - rr)                      Rafailov et al. 2023 (2305.18290)
           smoothing e > 0: -(1-e) log sig(b d) - e log sig(-b d)         conservative DPO (Mitchell 2023)
           TRL: DPOTrainer._compute_loss, loss_type "sigmoid" (1.16 ignores label_smoothing there; the
           smoothed form equals (1-e) x TRL(pair) + e x TRL(swapped pair), which is how it is tested)
    IPO    (d_c/n_c - d_r/n_r - 1/(2b))^2, d_x = px - rx, n_x = tokens    Azar et al. 2023 (2310.12036) Eq. 17
           TRL: DPOTrainer loss_type "ipo", which normalizes each log-ratio by its completion token count
    SimPO  -log sig(b (pc/n_c - pr/n_r) - g)                              Meng et al. 2024 (2405.14734) Eq. 6
           TRL: experimental CPOTrainer loss_type "simpo" with cpo_alpha 0 (its default 1 adds an NLL term)
    ORPO   -l log sig(log odds),  log odds = (a_c - a_r) - (log(1-e^a_c) - log(1-e^a_r)),  a_x = px/n_x
           Hong et al. 2024 (2403.07691) Eq. 4-7; TRL: experimental ORPOTrainer.odds_ratio_loss (its beta = l)
    KTO    desirable: w_d (1 - sig(b (d - z))),  undesirable: w_u (1 - sig(b (z - d))),  d = p - r
           z = max(0, mean over the micro batch of (policy - ref) log-probs of MISMATCHED prompt/completion
           pairs, averaged over processes), no gradient.  Ethayarajh et al. 2024 (2402.01306) Eq. 7;
           TRL: KTOTrainer._compute_loss, loss_type "kto"

What the caller supplies beyond the log-probs, the recipe key -> TRL 1.16 argument, and the NLL / SFT terms
(computed by the caller; TRL's normalization given so a run can match it):
    dpo, ipo  a reference; ipo the response token counts. rl_beta -> beta; dpo_label_smoothing -> nothing
              (see above). rpo_alpha: TRL 1.16 has no rpo_alpha (DPOConfig refuses it); it is loss_type
              ["sigmoid", "sft"] (or ["ipo", "sft"]) with loss_weights [1, alpha], the SFT term the mean of
              -log p over every chosen-response token of the micro batch (a token mean, response tokens only).
    simpo     token counts. rl_beta -> beta, simpo_gamma -> simpo_gamma (the margin, not gamma/beta),
              rpo_alpha -> cpo_alpha: the same token mean of -log p over the chosen responses' tokens.
    orpo      token counts. orpo_alpha -> beta. TRL's NLL term (weight 1, always on) is a token mean of -log p
              over the WHOLE chosen sequence, prompt tokens included (every attended position after the first),
              over the micro batch.
    kto       labels (desirable), the KL estimate from `kto_kl` (built from mismatched pairs: the collator's
              job). rl_beta -> beta, kto_*_weight -> *_weight. TRL's loss is the mean over the micro batch's
              examples of the WEIGHTED per-example losses (divided by the count of examples, not the weights).

Pure functions; torch is imported inside them (no work at import time).
"""

from __future__ import annotations


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float, label_smoothing: float = 0.0):
    """Sigmoid DPO per pair; label_smoothing e > 0 gives conservative DPO (the labels flipped with probability
    e). At policy == reference every pair's loss is log 2."""
    import torch.nn.functional as F

    delta = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    losses = -F.logsigmoid(beta * delta)
    if label_smoothing:
        losses = (1 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-beta * delta)
    return losses


def ipo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens,
             beta: float):
    """IPO per pair, as TRL 1.16 computes it: each log-ratio divided by its response's token count (at least 1)
    before the squared distance to 1/(2 beta). beta is the paper's tau."""
    chosen = (policy_chosen - ref_chosen) / chosen_tokens.clamp(min=1)
    rejected = (policy_rejected - ref_rejected) / rejected_tokens.clamp(min=1)
    return (chosen - rejected - 1 / (2 * beta)) ** 2


def simpo_loss(policy_chosen, policy_rejected, chosen_tokens, rejected_tokens, beta: float, gamma: float,
               label_smoothing: float = 0.0):
    """SimPO per pair: the length-normalized (average per token) log-probs, margin gamma, no reference.
    TRL writes it as beta x (average difference - gamma / beta); `gamma` is the margin itself (recipe
    `simpo_gamma`, TRL `simpo_gamma`), not the ratio. label_smoothing as CPOTrainer applies it."""
    import torch.nn.functional as F

    logits = policy_chosen / chosen_tokens.clamp(min=1) - policy_rejected / rejected_tokens.clamp(min=1)
    logits = logits - gamma / beta
    losses = -F.logsigmoid(beta * logits)
    if label_smoothing:
        losses = (1 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-beta * logits)
    return losses


def orpo_loss(policy_chosen, policy_rejected, chosen_tokens, rejected_tokens, alpha: float):
    """ORPO's odds-ratio term per pair, and the log odds ratio (for logging): `(losses, log_odds)`.

    losses = -alpha x log sigmoid(log odds), with the odds of the AVERAGE per-token log-probs (computed in fp32,
    as TRL). TRL's full loss adds the chosen NLL (weight 1; a token mean over the whole chosen sequence, prompt
    included: module docstring); TRL logs mean(log sigmoid(log odds)) as `log_odds_ratio` and mean(log odds)
    as `log_odds_chosen`."""
    import torch.nn.functional as F

    log_odds = _log_odds(policy_chosen.float() / chosen_tokens.clamp(min=1),
                         policy_rejected.float() / rejected_tokens.clamp(min=1))
    return -alpha * F.logsigmoid(log_odds), log_odds


def _log_odds(chosen, rejected):
    """log(p_c / (1 - p_c)) - log(p_r / (1 - p_r)) from log-probs, with log(1 - e^x) computed stably on both
    sides of -log 2 (TRL's log1mexp)."""
    import torch

    def log1mexp(x):
        return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))

    return (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))


def kto_kl(policy_kl, ref_kl, all_reduce_mean=None):
    """KTO's reference point z: the mean over the micro batch of (policy - reference) summed log-probs of the
    mismatched (prompt, completion) pairs, without gradient, averaged over processes by `all_reduce_mean`
    (a function of a 1-element tensor, e.g. `lambda t: accelerator.gather(t).mean()`; None: one process), THEN
    clamped at 0, in that order, as TRL 1.16. A 0-dim tensor."""
    kl = (policy_kl - ref_kl).detach().mean()
    if all_reduce_mean is not None:
        kl = all_reduce_mean(kl.reshape(1)).reshape(())
    return kl.clamp(min=0)


def kto_loss(policy, ref, desirable, kl, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0):
    """KTO per example, weighted: w_d (1 - sig(b (d - z))) where `desirable`, else w_u (1 - sig(b (z - d))),
    with d = policy - ref and z = `kto_kl(...)`. TRL's loss is the plain mean of these over the examples."""
    import torch

    logratios = policy - ref
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))
    return torch.where(desirable.bool(), chosen, rejected)


def preference_metrics(method: str, policy_chosen, policy_rejected, beta: float, ref_chosen=None, ref_rejected=None,
                       chosen_tokens=None, rejected_tokens=None) -> dict:
    """The metrics TRL 1.16 logs for a paired method, per pair (the caller averages them over the pairs since
    the last log; TRL averages per micro batch, then over the micro batches since the last log).

    dpo, ipo: rewards = beta x (policy - ref) summed log-ratios (IPO too, though its loss normalizes them),
              logps = summed log-probs.
    simpo:    rewards = beta x average log-probs, logps = AVERAGE log-probs (CPOTrainer).
    orpo:     rewards = beta x average log-probs with beta the ORPO lambda, logps = average log-probs, plus
              log_odds_ratio = log sigmoid(log odds) and log_odds_chosen = log odds (ORPOTrainer).
    Every method: rewards/margins = chosen - rejected reward, rewards/accuracies = 1.0 where chosen > rejected.
    (TRL also logs logits/*, entropy, num_tokens, nll_loss: from the forward pass, not from here.)"""
    import torch.nn.functional as F

    if method in ("dpo", "ipo"):
        chosen, rejected = policy_chosen.detach(), policy_rejected.detach()
        chosen_rewards, rejected_rewards = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    elif method in ("simpo", "orpo"):
        chosen = policy_chosen.detach().float() / chosen_tokens.clamp(min=1)
        rejected = policy_rejected.detach().float() / rejected_tokens.clamp(min=1)
        chosen_rewards, rejected_rewards = beta * chosen, beta * rejected
    else:
        raise ValueError(f"no paired metrics for method {method!r} (KTO: kto_metrics)")
    metrics = {"rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
               "rewards/margins": chosen_rewards - rejected_rewards,
               "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
               "logps/chosen": chosen, "logps/rejected": rejected}
    if method == "orpo":
        log_odds = _log_odds(chosen, rejected)
        metrics.update({"log_odds_ratio": F.logsigmoid(log_odds), "log_odds_chosen": log_odds})
    return metrics


def kto_metrics(policy, ref, desirable, beta: float) -> dict:
    """KTO's metrics as TRL 1.16 logs them, per example: rewards/chosen and logps/chosen hold the desirable
    examples only, rewards/rejected and logps/rejected the undesirable ones (so a tensor may be empty: TRL then
    logs nothing for it). TRL's rewards/margins is NOT per example: it is mean rewards/chosen - mean
    rewards/rejected of a micro batch that has both; `kl` is the micro batch's `kto_kl`. Neither is here."""
    desirable = desirable.bool()
    rewards = beta * (policy - ref).detach()
    return {"rewards/chosen": rewards[desirable], "rewards/rejected": rewards[~desirable],
            "logps/chosen": policy.detach()[desirable], "logps/rejected": policy.detach()[~desirable]}
