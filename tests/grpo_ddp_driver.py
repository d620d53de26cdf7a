"""One GRPO training under a launcher (torchrun) or in-process, with generation replaced by a fixed function of each
prompt, so that one process and two draw the same completions (sampling depends on the batch a process generates,
and the processes split the batch): what is left to compare is everything after generation, the sampler's split,
the rewards, the advantages, the step's normalizer over both processes and DDP's gradient average.

    torchrun --nproc_per_node 2 tests/grpo_ddp_driver.py RECIPE OUT_JSON [KEY=VALUE ...]
"""

from __future__ import annotations

import json
import os
import sys


def fixed_completions(model, prompt_ids, num_generations, max_completion_length, *, seed, eos_ids, pad_id, **kw):
    """Completion j of a prompt: tokens drawn from a generator seeded by the prompt's ids and j (never by the step,
    the process or the batch), 2 to max_completion_length long, the last one EOS half of the time."""
    import torch

    from finetune.train.grpo.generation import Completions

    vocab = model.config.vocab_size
    ids, truncated = [], []
    for prompt in prompt_ids:
        for j in range(num_generations):
            gen = torch.Generator().manual_seed(hash((tuple(prompt), j)) % (2 ** 31))
            length = int(torch.randint(2, max_completion_length + 1, (1,), generator=gen))
            tokens = torch.randint(3, vocab, (length,), generator=gen).tolist()
            ended = bool(torch.randint(0, 2, (1,), generator=gen))
            if ended:
                tokens[-1] = eos_ids[0]
            ids.append(tokens)
            truncated.append(not ended and length == max_completion_length)
    return Completions(ids=ids, is_truncated=truncated, num_generations=num_generations)


def train(recipe_path: str, overrides: list[str]) -> dict:
    import finetune.train.grpo.generation as generation
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    real = generation.generate_completions
    generation.generate_completions = fixed_completions
    try:
        summary = run_training(load_recipe(recipe_path, overrides))
    finally:  # in-process (the one-process side of the test): later tests in this worker generate for real
        generation.generate_completions = real
    return {"rewards": [e["reward"] for e in summary["log_history"] if "reward" in e], "steps": summary["steps"],
            "world_size": summary["plan"]["world_size"]}


def main() -> int:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    recipe_path, out, *overrides = sys.argv[1:]
    result = train(recipe_path, overrides)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
