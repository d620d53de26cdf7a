"""The eval before training of a preference run against the eval after it, on CPU (issue 33, item 3).

Before the fix the eval before training scored the eval split on top of the reference pass over both splits
(5-10x the eval after training in the issue's runs); now it reads the reference table (policy = reference until
the first step). Each `Trainer.evaluate` call and the reference pass are timed in-process, for each method:

    python benchmarks/bench_preference_eval.py [--methods dpo,ipo,kto] [--pairs 160] [--hidden 256]

Run it once on this checkout and once with PYTHONPATH at an older one for the before/after ratios; the model is
a small Llama built in-process (a tiny tokenizer trained locally: tests/tiny.py), nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def build_model(folder: Path, hidden: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_data(folder: Path, pairs: int, method: str) -> dict:
    from tiny import WORDS

    rng = random.Random(0)

    def sentence(lo=8, hi=40):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    rows = []
    for _ in range(pairs):
        prompt, chosen, rejected = sentence(), "yes " + sentence(), "no " + sentence()
        if method == "kto":
            good = rng.random() < 0.5
            rows.append({"prompt": prompt, "completion": chosen if good else rejected, "label": good})
        else:
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    path = folder / f"{method}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"path": path.name, "type": "unpaired" if method == "kto" else "preference"}


def measure(method: str, model: Path, pairs: int, eval_pairs: int) -> dict:
    import yaml

    import finetune.train.preference.reference as reference
    from finetune.recipe import load_recipe
    from finetune.train.preference.trainer import PreferenceTrainer
    from finetune.train.run import run_training

    work = Path(tempfile.mkdtemp(prefix=f"bench_{method}_"))
    recipe = {"base_model": str(model), "method": method, "datasets": [write_data(work, pairs, method)],
              "val_set_size": eval_pairs, "adapter": "lora", "lora_r": 8, "max_steps": 4, "micro_batch_size": 4,
              "learning_rate": 1e-4, "sequence_len": 256, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "logging_steps": 1, "precision": "fp32"}
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    evals, passes = [], []
    real_evaluate, real_table = PreferenceTrainer.evaluate, reference.compute_table

    def evaluate(self, *args, **kwargs):
        started = time.perf_counter()
        out = real_evaluate(self, *args, **kwargs)
        evals.append(time.perf_counter() - started)
        return out

    def compute_table(*args, **kwargs):
        started = time.perf_counter()
        out = real_table(*args, **kwargs)
        passes.append(time.perf_counter() - started)
        return out

    PreferenceTrainer.evaluate, reference.compute_table = evaluate, compute_table
    try:
        summary = run_training(load_recipe(work / "recipe.yml"))
    finally:
        PreferenceTrainer.evaluate, reference.compute_table = real_evaluate, real_table
    return {"method": method, "eval_before_s": evals[0], "eval_after_s": evals[-1],
            "reference_pass_s": passes[0] if passes else None, "ratio_before_after": evals[0] / evals[-1],
            "eval_before_without_pass_s": evals[0] - (passes[0] if passes else 0.0),
            "tokens_per_second": summary["throughput"].get("tokens_per_second"),
            "finetune": __import__("finetune").__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="dpo,ipo,kto")
    parser.add_argument("--pairs", type=int, default=160, help="records in all (train + eval)")
    parser.add_argument("--eval-pairs", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    model = build_model(Path(tempfile.mkdtemp(prefix="bench_model_")) / "model", args.hidden)
    for method in args.methods.split(","):
        print(json.dumps(measure(method, model, args.pairs, args.eval_pairs)), flush=True)


if __name__ == "__main__":
    main()
