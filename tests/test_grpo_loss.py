"""The GRPO loss and advantages (finetune/train/grpo/) against TRL 1.16 as the oracle.

The loss: TRL's own GRPOTrainer._compute_loss runs on an object made with GRPOTrainer.__new__ carrying only the
attributes that method reads, with `_get_per_token_logps_and_entropies` replaced on the instance by one that
returns per-token log-probs we control (a leaf tensor, or a tiny LoRA model's log-probs). Loss, gradient and
logged metrics must agree with ours to 1e-5 in fp32. Then the property TRL does not have for every variant: the
step's loss and gradient do not depend on how the step is split into micro batches.

The advantages: TRL computes them inside _generate_and_score_completions (which generates), so its
sum_then_normalize branch is transcribed below, with TRL's own nanstd, and cited by line.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from finetune.train.grpo.advantages import group_advantages
from finetune.train.grpo.loss import LOSS_TYPES, drop_truncated, grpo_loss, step_normalizer

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
TOL = 1e-5
EPS_LOW, EPS_HIGH = 0.2, 0.28  # DAPO's asymmetric clip, so a low/high mix-up shows
MAX_LEN = 12  # max_completion_length; the widest completion below is 10
NAN = float("nan")


@pytest.fixture(scope="module")
def trl_grpo():
    pytest.importorskip("trl", minversion="1.16")  # the version whose _compute_loss the docstrings cite
    from trl.trainer import grpo_trainer

    return grpo_trainer


class _OneProcess:
    """The accelerator calls _compute_loss makes (reduce for its token means, gather for min/max), one process."""

    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor


def _trl_loss(trl_grpo, loss_type, batch, *, beta, two_updates, accumulation=1, items_in_batch=None, tool_mask=None,
              max_len=MAX_LEN):
    """TRL 1.16's _compute_loss on `batch` (a micro batch) -> (loss, TRL's logged metrics). `tool_mask`: TRL's mask of
    an episode's tokens (0 on tool results; the loss masks with completion_mask x tool_mask)."""
    trainer = trl_grpo.GRPOTrainer.__new__(trl_grpo.GRPOTrainer)
    trainer.args = SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=accumulation)
    trainer.loss_type, trainer.beta, trainer.epsilon_low, trainer.epsilon_high = loss_type, beta, EPS_LOW, EPS_HIGH
    trainer.importance_sampling_level, trainer.top_entropy_quantile = "token", 1.0
    trainer.off_policy_mask_threshold, trainer.use_vllm = None, False
    trainer.vllm_importance_sampling_correction = False
    trainer._entropy_bonus_enabled, trainer.aux_loss_enabled = False, False
    trainer.model, trainer.accelerator = SimpleNamespace(training=True), _OneProcess()
    trainer.current_gradient_accumulation_steps, trainer.max_completion_length = accumulation, max_len
    trainer._metrics = {"train": defaultdict(list)}
    logps, entropies = batch["logps"], batch["entropies"]
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
    size, width = logps.shape
    mask = batch["mask"]
    inputs = {"prompt_ids": torch.zeros(size, 2, dtype=torch.long),
              "prompt_mask": torch.ones(size, 2, dtype=torch.long),
              "completion_ids": torch.zeros(size, width, dtype=torch.long), "completion_mask": mask,
              "advantages": batch["advantages"], "ref_per_token_logps": batch["ref"],
              "num_items_in_batch": mask.sum() if items_in_batch is None else items_in_batch}
    if tool_mask is not None:
        inputs["tool_mask"] = tool_mask
    if two_updates:
        inputs["old_per_token_logps"] = batch["old"]
    loss = trainer._compute_loss(None, inputs)
    return loss, {name: values[-1] for name, values in trainer._metrics["train"].items()}


