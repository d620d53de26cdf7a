"""Run several trainings one after another inside ONE multi-process launch (tests/test_distributed.py).

    torchrun --nproc_per_node 2 tests/multiproc_driver.py RECIPE RESULTS_DIR NAME=KEY=VALUE,KEY=VALUE ...

Starting processes costs ~10-20 s each on a small shared CPU (imports), training the tiny model under a
second, so the tests pay the start once. Each run is what `python -m finetune.train RECIPE --set ...` does
in a launched process: load_recipe with WORLD_SIZE from the launcher, then run_training. Each rank writes
RESULTS_DIR/rank{R}.json: per run, the logged losses, how many times this rank tokenized the data and, for a
preference run, its reference pass, or the message of a run that was refused. FINETUNE_TEST_CHUNK_LOGITS=N:
the LM head's chunks (SFT and preference) hold N logits.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    recipe_path, results_dir, *runs = sys.argv[1:]
    import finetune.data as data
    from finetune.errors import FinetuneError
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    calls = {"n": 0}
    tokenize_all = data.tokenize_all

    def counting_tokenize_all(*args, **kwargs):  # a test probe: does this rank tokenize, or read the cache?
        calls["n"] += 1
        return tokenize_all(*args, **kwargs)

    data.tokenize_all = counting_tokenize_all
    if os.environ.get("FINETUNE_TEST_CHUNK_LOGITS"):  # LM-head chunks of a few rows, as a large vocabulary
        import finetune.model.sequence_logps as logps  # makes them, on the tiny model's 512 tokens
        import finetune.model.supervised_logits as supervised

        logps.CHUNK_LOGITS = supervised.CHUNK_LOGITS = int(os.environ["FINETUNE_TEST_CHUNK_LOGITS"])
    results = {}
    for run in runs:
        name, _, overrides = run.partition("=")
        calls["n"] = 0
        try:
            summary = run_training(load_recipe(recipe_path, [o for o in overrides.split(",") if o]))
        except FinetuneError as refused:  # a run the test expects to be refused (on every process)
            results[name] = {"error": str(refused), "exit_code": refused.exit_code}
            continue
        results[name] = {
            "losses": [[e["step"], e["loss"]] for e in summary["log_history"] if "loss" in e],
            "tokenize_calls": calls["n"],
            "steps": summary["steps"],
            "world_size": summary["plan"]["world_size"],
            "resumed_from": summary.get("resumed_from"),
            # preference runs: seconds of the reference pass (None: read from the cache), where the table is, how
            # many items the run reads and how many of them its pass scored
            "reference": {k: summary["preference"][k] for k in ("reference_pass_s", "reference_table",
                                                                 "reference_items")}
            if "preference" in summary else None,
        }
    rank = int(os.environ["RANK"])
    Path(results_dir, f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
