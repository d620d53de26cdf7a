"""Preference runs: does the tuned model prefer the chosen response over the rejected one, on held-out pairs?

The implicit reward of a response y to a prompt x is beta * (log pi_tuned(y|x) - log pi_base(y|x)), with the
base (the model before training) as the reference and beta the run's (rl_beta, or the method's default), as
DPO defines it. Reward accuracy: the fraction of pairs whose chosen response gets the higher reward; reward
margin: the mean of chosen reward - rejected reward. Beside them, for base and tuned alike: how often the model
alone gives the chosen response the higher log-probability (a base's own preference, the tuned one's after
training), and the mean log-probability margin.
"""

from __future__ import annotations

from finetune.errors import DataError


def response_logps(model, pairs, pad_id: int) -> list[tuple[float, float]]:
    """(sum log p(chosen | prompt), sum log p(rejected | prompt)) per pair."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for pair in pairs:
            sums = []
            for response in (pair.chosen_ids, pair.rejected_ids):
                ids = torch.tensor([list(pair.prompt_ids) + list(response)], device=device)
                logps = model(input_ids=ids).logits.float()[0, :-1].log_softmax(-1)
                targets = ids[0, 1:]
                token = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                sums.append(float(token[len(pair.prompt_ids) - 1:].sum()))
            out.append((sums[0], sums[1]))
    return out


def log_prob_preference(logps: list[tuple[float, float]]) -> dict:
    n = len(logps)
    return {"chosen_preferred": sum(c > r for c, r in logps) / n, "logp_margin": sum(c - r for c, r in logps) / n,
            "pairs": n}


def reward_metrics(policy: list[tuple[float, float]], reference: list[tuple[float, float]], beta: float) -> dict:
    """DPO's implicit rewards of the tuned model against the base."""
    chosen = [beta * (p[0] - r[0]) for p, r in zip(policy, reference)]
    rejected = [beta * (p[1] - r[1]) for p, r in zip(policy, reference)]
    n = len(chosen)
    return {"reward_accuracy": sum(c > r for c, r in zip(chosen, rejected)) / n,
            "reward_margin": sum(c - r for c, r in zip(chosen, rejected)) / n,
            "chosen_reward": sum(chosen) / n, "rejected_reward": sum(rejected) / n, "beta": beta, "pairs": n}


def paired(items) -> list:
    from finetune.data.preference.pairs import Pair

    pairs = [item for item in items if isinstance(item, Pair)]
    if not pairs:
        raise DataError("the held-out preference data has no {prompt, chosen, rejected} pairs (KTO's unpaired "
                        "examples have no pair to compare); pass pairs with --data")
    return pairs
