"""A GRPO run's held-out rewards: the run's own reward functions on held-out prompts, base vs tuned.

Each held-out prompt is answered SAMPLES times by each side, sampled as training sampled (the run's temperature,
top_p, top_k and max_completion_length, seeded so both sides draw from the same seed), and every reward function
scores the answers in worker processes (finetune/train/grpo/rewards.py). Reported per side: each function's mean,
the weighted total's mean, the share of answers cut at max_completion_length and the mean length; for each reward,
tuned - base with its bootstrap interval over the prompts (finetune/evaluation/uncertainty.py), the answers of the
first ANSWERS_KEPT prompts, and a word when the claim goes against the training's own verdict (its run.json).
"""

from __future__ import annotations

import json
import math

from finetune.errors import DataError
from finetune.log import get_logger

log = get_logger(__name__)

SAMPLES = 4  # answers per prompt and side: a mean over a group, as training sees it
ANSWERS_KEPT = 8  # prompts whose answers (every sample, both sides) the report keeps


def heldout_prompts(subject, tokenizer, data_path: str | None) -> tuple[list, str]:
    """([(prompt ids, record)], where they come from): `data_path`'s prompt records, or the recipe's eval split."""
    from finetune.data import record_files, split
    from finetune.data.grpo.prompts import tokenize_prompts

    recipe = subject.recipe
    if data_path:
        items, _ = tokenize_prompts(recipe, tokenizer, [("auto", data_path)])
        return [(p.prompt_ids, p.record) for p in items], f"all prompts of {data_path}"
    if recipe.val_set_size == 0:
        raise DataError("the recipe holds no prompts out (`val_set_size: 0`); pass a file of prompt records with "
                        "--data (or `eval.data`), or set `val_set_size` (e.g. 16) and train again")
    items, _ = tokenize_prompts(recipe, tokenizer, record_files(recipe))
    _, held = split(items, recipe)
    return [(p.prompt_ids, p.record) for p in held], (f"the recipe's eval split (val_set_size "
                                                      f"{recipe.val_set_size:g}, seed {recipe.seed})")


def heldout_rewards(models, subject, data_path: str | None, limit: int | None = None) -> dict:
    """{"sides": {side: {reward, rewards/<name>, clipped_ratio, mean_length}}, "differences": {metric: interval},
    "answers", "prompts", "samples_per_prompt", "source", "training_verdict"}."""
    from pathlib import Path

    from finetune.evaluation.uncertainty import paired_interval
    from finetune.evaluation.subject import device
    from finetune.train.grpo.reward_models import RewardSet

    if not subject.recipe.rewards:  # an agents run scored by its environment alone (docs/grpo.md, "Agents")
        from finetune.errors import RewardError

        raise RewardError("this GRPO run's only reward is its environment's get_reward(); `finetune eval` answers "
                          "held-out prompts in one turn, without tools, so it has no reward to score them with; add a "
                          "reward function to `rewards`")
    prompts, source = heldout_prompts(subject, models.tokenizer, data_path)
    prompts = prompts[:limit] if limit else prompts
    log.info(f"GRPO rewards on {len(prompts)} held-out prompts x {SAMPLES} answers per side: {source}")
    sides, per_prompt, answers = {}, {}, {}
    with RewardSet(subject.recipe.rewards, base_dir=Path.cwd(), device=device(),
                   counted_in="this evaluation's log") as runner:
        for name in ("base", "tuned"):
            with models.side(name) as model:
                sides[name], per_prompt[name], answers[name] = _side(model, models, subject.recipe, prompts, runner)
            log.info(f"held-out reward, {name}: {sides[name]['reward']:.4f}")
    differences = {metric: paired_interval(per_prompt["base"][metric], per_prompt["tuned"][metric],
                                           subject.recipe.seed, unit="prompts") for metric in per_prompt["tuned"]}
    kept = [{"prompt": record["prompt"], "columns": {k: v for k, v in record.items() if k != "prompt"},
             **{side: answers[side][i] for side in answers}} for i, (_, record) in enumerate(prompts[:ANSWERS_KEPT])]
    return {"sides": sides, "differences": differences, "prompts": len(prompts), "samples_per_prompt": SAMPLES,
            "source": source, "answers": kept, "training_verdict": _training_verdict(subject.run)}


def _side(model, models, recipe, prompts: list, runner) -> tuple[dict, dict, list]:
    """(the side's means, {metric: one mean per prompt}, [each kept prompt's answers])."""
    import torch

    from finetune.recipe.methods import method_setting
    from finetune.train.grpo.generation import generate_completions
    from finetune.train.grpo.setup import eos_ids
    from finetune.train.grpo.step import reward_inputs

    limit = method_setting(recipe, "max_completion_length")
    completions = generate_completions(
        model, [ids for ids, _ in prompts], SAMPLES, limit, seed=recipe.seed, eos_ids=list(eos_ids(models.tokenizer)),
        pad_id=models.pad_id, temperature=method_setting(recipe, "temperature"),
        top_p=method_setting(recipe, "top_p"), top_k=method_setting(recipe, "top_k"))
    records = [record for _, record in prompts for _ in range(SAMPLES)]
    chat = isinstance(records[0]["prompt"], list)
    inputs = reward_inputs(models.tokenizer, records, completions, chat)
    batch = runner.score(**inputs)
    values = torch.tensor(batch.values, dtype=torch.float64)  # [F, N], NaN where missing
    weights = torch.tensor(runner.weights, dtype=torch.float64).unsqueeze(1)
    total = (values * weights).nansum(dim=0)
    total[torch.isnan(values).all(dim=0)] = float("nan")
    out = {"reward": _mean(total), "clipped_ratio": sum(completions.is_truncated) / len(completions.ids),
           "mean_length": sum(completions.lengths) / len(completions.ids)}
    per_prompt = {"reward": [_mean(group) for group in total.view(-1, SAMPLES)]}
    for name, row in zip(runner.names, values):
        out[f"rewards/{name}"] = _mean(row)
        per_prompt[f"rewards/{name}"] = [_mean(group) for group in row.view(-1, SAMPLES)]
    texts = [c if isinstance(c, str) else c[0]["content"] for c in inputs["completions"]]
    answers = [[{"answer": texts[i], "reward": _value(total[i]), "tokens": len(completions.ids[i]),
                 "truncated": bool(completions.is_truncated[i]),
                 "rewards": {name: _value(row[i]) for name, row in zip(runner.names, values)}}
                for i in range(p * SAMPLES, (p + 1) * SAMPLES)] for p in range(min(ANSWERS_KEPT, len(prompts)))]
    return out, per_prompt, answers


