"""Preference losses as pure functions of per-sequence log-probs, returning per-pair losses (the caller sums
them and divides by the step's pairs: finetune/train/preference.py).

dpo_loss: sigmoid DPO (Rafailov et al. 2023), -log sigmoid(beta x delta) with delta the chosen log-ratio minus
the rejected one; with label_smoothing e > 0 the conservative form -(1-e) log sigmoid(b d) - e log sigmoid(-b d).
"""

from __future__ import annotations


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    import torch.nn.functional as F

    delta = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -(1 - label_smoothing) * F.logsigmoid(beta * delta) - label_smoothing * F.logsigmoid(-beta * delta)
