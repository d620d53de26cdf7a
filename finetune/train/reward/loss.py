"""The reward model's loss and metrics as pure functions of the pairs' scores, held equal to TRL 1.16's
RewardTrainer.compute_loss (loss and gradients, tests/test_reward_trl.py).

    loss     -log sigmoid(r_c - r_r - m) + c x (r_c + r_r)^2        per pair
             r_c, r_r: the chosen and rejected responses' scores (finetune/model/score_head.py); m: the pair's
             `margin` (0 without one: Touvron et al. 2023, Llama 2, Eq. 2); c: `center_rewards_coefficient`
             (Eisenstein et al. 2023: the loss sees only differences, so the scores may drift as a whole)

TRL takes the mean over a micro batch: mean(-log sigmoid(...)) + c x mean((r_c + r_r)^2), which is the mean of the
per-pair losses above. Returned per pair, never reduced: the caller sums them and divides by the pairs of the whole
optimizer step, so packing and gradient accumulation do not change the objective (finetune/train/reward/trainer.py).

Metrics, per pair, under TRL's names where TRL has one: accuracy (1.0 where r_c > r_r: a tie counts as wrong),
margin (r_c - r_r); and the scores themselves, chosen_reward and rejected_reward (TRL logs only their mean, min and
max over both, mean_reward / min_reward / max_reward: the trainer adds those).

Pure functions; torch is imported inside them (no work at import time).
"""

from __future__ import annotations


def bradley_terry_loss(chosen, rejected, margin=None, center_coefficient: float = 0.0):
    """Per-pair losses, shape (pairs,), from the chosen and rejected scores (pairs,) and optional margins (pairs,)."""
    import torch.nn.functional as F

    difference = chosen - rejected
    if margin is not None:
        difference = difference - margin.to(difference)
    losses = -F.logsigmoid(difference)
    if center_coefficient:
        losses = losses + center_coefficient * (chosen + rejected) ** 2
    return losses


def pair_metrics(chosen, rejected) -> dict:
    """Per-pair metrics (the caller averages them over the pairs since the last log)."""
    chosen, rejected = chosen.detach(), rejected.detach()
    return {"accuracy": (chosen > rejected).float(), "margin": chosen - rejected, "chosen_reward": chosen,
            "rejected_reward": rejected}
