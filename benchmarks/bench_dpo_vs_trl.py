"""DPO throughput: finetune (`method: dpo`, sample packing) vs TRL's DPOTrainer, like for like, in one run.

Same data: 48 conversational preference pairs of varied length ({prompt: [user], chosen: [assistant],
rejected: [assistant]}), built from the quickstart questions: a prompt asks 1-6 of them, chosen answers them,
rejected gives the answers of as many other questions. Same model, same LoRA (r=16, alpha=32, dropout 0.05, all
linear layers), same objective (sigmoid DPO, beta 0.1, reference = the model as it starts: the base with the
fresh adapter off), same optimizer and schedule (AdamW, lr 5e-5 cosine, no warmup, clip 1.0, seed 42), 4 pairs
per optimizer step on average, one epoch, fp32, sdpa attention, no gradient checkpointing, and the same maximum
length on both sides (`sequence_len` = `max_length`, longer than every sequence: nothing is truncated).
Each side tokenizes the conversational records itself with the model's chat template (that is part of its
measured time); the bench prints both sides' response-token counts so the supervised tokens can be compared.

TRL's configuration, chosen for speed on this CPU with the same math:
- `precompute_ref_log_probs=True`, `precompute_ref_batch_size=8`: one no-grad reference pass before training
  instead of a second, adapter-disabled forward of every batch at every step (the same reference log-probs:
  with a fresh LoRA adapter the reference is the base; TRL disables the adapter in both ways). finetune does
  the same (one pass, at the first step). Its time is measured by wrapping `DPOTrainer._precompute_ref_logps`.
- `per_device_train_batch_size=1, gradient_accumulation_steps=4`: 4 pairs per step, each micro batch is one
  pair (chosen + rejected padded to the longer of the two), so the least padding TRL can do; a batch of 4 pads
  8 sequences to the longest of them. SmolLM2, these 48 pairs: 11,060 token slots for 10,712 tokens at batch 1,
  ~13,440 at batch 2, ~15,550 at batch 4 (mean over 20 shuffles); on CPU the cost follows the slots. `--trl-batch 4` (accumulation 1) or `2` measures the others.
- `padding_free=True` is not available: DPOTrainer 1.16 warns that it is "temporarily unavailable after a
  refactor" and falls back to padding, so TRL cannot pack preference pairs.
- `disable_dropout=False`: TRL's default (True) switches the LoRA dropout off, which is different math from
  the requested lora_dropout 0.05 (and ~18% cheaper on CPU: peft's dropout mask); finetune keeps it on.
- `max_length` = finetune's `sequence_len` (TRL's default 1024 would not truncate either), `bf16=False`,
  `gradient_checkpointing=False`, `dtype=float32`, sdpa (TRL's defaults on CPU would be slower and different).
Both sides use TRL's default loss (sigmoid, no label smoothing, no RPO term) and log every step.

finetune: `sample_packing: true`, pairs best-fit packed into rows of 2 x sequence_len tokens (packed by their
length with a prompt per response), `micro_batch_size: 1`, so a step is one row of ~4 pairs (the number of pairs
per step varies with the packing; the steps and pairs per step of both sides are printed). On CPU a pair holds
its prompt once in its row, chosen and rejected after it (the rejected response attending to the prompt and
itself: the same log-probs), so its rows hold fewer tokens than TRL's sequences: each side's `tokens` is what
it computes (finetune: the rows' tokens; TRL: prompt + chosen and prompt + rejected, padding not counted). Its process starts as `finetune train recipe.yml` does (finetune/train/imports.py). Its
reference pass runs inside the training loop at the first step and is recorded in run.json
(`preference.reference_pass_s`); the bench reports the loop without it.

Each side runs in its own fresh process (whole-process wall time measured from outside: imports, model load,
tokenization, reference pass, training, saving the adapter); the order alternates every repeat and the ratios
are taken per repeat. The machine's CPU is shared, so compare ratios, not absolute seconds. Datasets caches
go to a fresh folder per process, so neither side reads the other's or an earlier run's tokenization or
reference log-probs.

Run: python benchmarks/bench_dpo_vs_trl.py [--model smollm2|tiny] [--repeats 2] [--trl-batch 1|2|4]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_vs_trl import ROOT, model_path_for  # noqa: E402  (the same model loading as the SFT bench)

HYPER = {"lr": 5e-5, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "seed": 42, "beta": 0.1}
PAIRS, PAIRS_PER_STEP, SEQUENCE_LEN = 48, 4, 512


def make_pairs(path: Path, n: int = PAIRS, seed: int = 0) -> Path:
    """n conversational pairs: a prompt of 1-6 quickstart questions, chosen = their answers, rejected = the
    answers of as many other questions. Varied lengths (SmolLM2: ~45-215 tokens a sequence)."""
    source = [json.loads(line) for line in (ROOT / "examples/quickstart/data.jsonl").read_text().splitlines()]
    qa = [(r["messages"][i]["content"], r["messages"][i + 1]["content"])
          for r in source for i in range(1, len(r["messages"]) - 1, 2)]
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            k = rng.randint(1, 6)
            picked, other = rng.sample(qa, k), rng.sample(qa, k)
            fh.write(json.dumps({
                "prompt": [{"role": "user", "content": "\n".join(q for q, _ in picked)}],
                "chosen": [{"role": "assistant", "content": " ".join(a for _, a in picked)}],
                "rejected": [{"role": "assistant", "content": " ".join(a for _, a in other)}],
            }) + "\n")
    return path


def finetune_recipe(args, work: Path, **overrides) -> dict:
    """finetune's side of the comparison: `args.model_path`, `args.data`, `args.cache_dir`; its outputs in `work`."""
    return {
        "base_model": args.model_path, "method": "dpo", "rl_beta": HYPER["beta"],
        "adapter": "lora", "lora_r": HYPER["lora_r"], "lora_alpha": HYPER["lora_alpha"],
        "lora_dropout": HYPER["lora_dropout"], "lora_target_modules": "all-linear",
        "datasets": [{"path": args.data, "type": "preference"}], "sequence_len": SEQUENCE_LEN,
        "sample_packing": True, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1,
        "learning_rate": HYPER["lr"], "lr_scheduler": "cosine", "warmup_steps": 0, "seed": HYPER["seed"],
        "precision": "fp32", "attn_implementation": "sdpa", "logging_steps": 1, "report_to": ["none"],
        "output_dir": str(work / "out"),
        "dataset_prepared_path": str(work / "prepared"),  # fresh: tokenization + reference pass are measured
        "cache_dir": args.cache_dir, **overrides,
    }