def _batch(seed=0, size=8, width=10):
    """Completions of lengths 0..width (one empty: TRL counts it in grpo's mean), right-padded; old log-probs
    0.5 nats off the current ones so some ratios leave [1 - 0.2, 1 + 0.28] in both directions."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width, 0, 3, width - 1, 1, 6, width, 4][:size])
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    logps = (-3 * torch.rand(size, width, generator=gen)).requires_grad_()
    return {"logps": logps, "mask": mask, "advantages": torch.randn(size, generator=gen),
            "old": logps.detach() + 0.5 * torch.randn(size, width, generator=gen),
            "ref": logps.detach() + 0.5 * torch.randn(size, width, generator=gen),
            "entropies": 2 * torch.rand(size, width, generator=gen)}


def _ours(loss_type, batch, normalizer, *, beta, two_updates):
    return grpo_loss(batch["logps"], batch["advantages"], batch["mask"], loss_type=loss_type, normalizer=normalizer,
                     epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=beta,
                     old_logps=batch["old"] if two_updates else None, ref_logps=batch["ref"],
                     entropies=batch["entropies"])


def _grad(loss, leaf):
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


# --- the loss against TRL -----------------------------------------------------------------------------------
@pytest.mark.parametrize("two_updates", [False, True], ids=["one-update", "two-updates"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_gradient_and_metrics_equal_trl(trl_grpo, loss_type, beta, two_updates):
    batch = _batch()
    theirs, their_metrics = _trl_loss(trl_grpo, loss_type, batch, beta=beta, two_updates=two_updates)
    normalizer = step_normalizer(loss_type, [batch["mask"]], len(batch["mask"]), MAX_LEN)
    ours = _ours(loss_type, batch, normalizer, beta=beta, two_updates=two_updates)

    assert ours.loss.item() == pytest.approx(theirs.item(), abs=TOL)
    assert ours.loss.abs().item() > 1e-3  # beta 0, one update: the loss is -mean advantage, not 0
    our_grad, their_grad = _grad(ours.loss, batch["logps"]), _grad(theirs, batch["logps"])
    torch.testing.assert_close(our_grad, their_grad, atol=TOL, rtol=0)
    assert our_grad.abs().max() > 1e-3
    for name, value in ours.metrics.items():
        assert value.item() == pytest.approx(their_metrics[name], abs=TOL), name
    assert ("kl" in ours.metrics) == (beta > 0)

    clipped = ours.metrics["clip_ratio/region_mean"].item()
    if not two_updates:
        assert clipped == 0.0  # ratio 1 everywhere
        return
    # The clip is active in both directions, and a clipped token gets no policy gradient.
    assert ours.metrics["clip_ratio/low_mean"] > 0.05 and ours.metrics["clip_ratio/high_mean"] > 0.05
    ratio = torch.exp(batch["logps"].detach() - batch["old"])
    adv = batch["advantages"].unsqueeze(1)
    region = (((ratio < 1 - EPS_LOW) & (adv < 0)) | ((ratio > 1 + EPS_HIGH) & (adv > 0))) & batch["mask"].bool()
    if beta == 0:
        assert region.any() and (our_grad[region] == 0).all() and (our_grad[batch["mask"].bool() & ~region] != 0).all()


def _lora_logps(model, ids, prompt_len):
    """Per-token log-probs and entropies of the completion tokens ids[:, prompt_len:]."""
    logits = model(input_ids=ids).logits[:, prompt_len - 1:-1].float()
    logprobs = logits.log_softmax(-1)
    entropies = -(logprobs.exp() * logprobs).sum(-1)
    return logprobs.gather(-1, ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1), entropies.detach()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_lora_gradients_equal_trl(trl_grpo, loss_type):
    """The same through a tiny Llama with LoRA: every LoRA weight's gradient, beta > 0, two updates."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(LlamaForCausalLM(config), lora).eval()
    batch = _batch(seed=1)
    ids = torch.randint(0, 64, (8, 3 + batch["mask"].shape[1]))
    params = [p for p in model.parameters() if p.requires_grad]

    def grads_of(compute):
        model.zero_grad()
        logps, entropies = _lora_logps(model, ids, 3)
        # the same offsets from the current log-probs as in `batch`, so clipping is active here too
        offset = {key: batch[key] - batch["logps"].detach() for key in ("old", "ref")}
        step = dict(batch, logps=logps, entropies=entropies, old=logps.detach() + offset["old"],
                    ref=logps.detach() + offset["ref"])
        loss = compute(step)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in params]

    normalizer = step_normalizer(loss_type, [batch["mask"]], 8, MAX_LEN)
    ours = grads_of(lambda step: _ours(loss_type, step, normalizer, beta=0.04, two_updates=True).loss)
    theirs = grads_of(lambda step: _trl_loss(trl_grpo, loss_type, step, beta=0.04, two_updates=True)[0])
    assert ours[0] == pytest.approx(theirs[0], abs=TOL)
    scale = max(g.abs().max().item() for g in theirs[1])
    assert scale > 1e-4
    for mine, their in zip(ours[1], theirs[1]):
        torch.testing.assert_close(mine / scale, their / scale, atol=TOL, rtol=0)


