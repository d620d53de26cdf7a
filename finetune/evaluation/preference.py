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
            "chosen_logp": sum(c for c, _ in logps) / n, "rejected_logp": sum(r for _, r in logps) / n, "pairs": n}


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


PAIRS_KEPT = 8  # held-out pairs whose texts and scores report.md shows


def preference_report(models, held, recipe) -> dict:
    """Base and tuned log-probs of each held-out pair's chosen and rejected response, DPO's implicit rewards, each
    claim with its bootstrap interval over the pairs (finetune/evaluation/uncertainty.py), and the first PAIRS_KEPT
    pairs with their texts and scores."""
    from finetune.evaluation.uncertainty import mean_interval, paired_interval
    from finetune.recipe.methods import method_setting

    pairs = paired(held.examples)
    logps = {}
    for name in ("base", "tuned"):
        with models.side(name) as model:
            logps[name] = response_logps(model, pairs, models.pad_id)
    beta = method_setting(recipe, "rl_beta")
    preferred = {side: [float(c > r) for c, r in values] for side, values in logps.items()}
    correct = [float(beta * (t[0] - b[0]) > beta * (t[1] - b[1])) for t, b in zip(logps["tuned"], logps["base"])]
    return {"log_prob": {name: log_prob_preference(v) for name, v in logps.items()},
            "reward": reward_metrics(logps["tuned"], logps["base"], beta), "source": held.source,
            "difference": paired_interval(preferred["base"], preferred["tuned"], recipe.seed, unit="pairs"),
            "accuracy_interval": mean_interval(correct, recipe.seed, unit="pairs"),
            "pairs": _kept_pairs(held.records, logps, beta)}


def _kept_pairs(records: list, logps: dict, beta: float) -> list[dict]:
    from finetune.evaluation.heldout import record_text as _text

    out = []
    for (_, record), base, tuned in list(zip(records, logps["base"], logps["tuned"]))[:PAIRS_KEPT]:
        out.append({"prompt": _text(record.get("prompt")), "chosen": _text(record.get("chosen")),
                    "rejected": _text(record.get("rejected")),
                    "base": {"chosen": round(base[0], 4), "rejected": round(base[1], 4)},
                    "tuned": {"chosen": round(tuned[0], 4), "rejected": round(tuned[1], 4)},
                    "reward": {"chosen": round(beta * (tuned[0] - base[0]), 4),
                               "rejected": round(beta * (tuned[1] - base[1]), 4)}})
    return out


def verdict_part(pref: dict) -> str:
    """`reward accuracy 0.625 [0.375, 0.875] on 8 held-out pairs (margin +0.412)`: the claim with its interval."""
    from finetune.evaluation.uncertainty import LEVEL, MIN_ITEMS

    reward, interval = pref["reward"], pref.get("accuracy_interval")
    shown = f" [{interval['low']:.3f}, {interval['high']:.3f}]" if interval and interval.get("mean") is not None else ""
    chance = ""
    if shown and interval["items"] < MIN_ITEMS:
        chance = f"; too few pairs to tell it from chance, {MIN_ITEMS} or more needed"
    elif shown:
        chance = ("; at chance (the interval holds 0.5)" if interval["low"] <= 0.5 <= interval["high"]
                  else "; above chance" if interval["low"] > 0.5 else "; below chance")
    return (f"reward accuracy {reward['reward_accuracy']:.3f}{shown} on {reward['pairs']} held-out pairs "
            f"({LEVEL:.0%} interval{chance}; margin {reward['reward_margin']:+.3g})")


def markdown_lines(pref: dict) -> list[str]:
    """report.md's preference section: a table of chosen and rejected log-probs and rewards, base and tuned; then
    the kept pairs, their texts and scores."""
    from finetune.evaluation.uncertainty import LEVEL, compared, span

    n = pref["reward"]["pairs"]
    lines = ["## Held-out pairs", "", f"{n} pairs ({pref.get('source', '-')}). Log-probs are summed over each response's "
             f"tokens; the reward is DPO's implicit one, beta {pref['reward']['beta']:g} x (tuned - base log-prob). "
             f"Intervals: {LEVEL:.0%} bootstrap over the pairs.", "",
             "| | chosen | rejected | chosen - rejected | chosen preferred |", "| --- | --- | --- | --- | --- |"]
    for side in ("base", "tuned"):
        lp = pref["log_prob"][side]
        lines.append(f"| {side} log-prob (mean) | {lp['chosen_logp']:.4g} | {lp['rejected_logp']:.4g} | "
                     f"{lp['logp_margin']:+.3g} | {lp['chosen_preferred']:.3f} |")
    reward, interval = pref["reward"], pref.get("accuracy_interval") or {}
    shown = f" [{interval['low']:.3f}, {interval['high']:.3f}]" if interval.get("mean") is not None else ""
    lines.append(f"| tuned reward (mean) | {reward['chosen_reward']:+.3g} | {reward['rejected_reward']:+.3g} | "
                 f"{reward['reward_margin']:+.3g} | accuracy {reward['reward_accuracy']:.3f}{shown} |")
    difference = pref.get("difference")
    if difference:
        lines += ["", f"chosen preferred, tuned - base: {span(difference)}: {compared(difference, True)}"]
    lines.append("")
    for i, pair in enumerate(pref.get("pairs", []), 1):
        lines += [f"### Pair {i}", "", "```text", pair["prompt"], "```", ""]
        for kind in ("chosen", "rejected"):
            lines += [f"**{kind}** (log-prob base {pair['base'][kind]:.4g}, tuned {pair['tuned'][kind]:.4g}; reward "
                      f"{pair['reward'][kind]:+.3g}):", "", "```text", pair[kind], "```", ""]
    return lines