def worker_finetune(args) -> dict:
    import yaml

    from finetune.recipe import load_recipe
    from finetune.train import run_training
    from finetune.train.imports import skip_unused_libraries

    work = Path(args.work)
    recipe = finetune_recipe(args, work)
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(work / "recipe.yml")
    skip_unused_libraries(loaded)  # as `finetune train recipe.yml` does
    summary = run_training(loaded)
    run = json.loads((work / "out" / "run.json").read_text())
    losses = [e["loss"] for e in summary["log_history"] if "loss" in e]
    train_end = [e for e in summary["log_history"] if "train_loss" in e]
    packing = summary["data"].get("packing", {}).get("train", {})
    return {"steps": summary["steps"], "losses": losses, "mean_loss": train_end[-1]["train_loss"],
            "train_runtime_s": summary["train_runtime_s"],
            "reference_s": run["preference"]["reference_pass_s"],
            # the tokens its rows hold: each prompt once where pairs share it (run.json preference.shared_prompt)
            "rows": packing.get("rows"), "pairs": packing.get("examples"),
            "tokens": run["preference"]["train_tokens_in_rows"], "shared_prompt": run["preference"]["shared_prompt"],
            "packing_efficiency": packing.get("efficiency"),
            "last_metrics": run["preference"]["train_metrics"]}


