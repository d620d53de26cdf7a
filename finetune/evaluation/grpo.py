"""A GRPO run's held-out rewards: the run's own reward functions on held-out prompts, base vs tuned.

Each held-out prompt is answered SAMPLES times by each side, sampled as training sampled (the run's temperature,
top_p, top_k and max_completion_length, seeded so both sides draw from the same seed), and every reward function
scores the answers in worker processes (finetune/train/grpo/rewards.py). Reported per side: each function's mean,
the weighted total's mean, the share of answers cut at max_completion_length and the mean length.
"""

from __future__ import annotations

import math

from finetune.errors import DataError
from finetune.log import get_logger

log = get_logger(__name__)

SAMPLES = 4  # answers per prompt and side: a mean over a group, as training sees it


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
    """{"sides": {side: {reward, rewards/<name>, clipped_ratio, mean_length}}, "prompts", "source"}."""
    from pathlib import Path

    from finetune.train.grpo.rewards import RewardRunner

    prompts, source = heldout_prompts(subject, models.tokenizer, data_path)
    prompts = prompts[:limit] if limit else prompts
    log.info(f"GRPO rewards on {len(prompts)} held-out prompts x {SAMPLES} answers per side: {source}")
    sides = {}
    with RewardRunner(subject.recipe.rewards, base_dir=Path.cwd()) as runner:
        for name in ("base", "tuned"):
            with models.side(name) as model:
                sides[name] = _side(model, models, subject.recipe, prompts, runner)
            log.info(f"held-out reward, {name}: {sides[name]['reward']:.4f}")
    return {"sides": sides, "prompts": len(prompts), "samples_per_prompt": SAMPLES, "source": source}


def _side(model, models, recipe, prompts: list, runner) -> dict:
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
    batch = runner.score(**reward_inputs(models.tokenizer, records, completions, chat))
    values = torch.tensor(batch.values, dtype=torch.float64)  # [F, N], NaN where missing
    weights = torch.tensor(runner.weights, dtype=torch.float64).unsqueeze(1)
    total = (values * weights).nansum(dim=0)
    total[torch.isnan(values).all(dim=0)] = float("nan")
    out = {"reward": _mean(total), "clipped_ratio": sum(completions.is_truncated) / len(completions.ids),
           "mean_length": sum(completions.lengths) / len(completions.ids)}
    for name, row in zip(runner.names, values):
        out[f"rewards/{name}"] = _mean(row)
    return out


def _mean(values) -> float:
    import torch

    kept = values[~torch.isnan(values)]
    return float(kept.mean()) if kept.numel() else math.nan


def verdict_part(grpo: dict) -> str:
    base, tuned = grpo["sides"]["base"]["reward"], grpo["sides"]["tuned"]["reward"]
    word = "better" if tuned > base else "worse" if tuned < base else "no different"
    return f"tuned is {word} on held-out reward ({base:.4f} -> {tuned:.4f}, {grpo['prompts']} prompts)"


def headline_rows(grpo: dict) -> list:
    names = [k for k in grpo["sides"]["tuned"] if k.startswith("rewards/") or k == "reward"]
    return [(f"held-out {name}", {s: v[name] for s, v in grpo["sides"].items()}, True) for name in names]


