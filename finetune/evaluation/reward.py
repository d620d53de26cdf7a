"""A reward run's held-out pairs: does the tuned reward model score the chosen answer above the rejected one, and
does the one it started from (its untrained head: chance)?

Both sides are scored by the scorer (finetune/model/scorer.py), exactly as training scored its eval split:
    tuned   the run's reward model, reloaded (its adapter with the trained score head, or its full model)
    base    the model it started from with the head it started with: an adapter's model with the adapter switched off
            (peft keeps the starting head beside the trained copy), a full fine-tune's base loaded with a new head,
            drawn with the run's seed; an untrained head ranks pairs at chance (0.5, on average over heads)

Reported per side: pair accuracy (chosen scored above rejected; a tie counts as wrong, as in training), the mean
margin (chosen - rejected), the mean chosen and rejected scores, and their histograms (report.md shows
scores.png; the runs page draws them); tuned - base accuracy with its bootstrap interval over the pairs
(finetune/evaluation/uncertainty.py), the tuned accuracy's own interval, and the first PAIRS_KEPT pairs' texts and
scores. Margins of two heads are on their own scales: compared within a side, never across.
"""

from __future__ import annotations

import contextlib

from finetune.errors import DataError
from finetune.log import get_logger

log = get_logger(__name__)

PAIRS_KEPT = 8  # held-out pairs whose texts and scores report.md shows
BINS = 20  # histogram bins per side


def refuse_generation(spec) -> None:
    """FinetuneError when the eval asks a reward model to generate (lm-eval tasks, a GGUF export's answers)."""
    from finetune.errors import FinetuneError

    if spec.tasks or spec.tasks_dir or spec.gguf:
        raise FinetuneError("the run is a reward model (`method: reward`): it scores answers and does not generate, "
                            "so lm-eval tasks and a GGUF export do not apply to it; drop `tasks` / `tasks_dir` / "
                            "`gguf` (its evaluation is the held-out pairs' accuracy: docs/reward-models.md)")


def reward_report(subject, held) -> tuple[dict, str]:
    """({"sides": {side: metrics}, "histograms", "difference", "accuracy_interval", "pairs", "source", "scores"},
    how the model reads (prompt, answer): the report's prompt format)."""
    from finetune.evaluation.uncertainty import mean_interval, paired_interval
    from finetune.model.scorer import read_scoring

    pairs = [item for item in held.examples if hasattr(item, "chosen_ids")]
    if not pairs:
        raise DataError("the held-out data has no {prompt, chosen, rejected} pairs to score; pass pairs with --data")
    scores = {}
    for side in ("base", "tuned"):
        with _side(subject, side) as scorer:
            scores[side] = scorer.score_pairs(pairs)
        log.info(f"held-out pair accuracy, {side}: {_metrics(scores[side])['accuracy']:.3f}")
    correct = {side: [float(c > r) for c, r in values] for side, values in scores.items()}
    seed = subject.recipe.seed
    reads = f"reward model: {read_scoring(subject.folder, subject.run).describe()}"
    return {"sides": {side: _metrics(values) for side, values in scores.items()},
            "histograms": {side: histogram(values) for side, values in scores.items()},
            "difference": paired_interval(correct["base"], correct["tuned"], seed, unit="pairs"),
            "accuracy_interval": mean_interval(correct["tuned"], seed, unit="pairs"),
            "pairs": _kept(held.records, scores), "source": held.source, "pair_count": len(pairs),
            "scores": {side: {"chosen": [round(c, 6) for c, _ in v], "rejected": [round(r, 6) for _, r in v]}
                       for side, v in scores.items()}}, reads


@contextlib.contextmanager
def _side(subject, side: str):
    """The scorer of one side (see the module's docstring), on the evaluation device."""
    from transformers import set_seed

    from finetune.evaluation.subject import device
    from finetune.model.scorer import RewardScorer, read_scoring

    set_seed(subject.recipe.seed)  # a head new at load (a full fine-tune's base's) is drawn the same way each time
    if side == "tuned" or subject.is_adapter:
        scorer = RewardScorer.load(subject.folder, device=device())
        if side == "tuned":
            yield scorer
        else:
            with scorer.model.disable_adapter():  # the decoder as it started and the head it started with
                yield scorer
        return
    from finetune.model import reward_loader
    from finetune.model.trained import saved_tokenizer

    base = reward_loader()(subject.base_source)
    tokenizer = saved_tokenizer(subject.folder)
    if base.config.pad_token_id is None:
        base.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.eos_token_id
    yield RewardScorer(base.to(device()).eval(), tokenizer, read_scoring(subject.folder, subject.run))


