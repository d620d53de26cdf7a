"""Reward-model training throughput: finetune (`method: reward`, sample packing) vs TRL 1.16's RewardTrainer, like
for like, in one run.

Same data: the DPO bench's 48 conversational pairs (benchmarks/bench_dpo_vs_trl.py: a prompt asks 1-6 quickstart
questions, chosen answers them, rejected gives the answers of as many other questions). Same model, as its
sequence-classification class with one output (a new score head); same LoRA (r=16, alpha=32, dropout 0.05, all
linear layers, the score head trained in full: `modules_to_save`); same objective (-log sigmoid(r_chosen -
r_rejected), no margin, no centering); same optimizer and schedule (AdamW, lr 1e-4 cosine, no warmup, clip 1.0,
seed 42), 4 pairs per optimizer step on average, one epoch, fp32, sdpa attention, no gradient checkpointing, and
the same maximum length on both sides (`sequence_len` = `max_length`, longer than every sequence: nothing is cut).
Each side tokenizes the conversational records itself with the model's chat template (part of its measured time).

TRL's configuration, its fastest on this CPU with the same math:
- `per_device_train_batch_size=1, gradient_accumulation_steps=4`: a micro batch is one pair, chosen and rejected
  padded to the longer of the two (the least padding TRL's DataCollatorForPreference can do; `--trl-batch 2|4`
  measures more pairs a micro batch, padded to their longest). TRL has no packing for reward models.
- `disable_dropout=False`: TRL's default (True) switches the LoRA dropout off, other math than the requested 0.05.
- `max_length` = finetune's `sequence_len`, `bf16=False`, `gradient_checkpointing=False`, fp32, sdpa.

finetune: `sample_packing: true`, pairs best-fit packed into rows of 2 x sequence_len tokens, `micro_batch_size: 1`,
so a step is one row of ~4 pairs (the pairs per step vary with the packing; both sides' steps are printed). On CPU a
pair holds its prompt once in its row, chosen and rejected after it (the rejected response attending to the prompt
and itself: the same scores), so its rows hold fewer tokens than TRL's sequences; each side's `tokens` is what it
computes (finetune: the rows' tokens; TRL: prompt + chosen and prompt + rejected, padding not counted). Its process
starts as `finetune train recipe.yml` does (finetune/train/imports.py).

Each side runs in its own fresh process (whole-process wall time measured from outside: imports, model load,
tokenization, training, saving the adapter with its score head); the order alternates every repeat and the ratios
are taken per repeat. The machine's CPU is shared, so compare ratios, not absolute seconds.

Run: python benchmarks/bench_reward_vs_trl.py [--model smollm2|tiny] [--repeats 2] [--trl-batch 1|2|4]
Needs: pip install 'finetune[bench]' (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dpo_vs_trl import PAIRS, PAIRS_PER_STEP, SEQUENCE_LEN, make_pairs  # noqa: E402  (the same pairs)
from bench_train_vs_trl import model_path_for  # noqa: E402  (the same model loading as the SFT bench)

HYPER = {"lr": 1e-4, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "seed": 42}


def worker_finetune(args) -> dict:
    import yaml

    from finetune.recipe import load_recipe
    from finetune.train import run_training
    from finetune.train.imports import skip_unused_libraries

    work = Path(args.work)
    recipe = {
        "base_model": args.model_path, "method": "reward",
        "adapter": "lora", "lora_r": HYPER["lora_r"], "lora_alpha": HYPER["lora_alpha"],
        "lora_dropout": HYPER["lora_dropout"], "lora_target_modules": "all-linear",
        "datasets": [{"path": args.data, "type": "preference"}], "sequence_len": SEQUENCE_LEN,
        "sample_packing": True, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1,
        "val_set_size": 0, "learning_rate": HYPER["lr"], "lr_scheduler": "cosine", "warmup_steps": 0,
        "seed": HYPER["seed"], "precision": "fp32", "attn_implementation": "sdpa", "logging_steps": 1,
        "report_to": ["none"], "output_dir": str(work / "out"),
        "dataset_prepared_path": str(work / "prepared"),  # fresh: tokenization is measured
        "cache_dir": args.cache_dir,
    }
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(work / "recipe.yml")
    skip_unused_libraries(loaded)  # as `finetune train recipe.yml` does
    summary = run_training(loaded)
    run = json.loads((work / "out" / "run.json").read_text())
    packing = summary["data"].get("packing", {}).get("train", {})
    shared = run["reward"]["shared_prompt"]
    train = summary["data"]["train"]
    prompts = train["tokens"] - train["supervised_tokens"]  # a prompt per response
    return {"steps": summary["steps"], "losses": [e["loss"] for e in summary["log_history"] if "loss" in e],
            "mean_loss": next(e["train_loss"] for e in summary["log_history"] if "train_loss" in e),
            "train_runtime_s": summary["train_runtime_s"], "rows": packing.get("rows"),
            "pairs": packing.get("examples"), "packing_efficiency": packing.get("efficiency"),
            "tokens": train["tokens"] - (prompts // 2 if shared else 0), "shared_prompt": shared,
            "last_metrics": run["reward"]["train_metrics"]}


def worker_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    batch = args.trl_batch
    config = RewardConfig(
        output_dir=str(Path(args.work) / "out"), num_train_epochs=1, per_device_train_batch_size=batch,
        gradient_accumulation_steps=PAIRS_PER_STEP // batch, learning_rate=HYPER["lr"], lr_scheduler_type="cosine",
        warmup_steps=0, seed=HYPER["seed"], max_length=SEQUENCE_LEN, disable_dropout=False, logging_steps=1,
        save_strategy="no", report_to="none", bf16=False, fp16=False, gradient_checkpointing=False)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_path, num_labels=1, dtype=torch.float32,
                                                               attn_implementation="sdpa")
    lora = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                      target_modules="all-linear", task_type="SEQ_CLS", modules_to_save=["score"])
    trainer = RewardTrainer(model=model, args=config, train_dataset=Dataset.from_list(records),
                            processing_class=tokenizer, peft_config=lora)
    train = trainer.train_dataset
    tokens = sum(len(c) + len(r) for c, r in zip(train["chosen_ids"], train["rejected_ids"]))
    result = trainer.train()
    trainer.save_model(str(Path(args.work) / "out"))
    history = trainer.state.log_history
    return {"steps": trainer.state.global_step, "losses": [e["loss"] for e in history if "loss" in e],
            "mean_loss": result.training_loss, "train_runtime_s": result.metrics["train_runtime"],
            "pairs": len(train), "tokens": tokens,
            "last_metrics": {k: v for k, v in history[-2].items() if k in ("accuracy", "margin", "mean_reward")}}


def run_side(side: str, model_path: str, data: Path, cache_dir: str, trl_batch: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-reward-{side}-"))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
           "--work", str(work), "--cache-dir", cache_dir, "--result", str(out), "--trl-batch", str(trl_batch)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf-datasets"))  # fresh: no reuse across runs
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"], result["log"] = wall, str(work / "stderr.log")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trl-batch", type=int, choices=[1, 2, 4], default=1,
                        help="TRL's pairs per micro batch (gradient accumulation makes up 4 pairs a step)")
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
        result = {"finetune": worker_finetune, "trl": worker_trl}[args.worker](args)
        Path(args.result).write_text(json.dumps(result))
        return
    model_path = model_path_for(args.model, args.cache_dir)
    data = make_pairs(Path(tempfile.mkdtemp(prefix="bench-reward-data-")) / "pairs.jsonl")
    print(f"model {args.model} ({model_path}); {PAIRS} conversational pairs, {PAIRS_PER_STEP} pairs a step, max length "
          f"{SEQUENCE_LEN}; TRL batch {args.trl_batch} x accumulation {PAIRS_PER_STEP // args.trl_batch}; "
          f"{os.cpu_count()} CPUs (shared), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load "
          f"{os.getloadavg()[0]:.1f}")
    sides, ratios = ["finetune", "trl"], []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]  # alternate who runs first
        results = {side: run_side(side, model_path, data, args.cache_dir, args.trl_batch) for side in order}
        for side in sides:
            r = results[side]
            extra = (f"rows {r['rows']} packing efficiency {r['packing_efficiency']} shared prompt {r['shared_prompt']}"
                     if side == "finetune" else "")
            print(f"[{repeat}] {side:8s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s  steps "
                  f"{r['steps']:3d}  pairs {r['pairs']} ({r['pairs'] / r['steps']:.2f}/step)  tokens {r['tokens']}  "
                  f"loss first {r['losses'][0]:.4f} last {r['losses'][-1]:.4f} mean {r['mean_loss']:.4f}  "
                  f"last metrics {r['last_metrics']}  {extra}  load {os.getloadavg()[0]:.1f}  log {r['log']}")
        ft, trl = results["finetune"], results["trl"]
        wall, loop = trl["wall_s"] / ft["wall_s"], trl["train_runtime_s"] / ft["train_runtime_s"]
        ratios.append((wall, loop))
        print(f"[{repeat}] speed-up vs TRL RewardTrainer (TRL / finetune): wall {wall:.2f}x  training loop {loop:.2f}x")
    walls, loops = [w for w, _ in ratios], [lp for _, lp in ratios]
    print(f"speed-up vs TRL over {args.repeats} repeats: wall min {min(walls):.2f}x max {max(walls):.2f}x; "
          f"loop min {min(loops):.2f}x max {max(loops):.2f}x")


if __name__ == "__main__":
    main()
