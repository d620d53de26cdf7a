"""Reward-model training with the HF Trainer: one subclass, through its public hooks only.

    compute_loss        each sequence's score at its last token (finetune/model/score_head.py), the pairs'
                        Bradley-Terry losses (finetune/train/reward/loss.py), normalized over the STEP
    get_batch_samples   counts the pairs of the whole optimizer step: every micro batch, every process
    prediction_step     evaluation: the same loss, no logits
    log                 accuracy, margin, chosen_reward / rejected_reward, mean_reward (averaged over the pairs since
                        the last log) and min_reward / max_reward (over them), eval_-prefixed on the eval split

Why over the step: packed micro batches hold different numbers of pairs, so a mean per micro batch would weigh pairs
unequally; summing per-pair losses and dividing by the pairs of the whole optimizer step (all processes) gives every
pair the same weight, packed or not, one process or several. DDP and DeepSpeed average gradients over processes, so
each process's loss is multiplied by their number (the sum is then exact). With one micro batch a step and one
process this is TRL's mean over the micro batch.
"""

from __future__ import annotations

import torch
from transformers import Trainer

from finetune.model.score_head import sequence_scores
from finetune.train.metric_sums import MetricSums
from finetune.train.micro_batches import take
from finetune.train.reward.loss import bradley_terry_loss, pair_metrics


class RewardTrainer(Trainer):
    def __init__(self, *args, center_coefficient: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.center_coefficient = center_coefficient
        self.loss_is_scaled_for_ga = True  # compute_loss normalizes over the whole step itself
        self._sums = MetricSums()

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches = take(epoch_iterator, num_batches)
        pairs = torch.tensor(float(sum(b["pair_ids"].numel() for b in batches)), dtype=torch.float64, device=device)
        if self.args.world_size > 1:
            pairs = self.accelerator.reduce(pairs, reduction="sum")
        return batches, pairs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        scores = sequence_scores(model, inputs)
        chosen, rejected = scores[inputs["chosen_index"]], scores[inputs["rejected_index"]]
        losses = bradley_terry_loss(chosen, rejected, inputs.get("margin"), self.center_coefficient)
        if num_items_in_batch is None:  # evaluation, or a caller without the step's counts: this batch alone
            count, scale = float(losses.numel()), 1
        else:
            count, scale = num_items_in_batch.to(losses.device), self.accelerator.num_processes
        loss = (losses.sum() / count * scale).float()
        mode = "train" if model.training else "eval"
        self._sums.add({**pair_metrics(chosen, rejected), "mean_reward": scores}, mode)
        self._sums.add_extremes({"min_reward": scores, "max_reward": scores}, mode)
        return (loss, {}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict, start_time=None) -> None:
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        for name, value in self._sums.take(mode, self).items():
            logs[f"{prefix}{name}"] = round(value, 6)
        super().log(logs, start_time)