def _micro_batches(batch, parts):
    """`batch`'s rows in `parts` micro batches, each cut to its own longest completion (as a collator pads)."""
    out = []
    for rows in torch.arange(len(batch["mask"])).chunk(parts):
        width = max(int(batch["mask"][rows].sum(1).max()), 1)
        out.append({key: value[rows, :width] if value.dim() == 2 else value[rows] for key, value in batch.items()})
    return out


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_step_loss_and_gradient_do_not_depend_on_the_micro_batch_split(loss_type):
    batch = _batch(seed=2)
    normalizer = step_normalizer(loss_type, [batch["mask"]], len(batch["mask"]), MAX_LEN)
    whole = _ours(loss_type, batch, normalizer, beta=0.04, two_updates=True).loss
    whole_grad = _grad(whole, batch["logps"])
    for parts in (2, 4):
        micro = _micro_batches(batch, parts)
        assert step_normalizer(loss_type, [m["mask"] for m in micro], len(batch["mask"]), MAX_LEN) == normalizer
        total = sum(_ours(loss_type, m, normalizer, beta=0.04, two_updates=True).loss for m in micro)
        assert total.item() == pytest.approx(whole.item(), abs=1e-6)
        torch.testing.assert_close(_grad(total, batch["logps"]), whole_grad, atol=1e-6, rtol=0)
    # The test can fail: the micro batches' token counts differ, so a per-micro-batch token normalization
    # (TRL's bnpo) would give another loss.
    tokens = [int(m["mask"].sum()) for m in _micro_batches(batch, 2)]
    assert tokens[0] != tokens[1]


def test_trl_gradient_accumulation_matches_ours_except_bnpo(trl_grpo):
    """Two equal micro batches, gradient accumulation 2 in TRL (one generation batch per step): TRL's summed
    micro-batch losses equal our step loss for grpo, dr_grpo and dapo; TRL's bnpo, normalized by each micro
    batch's own tokens, does not (its documented split dependence), while ours stays the step's token mean."""
    batch = _batch(seed=3)
    micro = _micro_batches(batch, 2)
    for loss_type in LOSS_TYPES:
        normalizer = step_normalizer(loss_type, [batch["mask"]], len(batch["mask"]), MAX_LEN)
        ours = _ours(loss_type, batch, normalizer, beta=0.04, two_updates=True).loss
        theirs = sum(_trl_loss(trl_grpo, loss_type, m, beta=0.04, two_updates=True, accumulation=2,
                               items_in_batch=batch["mask"].sum())[0] for m in micro)
        if loss_type == "bnpo":
            assert abs(ours.item() - theirs.item()) > 1e-3
        else:
            assert ours.item() == pytest.approx(theirs.item(), abs=TOL), loss_type


def test_step_normalizer_values_and_errors():
    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[1, 1, 1, 1]])]
    assert step_normalizer("grpo", masks, 3, 16) == 3.0
    assert step_normalizer("dr_grpo", masks, 3, 16) == 48.0  # 3 sequences x 16 tokens
    assert step_normalizer("dapo", masks, 3, 16) == step_normalizer("bnpo", masks, 3, 16) == 7.0
    assert step_normalizer("dapo", [torch.tensor(11)], 3, 16) == 11.0  # an all-reduced count works too
    assert step_normalizer("dapo", [torch.zeros(2, 3)], 2, 16) == 1.0  # all masked: no 0/0
    with pytest.raises(ValueError, match="loss_type is 'ppo'"):
        step_normalizer("ppo", masks, 3, 16)
    with pytest.raises(ValueError, match="at least one completion"):
        step_normalizer("grpo", masks, 0, 16)
    batch = _batch()
    with pytest.raises(ValueError, match="needs the reference"):
        grpo_loss(batch["logps"], batch["advantages"], batch["mask"], loss_type="grpo", normalizer=8.0,
                  epsilon_low=0.2, epsilon_high=0.2, beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(batch["logps"], batch["advantages"][:3], batch["mask"], loss_type="grpo", normalizer=8.0,
                  epsilon_low=0.2, epsilon_high=0.2, beta=0.0)


def test_drop_truncated_zeroes_completions_without_a_stop_token():
    eos, pad = 2, 3
    ids = torch.tensor([[5, 6, eos, pad], [5, 6, 7, 8], [5, pad, pad, pad], [5, 6, 7, pad]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0]])
    # TRL: truncated = the completion's last token not in [*eos_token_ids, pad_token_id]
    kept = drop_truncated(mask, ids, [eos, pad])
    assert kept.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert kept.dtype == mask.dtype


