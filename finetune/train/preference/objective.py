"""Each preference method as one objective: per-pair losses from per-sequence log-probs, the metrics it logs,
and what its loss is normalized by. The math is in finetune/train/preference/loss.py (pure functions, each
held equal to TRL's in tests/test_preference_loss.py); this module only routes a batch's numbers to them.

    terms(logps, ref, batch, kl)  Terms: per-pair (KTO: per-example) losses, the chosen responses' NLL sum for
                                  an SFT term, and per-pair metrics
    kl_estimate(policy, ref, ..)  KTO's reference point from the micro batch's mismatched sequences
    counts(batch)                 (pairs or examples, chosen-response tokens): what a step divides the sums by
    combine(terms, counts, k)     sum(per-pair) / pairs + weight x NLL sum / chosen tokens, times k processes
    derived(means)                metrics computed from the logged means (KTO's margin)

The SFT term (`rpo_alpha` for DPO, IPO and SimPO; ORPO's, always on with weight 1) is the mean NLL of the
chosen responses' tokens, prompts excluded, as every supervised loss in finetune is. TRL's ORPOTrainer also
scores the prompt's tokens in that term (docs/preference.md); the ORPO paper and LLaMA-Factory do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from finetune.recipe.methods import method_settings, uses_reference

NLL_WEIGHT_KEY = {"dpo": "rpo_alpha", "ipo": "rpo_alpha", "simpo": "rpo_alpha"}


@dataclass
class Terms:
    pair_losses: object  # (P,) tensor
    nll_sum: object = None  # sum of -log p over the chosen responses' tokens (SFT / NLL terms), or None
    metrics: dict = field(default_factory=dict)  # name -> tensor of per-pair values


class Objective:
    def __init__(self, recipe):
        self.method = recipe.method
        self.needs_reference = uses_reference(recipe)
        self.needs_kl = self.method == "kto"
        self.settings = method_settings(recipe)
        self.beta = self.settings["orpo_alpha" if self.method == "orpo" else "rl_beta"]
        key = NLL_WEIGHT_KEY.get(self.method)
        self.nll_weight = self.settings[key] if key else (1.0 if self.method == "orpo" else 0.0)

    def counts(self, batch) -> list[float]:
        items = float(batch["pair_ids"].numel())
        if "chosen_index" not in batch:
            return [items, 0.0]
        return [items, float(batch["response_tokens"][batch["chosen_index"]].sum())]

    def kl_estimate(self, policy_kl, ref_kl, all_reduce_mean=None):
        from finetune.train.preference.loss import kto_kl

        return kto_kl(policy_kl, ref_kl, all_reduce_mean)

    def terms(self, logps, ref, batch, kl=None) -> Terms:
        from finetune.train.preference import loss as L

        if self.method == "kto":
            losses = L.kto_loss(logps, ref[:, 0], batch["label"], kl, self.beta,
                                self.settings["kto_desirable_weight"], self.settings["kto_undesirable_weight"])
            metrics = L.kto_metrics(logps, ref[:, 0], batch["label"], self.beta)
            return Terms(losses, None, {**metrics, "kl": kl.detach().reshape(1)})
        chosen, rejected = logps[batch["chosen_index"]], logps[batch["rejected_index"]]
        tokens = batch["response_tokens"].to(logps.device)
        n_chosen, n_rejected = tokens[batch["chosen_index"]], tokens[batch["rejected_index"]]
        ref_chosen, ref_rejected = (ref[:, 0], ref[:, 1]) if ref is not None else (None, None)
        if self.method == "dpo":
            losses = L.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, self.beta,
                                self.settings["dpo_label_smoothing"])
        elif self.method == "ipo":
            losses = L.ipo_loss(chosen, rejected, ref_chosen, ref_rejected, n_chosen, n_rejected, self.beta)
        elif self.method == "simpo":
            losses = L.simpo_loss(chosen, rejected, n_chosen, n_rejected, self.beta, self.settings["simpo_gamma"])
        elif self.method == "orpo":
            losses, _ = L.orpo_loss(chosen, rejected, n_chosen, n_rejected, self.beta)
        else:
            raise ValueError(f"no objective for method {self.method!r}")
        metrics = L.preference_metrics(self.method, chosen, rejected, self.beta, ref_chosen, ref_rejected,
                                       n_chosen, n_rejected)
        nll = -chosen.sum() if self.nll_weight else None
        return Terms(losses, nll, metrics)

    def combine(self, terms: Terms, counts, scale: int):
        loss = terms.pair_losses.sum() / counts[0] * scale
        if terms.nll_sum is not None and self.nll_weight:
            loss = loss + self.nll_weight * terms.nll_sum / counts[1].clamp(min=1) * scale
        return loss.float()

    def derived(self, means: dict) -> dict:
        """Metrics from other metrics' means since the last log: KTO's margin is the mean desirable reward minus
        the mean undesirable reward (TRL's, per micro batch holding both), as its examples are not pairs."""
        if self.method == "kto" and "rewards/chosen" in means and "rewards/rejected" in means:
            return {"rewards/margins": means["rewards/chosen"] - means["rewards/rejected"]}
        return {}
