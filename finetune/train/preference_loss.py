"""Placeholder: the preference losses (replaced by the TRL-checked module)."""

from __future__ import annotations


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    import torch.nn.functional as F

    delta = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -(1 - label_smoothing) * F.logsigmoid(beta * delta) - label_smoothing * F.logsigmoid(-beta * delta)
