"""Each preference method as one objective: per-pair losses from per-sequence log-probs, the metrics it logs,
and what its loss is normalized by. The math is in finetune/train/preference_loss.py (pure functions, each
held equal to TRL's in tests/test_preference_loss.py); this module only routes a batch's numbers to them.

    terms(logps, ref, batch)    Terms: per-pair (KTO: per-example) losses, the chosen tokens' NLL sum for an
                                SFT term, and per-pair metrics
    counts(batch)               (pairs, chosen-response tokens): what a step divides the two sums by
    combine(terms, counts, k)   sum(per-pair) / pairs + weight x NLL sum / chosen tokens, times k processes
"""

from __future__ import annotations

from dataclasses import dataclass, field

from finetune.recipe_method import method_setting, uses_reference


@dataclass
class Terms:
    pair_losses: object  # (P,) tensor
    nll_sum: object = None  # sum of -log p over the chosen responses' tokens (SFT / NLL terms), or None
    metrics: dict = field(default_factory=dict)  # name -> (P,) tensor


class Objective:
    def __init__(self, recipe):
        self.method = recipe.method
        self.needs_reference = uses_reference(recipe)
        self.beta = method_setting(recipe, "rl_beta") if self.method != "orpo" else method_setting(recipe, "orpo_alpha")
        self.nll_weight = {"dpo": "rpo_alpha", "ipo": "rpo_alpha", "simpo": "rpo_alpha"}.get(self.method)
        self.nll_weight = method_setting(recipe, self.nll_weight) if self.nll_weight else (1.0 if self.method == "orpo"
                                                                                            else 0.0)
        self.recipe = recipe

    def counts(self, batch) -> list[float]:
        if "chosen_index" not in batch:
            return [float(batch["pair_ids"].numel()), 0.0]
        return [float(batch["pair_ids"].numel()), float(batch["response_tokens"][batch["chosen_index"]].sum())]

    def terms(self, logps, ref, batch) -> Terms:
        from finetune.train import preference_loss as L

        chosen, rejected = logps[batch["chosen_index"]], logps[batch["rejected_index"]]
        nll = -chosen.sum() if self.nll_weight else None
        ref_chosen, ref_rejected = ref[:, 0], ref[:, 1]
        losses = L.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, self.beta,
                            method_setting(self.recipe, "dpo_label_smoothing"))
        reward_chosen = self.beta * (chosen - ref_chosen).detach()
        reward_rejected = self.beta * (rejected - ref_rejected).detach()
        metrics = {"rewards/chosen": reward_chosen, "rewards/rejected": reward_rejected,
                   "rewards/margins": reward_chosen - reward_rejected,
                   "rewards/accuracies": (reward_chosen > reward_rejected).float(),
                   "logps/chosen": chosen.detach(), "logps/rejected": rejected.detach()}
        return Terms(losses, nll, metrics)

    def combine(self, terms: Terms, counts, scale: int):
        loss = terms.pair_losses.sum() / counts[0] * scale
        if terms.nll_sum is not None and self.nll_weight:
            loss = loss + self.nll_weight * terms.nll_sum / counts[1].clamp(min=1) * scale
        return loss.float()