def worker_trl(args) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    timed = {}
    precompute = DPOTrainer._precompute_ref_logps

    def timed_precompute(self, *a, **kw):  # instrumentation only
        started = time.perf_counter()
        out = precompute(self, *a, **kw)
        timed["reference_s"] = timed.get("reference_s", 0.0) + time.perf_counter() - started
        return out

    DPOTrainer._precompute_ref_logps = timed_precompute
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    dataset = Dataset.from_list(records)  # in memory: nothing read from an earlier run's cache
    batch = args.trl_batch
    config = DPOConfig(
        output_dir=str(Path(args.work) / "out"), num_train_epochs=1,
        per_device_train_batch_size=batch, gradient_accumulation_steps=PAIRS_PER_STEP // batch,
        learning_rate=HYPER["lr"], lr_scheduler_type="cosine", warmup_steps=0, seed=HYPER["seed"],
        beta=HYPER["beta"], max_length=SEQUENCE_LEN, disable_dropout=False,
        precompute_ref_log_probs=True, precompute_ref_batch_size=8,
        logging_steps=1, save_strategy="no", report_to="none",
        bf16=False, fp16=False, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
    )
    peft_config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                             target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=args.model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    train = trainer.train_dataset
    tokens = sum(2 * len(p) + len(c) + len(r)
                 for p, c, r in zip(train["prompt_ids"], train["chosen_ids"], train["rejected_ids"]))
    responses = sum(len(c) + len(r) for c, r in zip(train["chosen_ids"], train["rejected_ids"]))
    result = trainer.train()
    trainer.save_model(str(Path(args.work) / "out"))
    history = trainer.state.log_history
    losses = [e["loss"] for e in history if "loss" in e]
    last = next((e for e in reversed(history) if "rewards/margins" in e), {})
    return {"steps": trainer.state.global_step, "losses": losses, "mean_loss": result.training_loss,
            "train_runtime_s": result.metrics["train_runtime"], "reference_s": timed.get("reference_s"),
            "pairs": len(train), "tokens": tokens, "response_tokens": responses,
            "padding_free": bool(getattr(trainer, "padding_free", False)),
            "attn": trainer.model.config._attn_implementation,
            "last_metrics": {k: v for k, v in last.items() if "/" in k}}


def run_side(side: str, model_path: str, data: Path, cache_dir: str, trl_batch: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-dpo-{side}-"))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
           "--work", str(work), "--cache-dir", cache_dir, "--result", str(out), "--trl-batch", str(trl_batch)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf-datasets"))  # fresh: no reuse across runs
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    (work / "stderr.log").write_text(proc.stderr)  # the side's own log, for a breakdown afterwards
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"], result["log"] = wall, str(work / "stderr.log")
    result["loop_s"] = result["train_runtime_s"] - (result["reference_s"] or 0.0 if side == "finetune" else 0.0)
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
    data = make_pairs(Path(tempfile.mkdtemp(prefix="bench-dpo-data-")) / "pairs.jsonl")
    print(f"model {args.model} ({model_path}); {PAIRS} conversational pairs, {PAIRS_PER_STEP} pairs a step, "
          f"max length {SEQUENCE_LEN}; TRL batch {args.trl_batch} x accumulation {PAIRS_PER_STEP // args.trl_batch}, "
          f"precompute_ref_log_probs; {os.cpu_count()} CPUs (shared), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f}")
    sides, ratios = ["finetune", "trl"], []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]  # alternate who runs first
        results = {side: run_side(side, model_path, data, args.cache_dir, args.trl_batch) for side in order}
        for side in sides:
            r = results[side]
            extra = (f"rows {r['rows']} packing efficiency {r['packing_efficiency']} (of the pairs with a prompt each) "
                     f"shared prompt {r['shared_prompt']}" if side == "finetune"
                     else f"response tokens {r['response_tokens']} padding_free {r['padding_free']} attn {r['attn']}")
            print(f"[{repeat}] {side:8s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s "
                  f"(reference {r['reference_s'] or 0:5.1f} s, loop {r['loop_s']:6.1f} s)  steps {r['steps']:3d}  "
                  f"pairs {r['pairs']} ({r['pairs'] / r['steps']:.2f}/step)  tokens {r['tokens']}  "
                  f"loss first {r['losses'][0]:.4f} last {r['losses'][-1]:.4f} mean {r['mean_loss']:.4f}  {extra}  "
                  f"load {os.getloadavg()[0]:.1f}  log {r['log']}")
        ft, trl = results["finetune"], results["trl"]
        wall, loop = trl["wall_s"] / ft["wall_s"], trl["loop_s"] / ft["loop_s"]
        ref = (trl["reference_s"] / ft["reference_s"]) if ft["reference_s"] and trl["reference_s"] else float("nan")
        ratios.append((wall, loop))
        print(f"[{repeat}] speed-up vs TRL DPOTrainer (TRL / finetune): wall {wall:.2f}x  loop {loop:.2f}x  "
              f"reference pass {ref:.2f}x")
        print(f"[{repeat}] losses, step by step:\n    finetune {' '.join(f'{x:.4f}' for x in ft['losses'])}\n"
              f"    TRL      {' '.join(f'{x:.4f}' for x in trl['losses'])}")
    walls, loops = [w for w, _ in ratios], [lp for _, lp in ratios]
    print(f"speed-up vs TRL over {args.repeats} repeats: wall min {min(walls):.2f}x max {max(walls):.2f}x; "
          f"loop min {min(loops):.2f}x max {max(loops):.2f}x")


if __name__ == "__main__":
    main()