def _metrics(values: list[tuple[float, float]]) -> dict:
    n = len(values)
    return {"accuracy": sum(c > r for c, r in values) / n, "margin": sum(c - r for c, r in values) / n,
            "chosen": sum(c for c, _ in values) / n, "rejected": sum(r for _, r in values) / n, "pairs": n}


def histogram(values: list[tuple[float, float]], bins: int = BINS) -> dict:
    """{"edges": bins + 1 edges over the side's scores, "chosen": counts, "rejected": counts}."""
    import numpy as np

    chosen, rejected = np.array([c for c, _ in values]), np.array([r for _, r in values])
    low, high = float(min(chosen.min(), rejected.min())), float(max(chosen.max(), rejected.max()))
    edges = np.linspace(low, high if high > low else low + 1e-6, bins + 1)
    return {"edges": [round(float(e), 6) for e in edges], "chosen": np.histogram(chosen, edges)[0].tolist(),
            "rejected": np.histogram(rejected, edges)[0].tolist()}


def _kept(records: list, scores: dict) -> list[dict]:
    from finetune.evaluation.heldout import record_text

    out = []
    for i, (_, record) in enumerate(records[:PAIRS_KEPT]):
        out.append({"prompt": record_text(record.get("prompt")), "chosen": record_text(record.get("chosen")),
                    "rejected": record_text(record.get("rejected")),
                    **{side: {"chosen": round(v[i][0], 4), "rejected": round(v[i][1], 4)} for side, v in scores.items()}})
    return out


def headline_rows(reward: dict) -> list:
    sides = reward["sides"]
    return [("pair accuracy", {s: v["accuracy"] for s, v in sides.items()}, True),
            ("mean margin (own scale)", {s: v["margin"] for s, v in sides.items()}, True)]


def verdict_part(reward: dict) -> str:
    """`pair accuracy 0.500 -> 0.938 (tuned - base +0.44 [+0.25, +0.62] over 16 pairs): better; margin +1.2`."""
    from finetune.evaluation.uncertainty import claim

    base, tuned = reward["sides"]["base"], reward["sides"]["tuned"]
    said = claim("held-out pair accuracy", base["accuracy"], tuned["accuracy"], reward["difference"],
                 higher_is_better=True)
    return f"{said}; tuned margin {tuned['margin']:+.3g} (chosen {tuned['chosen']:+.3g}, rejected {tuned['rejected']:+.3g})"


def markdown_lines(reward: dict) -> list[str]:
    """report.md's reward section: a table per side, the histograms' picture, then the kept pairs and their scores."""
    from finetune.evaluation.uncertainty import LEVEL, span

    lines = ["## Held-out pairs", "", f"{reward['pair_count']} pairs ({reward.get('source', '-')}), each answer scored "
             "at its last token as in training. base: the model the run started from with the head it started with "
             f"(untrained: chance). Intervals: {LEVEL:.0%} bootstrap over the pairs.", "",
             "| | pair accuracy | margin (chosen - rejected) | chosen score | rejected score |",
             "| --- | --- | --- | --- | --- |"]
    for side in ("base", "tuned"):
        v = reward["sides"][side]
        lines.append(f"| {side} | {v['accuracy']:.3f} | {v['margin']:+.4g} | {v['chosen']:+.4g} | {v['rejected']:+.4g} |")
    interval = reward.get("accuracy_interval") or {}
    if interval.get("mean") is not None:
        lines += ["", f"tuned accuracy: {interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]; "
                  f"tuned - base: {span(reward['difference'])}"]
    lines += ["", "![score histograms](scores.png)", ""]
    for i, pair in enumerate(reward.get("pairs", []), 1):
        lines += [f"### Pair {i}", "", "```text", pair["prompt"], "```", ""]
        for kind in ("chosen", "rejected"):
            lines += [f"**{kind}** (score base {pair['base'][kind]:+.4g}, tuned {pair['tuned'][kind]:+.4g}):", "",
                      "```text", pair[kind], "```", ""]
    return lines


def plot_histograms(reward: dict):
    """scores.png's figure: a panel per side, the chosen and rejected answers' score histograms overlaid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    for ax, side in zip(fig.subplots(1, 2), ("base", "tuned")):
        hist = reward["histograms"][side]
        edges = hist["edges"]
        width = edges[1] - edges[0]
        for kind, color in (("chosen", "tab:green"), ("rejected", "tab:red")):
            ax.bar(edges[:-1], hist[kind], width=width, align="edge", alpha=0.5, color=color, label=kind)
        ax.set(title=f"{side}: accuracy {reward['sides'][side]['accuracy']:.3f}", xlabel="score", ylabel="pairs")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