# --- advantages -----------------------------------------------------------------------------------------------
def _trl_advantages(rewards_per_func, weights, num_generations, scale_rewards):
    """TRL 1.16 grpo_trainer.py lines 2756-2800 (sum_then_normalize) and 2820-2830 (the logged stats),
    transcribed; nanstd is TRL's own."""
    from trl.trainer.utils import nanstd

    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    return {"advantages": torch.nan_to_num(advantages, nan=0.0), "rewards": rewards,
            "frac_reward_zero_std": is_std_zero.float().mean().item(),
            "reward": torch.nanmean(rewards).item(), "reward_std": nanstd(rewards).item(),
            "mean": [torch.nanmean(rewards_per_func[:, i]).item() for i in range(rewards_per_func.shape[1])],
            "std": [nanstd(rewards_per_func[:, i]).item() for i in range(rewards_per_func.shape[1])]}


REWARDS = torch.tensor([  # 4 prompts x G = 3, 3 reward functions; NaN = the function gave None
    [1.0, 0.5, NAN], [0.0, 0.5, 1.0], [1.0, NAN, 0.0],
    [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0],      # tied group
    [NAN, NAN, NAN], [0.0, 2.0, 1.0], [4.0, 0.0, NAN],      # one unscorable completion
    [NAN, NAN, NAN], [NAN, NAN, NAN], [2.0, 1.0, 0.0],      # one scorable completion only
])
WEIGHTS = torch.tensor([1.0, 0.5, 2.0])


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_equal_trl(scale_rewards):
    ours = group_advantages(REWARDS, WEIGHTS, 3, scale_rewards)
    theirs = _trl_advantages(REWARDS.clone(), WEIGHTS, 3, scale_rewards)
    torch.testing.assert_close(ours.advantages, theirs["advantages"], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.rewards, theirs["rewards"], atol=1e-6, rtol=0, equal_nan=True)
    assert ours.zero_std_groups == pytest.approx(theirs["frac_reward_zero_std"])
    assert (ours.reward_mean, ours.reward_std) == pytest.approx((theirs["reward"], theirs["reward_std"]))
    assert ours.function_mean.tolist() == pytest.approx(theirs["mean"])
    assert ours.function_std.tolist() == pytest.approx(theirs["std"])
    assert not torch.isnan(ours.advantages).any() and ours.advantages.abs().max() > 0.5


def test_advantage_edge_cases():
    out = group_advantages(REWARDS, WEIGHTS, 3, "group")
    assert out.advantages[3:6].tolist() == [0.0, 0.0, 0.0]  # tied group
    assert out.zero_std_groups == pytest.approx(1 / 4)  # only the tied group; one scorable value is NaN-std
    # None excluded from the total (not a 0 that the weight multiplies): 1 + 0.5 x 0.5
    assert out.rewards[0].item() == pytest.approx(1.25)
    # The unscorable completion: NaN total, advantage 0, and left out of its group's baseline and std.
    assert math.isnan(out.rewards[6].item()) and out.advantages[6].item() == 0.0
    pair = group_advantages(REWARDS[7:9], WEIGHTS, 2, "group")
    torch.testing.assert_close(out.advantages[7:9], pair.advantages)
    assert out.group_mean[2].item() == pytest.approx((4.0 + 3.0) / 2)
    # One scorable completion: its std is undefined, so no signal for the group, and no NaN.
    assert out.advantages[9:12].tolist() == [0.0, 0.0, 0.0] and math.isnan(out.group_std[3].item())
    # G = 2: the two advantages are +-(d/2) / (|d|/sqrt(2) + 1e-4) ~ +-0.7071 (unbiased std of two values).
    assert pair.advantages.tolist() == pytest.approx([-0.7071, 0.7071], abs=1e-3)  # totals 3 and 4


def test_a_function_missing_for_the_whole_batch_changes_nothing_but_its_stats():
    missing = torch.cat([REWARDS[:6, :2], torch.full((6, 1), NAN)], dim=1)
    out = group_advantages(missing, WEIGHTS, 3, "batch")
    without = group_advantages(REWARDS[:6, :2], WEIGHTS[:2], 3, "batch")
    torch.testing.assert_close(out.advantages, without.advantages)
    assert math.isnan(out.function_mean[2].item()) and math.isnan(out.function_std[2].item())
    none = group_advantages(REWARDS, WEIGHTS, 3, "none")  # "none": deviations from the group mean, unscaled
    assert none.advantages[:3].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert none.advantages[1].item() == pytest.approx(2.25 - (1.25 + 2.25 + 1.0) / 3)


def test_advantage_errors_name_the_problem():
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(REWARDS, WEIGHTS, 5, "group")
    with pytest.raises(ValueError, match="one weight per reward function"):
        group_advantages(REWARDS, WEIGHTS[:2], 3, "group")
    with pytest.raises(ValueError, match="scale_rewards is 'std'"):
        group_advantages(REWARDS, WEIGHTS, 3, "std")
