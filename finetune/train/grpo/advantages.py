"""Group-relative advantages from a matrix of rewards, equal to TRL 1.16's GRPOTrainer
(`_generate_and_score_completions`, multi_objective_aggregation="sum_then_normalize", the default).

Rewards come in as `[N, F]`: N completions (prompts x G, the G completions of one prompt contiguous), F reward
functions, NaN where a function gave no reward (returned None, failed or timed out). Then, as TRL does:

    total      r_i = nansum_f(w_f * R[i, f]); NaN when EVERY function is missing for completion i ("unscorable")
    baseline   m_g = nanmean of r over the group (unscorable completions left out, not counted as 0)
    scale      "group": s = unbiased nanstd over the group; "batch": unbiased nanstd over all N; "none": none
    advantage  A_i = (r_i - m_g) / (s + 1e-4) ("none": r_i - m_g); then NaN -> 0

The 1e-4 keeps a tied group finite: its deviations are exactly 0, so its advantages are 0. A std over fewer
than 2 scorable values is NaN (Bessel's correction has nothing to divide), so a group with one scorable
completion, or none, gets advantage 0 for every completion: no learning signal, never a NaN in the loss. This
is TRL 1.16's behaviour (it sets unscorable totals to NaN and zeroes NaN advantages) and we follow it: an
unscorable completion's `rewards` entry stays NaN so that logged means (nanmean) skip it.

Per-reward normalization (`normalize: true` on a recipe's reward; not TRL's): before the sum, that reward's column
becomes its z-score within each group, (R - group nanmean) / (group nanstd + 1e-4), so a reward model's logits (any
scale) and a 0/1 program reward weigh by their `weight` alone; NaN stays NaN, a group with fewer than 2 values gets 0.

Torch is imported inside the functions (no work at import time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCALE_REWARDS = ("group", "batch", "none")
# TRL 1.16 adds this to the std before dividing (grpo_trainer.py, `advantages / (std_rewards + 1e-4)`).
STD_EPSILON = 1e-4


@dataclass(frozen=True)
class Advantages:
    """What one generation batch's rewards give. Tensors are on the rewards' device, float."""

    rewards: torch.Tensor  # [N] weighted total per completion; NaN where every function was missing
    advantages: torch.Tensor  # [N] what the loss multiplies; never NaN
    group_mean: torch.Tensor  # [N / G] nanmean of the totals per group (NaN for a wholly unscorable group)
    group_std: torch.Tensor  # [N / G] unbiased nanstd per group (NaN with fewer than 2 scorable completions)
    zero_std_groups: float  # TRL's frac_reward_zero_std: share of completions whose scaling std is 0
    function_mean: torch.Tensor  # [F] nanmean per function (TRL's rewards/<name>/mean); NaN if all missing
    function_std: torch.Tensor  # [F] unbiased nanstd per function (TRL's rewards/<name>/std)
    reward_mean: float  # TRL's `reward`: nanmean of the totals
    reward_std: float  # TRL's `reward_std`: nanstd of the totals


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased (Bessel-corrected) std ignoring NaN, NaN where fewer than 2 values remain: trl.trainer.utils.nanstd
    (1.16), which the advantages and logged stats use."""
    import torch

    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim)
    count = (~torch.isnan(values)).sum(dim=dim)
    correction = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.full_like(variance, float("nan")))
    return torch.sqrt(variance * correction)


def zscore_groups(rewards_per_func: torch.Tensor, columns: list[bool], group_size: int) -> torch.Tensor:
    """`[N, F]` rewards with each column marked in `columns` replaced by its z-score within each group of
    `group_size` (contiguous) completions; the others as they are."""
    import torch

    out = rewards_per_func.float().clone()
    for f, on in enumerate(columns):
        if not on:
            continue
        grouped = out[:, f].view(-1, group_size)
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        std = nanstd(grouped, dim=1).unsqueeze(1) if group_size > 1 else torch.zeros_like(mean)
        scored = (grouped - mean) / (std + STD_EPSILON)
        alone = torch.isnan(std).expand_as(grouped) & ~torch.isnan(grouped)  # fewer than 2 values: no spread to use
        out[:, f] = scored.masked_fill(alone, 0.0).reshape(-1)
    return out


def _check(rewards_per_func, weights, group_size: int, scale_rewards: str) -> None:
    if rewards_per_func.dim() != 2:
        raise ValueError(f"rewards must be [completions, reward functions], got shape {tuple(rewards_per_func.shape)}")
    if weights.shape != (rewards_per_func.shape[1],):
        raise ValueError(f"{rewards_per_func.shape[1]} reward functions but weights of shape {tuple(weights.shape)}: "
                         "give one weight per reward function")
    if group_size < 1 or rewards_per_func.shape[0] % group_size:
        raise ValueError(f"{rewards_per_func.shape[0]} completions do not split into groups of {group_size}: "
                         "each prompt needs exactly `num_generations` completions")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards is {scale_rewards!r}; use one of {', '.join(SCALE_REWARDS)}")


def group_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int,
                     scale_rewards: str) -> Advantages:
    """Advantages of N completions in groups of `group_size` (contiguous) from `[N, F]` rewards with NaN for a
    missing reward, `weights [F]`, and TRL's `scale_rewards` ("group" | "batch" | "none")."""
    import torch

    _check(rewards_per_func, weights, group_size, scale_rewards)
    rewards_per_func = rewards_per_func.float()
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights.to(rewards_per_func).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = float("nan")  # nansum would make it 0: a fake reward that moves the group's baseline

    grouped = rewards.view(-1, group_size)
    group_mean = torch.nanmean(grouped, dim=1)
    # G = 1 has no group to compare with: TRL uses std 0 (only reachable in its eval).
    group_std = nanstd(grouped, dim=1) if group_size > 1 else torch.zeros_like(group_mean)
    if scale_rewards == "batch":
        scale = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        scale = group_std.repeat_interleave(group_size)

    advantages = rewards - group_mean.repeat_interleave(group_size)
    if scale_rewards != "none":
        advantages = advantages / (scale + STD_EPSILON)
    advantages = torch.nan_to_num(advantages, nan=0.0)  # unscorable, or alone in its group: no signal
    # isclose(NaN, 0) is False: a group with < 2 scorable completions does not count as zero-std (as in TRL).
    zero_std = torch.isclose(scale, torch.zeros_like(scale)).float().mean().item()

    return Advantages(
        rewards=rewards, advantages=advantages, group_mean=group_mean, group_std=group_std,
        zero_std_groups=zero_std,
        function_mean=torch.nanmean(rewards_per_func, dim=0), function_std=nanstd(rewards_per_func, dim=0),
        reward_mean=torch.nanmean(rewards).item(), reward_std=nanstd(rewards).item(),
    )