def _mean(values) -> float:
    import torch

    kept = values[~torch.isnan(values)]
    return float(kept.mean()) if kept.numel() else math.nan


def _value(value) -> float | None:
    return None if math.isnan(float(value)) else round(float(value), 6)


def _training_verdict(run: dict) -> dict | None:
    """The training's own verdict on its reward (run.json's curves), for the report to set the claim beside."""
    curves = (run or {}).get("curves") or {}
    return {k: curves[k] for k in ("verdict", "reason", "reward_first", "reward_last", "reward_verdict")
            if k in curves} or None


def verdict_part(grpo: dict) -> str:
    """The claim on the weighted total, with its interval, and a word when training's verdict says otherwise."""
    from finetune.evaluation.uncertainty import claim, compared

    base, tuned = grpo["sides"]["base"]["reward"], grpo["sides"]["tuned"]["reward"]
    interval = grpo["differences"]["reward"]
    said = claim("held-out reward", base, tuned, interval, higher_is_better=True)
    trained = grpo.get("training_verdict") or {}
    # "rewards failing" keeps the working functions' verdict as reward_verdict: the claim is about the reward
    word, verdict = compared(interval, True), trained.get("reward_verdict") or trained.get("verdict")
    if word == "too few to tell":
        return said
    if verdict == "reward rising" and word != "better":
        said += (f"; training's verdict was `reward rising` ({trained['reward_first']:.3f} -> "
                 f"{trained['reward_last']:.3f} on its own prompts), which these {grpo['prompts']} held-out prompts do "
                 f"not show{'' if word == 'worse' else ': more prompts (--data) would tell'}")
    elif verdict not in (None, "reward rising", "too short") and word == "better":
        said += (f"; against training's verdict `{verdict}` ({trained.get('reason', '').split(';')[0]}): more "
                 "held-out prompts (--data) would tell which holds")
    return said


def headline_rows(grpo: dict) -> list:
    names = [k for k in grpo["sides"]["tuned"] if k.startswith("rewards/") or k == "reward"]
    rows = [(f"held-out {name}", {s: v[name] for s, v in grpo["sides"].items()}, True) for name in names]
    return rows + [("held-out clipped share", {s: v["clipped_ratio"] for s, v in grpo["sides"].items()}, False)]


def markdown_lines(grpo: dict) -> list[str]:
    """report.md's GRPO section: the mean lengths, then the kept answers with each one's rewards."""
    from finetune.evaluation.uncertainty import LEVEL

    sides = grpo["sides"]
    lines = ["## Held-out rewards", "",
             f"{grpo['prompts']} prompts ({grpo['source']}), {grpo['samples_per_prompt']} answers per prompt and side, "
             "sampled as training sampled. tuned - base: the mean over prompts, with its "
             f"{LEVEL:.0%} bootstrap interval over the prompts; \"no difference\" when it spans 0.", "",
             f"- answers cut at max_completion_length: base {sides['base']['clipped_ratio']:.3f}, tuned "
             f"{sides['tuned']['clipped_ratio']:.3f}",
             f"- mean answer length: base {sides['base']['mean_length']:.1f} tokens, tuned "
             f"{sides['tuned']['mean_length']:.1f} tokens", ""]
    trained = grpo.get("training_verdict")
    if trained:
        lines += [f"Training's own verdict: `{trained['verdict']}`: {trained.get('reason', '')}", ""]
    if grpo.get("answers"):
        lines += ["## Answers", ""]
    for i, row in enumerate(grpo.get("answers") or [], 1):
        prompt = row["prompt"] if isinstance(row["prompt"], str) else "\n".join(
            f"{m['role']}: {m['content']}" for m in row["prompt"])
        lines += [f"### Prompt {i}", "", "```text", prompt, "```", "", f"columns: {json.dumps(row['columns'], ensure_ascii=False)}", ""]
        for side in ("base", "tuned"):
            for j, answer in enumerate(row.get(side, []), 1):
                scores = ", ".join(f"{name} {_shown(v)}" for name, v in answer["rewards"].items())
                cut = ", cut at the limit" if answer["truncated"] else ""
                lines += [f"**{side} {j}** (reward {_shown(answer['reward'])}: {scores}; {answer['tokens']} tokens"
                          f"{cut}):", "", "```text", answer["answer"], "```", ""]
    return lines


def _shown(value) -> str:
    return "-" if value is None else f"{value:.3g}"
