"""Shared by the GRPO tests: a verifiable toy task for the tiny model, its reward file, and a recipe."""

from __future__ import annotations

import random

import yaml

from conftest import write_jsonl
from tiny import WORDS

# The toy task: say the word the prompt names. The reward is a program's check, graded so that a random tiny model
# gets some signal: the share of the completion's words that are that word.
REWARDS_PY = '''
def names_the_word(prompts, completions, word, **kwargs):
    out = []
    for completion, target in zip(completions, word):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        words = text.split()
        out.append(sum(w == target for w in words) / len(words) if words else 0.0)
    return out


def even_tokens(completion_ids, **kwargs):
    """A dense, verifiable reward a random tiny model can climb: the share of its tokens with an even id."""
    return [sum(1 for t in ids if t % 2 == 0) / len(ids) if ids else 0.0 for ids in completion_ids]


def short(completions, **kwargs):
    return [-0.01 * len((c if isinstance(c, str) else c[0]["content"]).split()) for c in completions]
'''


def prompt_records(n: int, seed: int = 0, chat: bool = False) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        word = rng.choice(WORDS[:6])
        text = f"say {word}"
        records.append({"prompt": [{"role": "user", "content": text}] if chat else text, "word": word})
    return records


def grpo_recipe(tmp_path, base_model, n: int = 16, chat: bool = False, **overrides):
    """The recipe's path: n prompt records and rewards.py beside it."""
    write_jsonl(tmp_path / "prompts.jsonl", prompt_records(n, chat=chat))
    (tmp_path / "rewards.py").write_text(REWARDS_PY)
    recipe = {"base_model": str(base_model), "method": "grpo", "datasets": [{"path": "prompts.jsonl"}],
              "rewards": [{"function": "rewards.py:names_the_word"}], "num_generations": 4,
              "max_completion_length": 8, "sequence_len": 64, "micro_batch_size": 4, "gradient_accumulation_steps": 2,
              "max_steps": 2, "learning_rate": 5e-3, "logging_steps": 1, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "adapter": "lora", "lora_dropout": 0.0, "max_checkpoints": 1,
              "precision": "fp32"}
    recipe.update(overrides)
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
