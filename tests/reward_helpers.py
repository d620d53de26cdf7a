"""Reward-model test data: pairs whose chosen answer is the SHORTER one (what a tiny model learns in a few steps, from
the position of the last token), as plain text or conversations, and a reward recipe for the tiny model."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from conftest import sentence, write_jsonl


def length_pairs(n: int, seed: int = 0, chat: bool = False) -> list[dict]:
    """`n` pairs: a prompt, a short chosen answer (1-3 words), a long rejected one (6-10 words)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt, short, long = sentence(rng, 3, 6), " " + sentence(rng, 1, 3), " " + sentence(rng, 6, 10)
        if chat:
            out.append({"prompt": [{"role": "user", "content": prompt}],
                        "chosen": [{"role": "assistant", "content": short.strip()}],
                        "rejected": [{"role": "assistant", "content": long.strip()}]})
        else:
            out.append({"prompt": prompt, "chosen": short, "rejected": long})
    return out


def reward_recipe(folder: Path, base_model, n: int = 64, chat: bool = False, seed: int = 0, **overrides) -> Path:
    """A `method: reward` recipe on `n` length pairs, written into `folder`; returns its path."""
    write_jsonl(folder / "pairs.jsonl", length_pairs(n, seed, chat))
    recipe = {"base_model": str(base_model), "method": "reward", "datasets": [{"path": "pairs.jsonl",
                                                                                 "type": "preference"}],
              "sequence_len": 48, "micro_batch_size": 4, "num_epochs": 2, "learning_rate": 2e-3, "logging_steps": 1,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "val_set_size": 16,
              "adapter": "lora", "lora_dropout": 0.0, "max_checkpoints": 1, "precision": "fp32", "compile": False}
    recipe.update(overrides)
    path = folder / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
