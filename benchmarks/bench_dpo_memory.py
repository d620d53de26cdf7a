"""DPO peak memory: finetune (`method: dpo`, packed rows) vs TRL's DPOTrainer on the same pairs, like for like.

The same 48 conversational pairs as benchmarks/bench_dpo_vs_trl.py (SmolLM2-135M-Instruct, LoRA r=16 on all linear
layers, dropout 0.05, fp32, sdpa, no gradient checkpointing, sigmoid DPO, precomputed reference log-probs on both
sides). finetune as a new user set it: `sequence_len: 1024` (rows of 2 x 1,024 tokens with packing) and
`micro_batch_size: 2`, so a micro batch is two packed rows. TRL is given micro batches of the same size in token
slots: its batch of B pairs pads chosen and rejected to the batch's longest sequence, so B is the smallest whose
mean padded slots (over 200 shuffles of these pairs) reach finetune's mean tokens a micro batch; `--trl-batch`
sets B by hand (1: TRL's least memory, a pair at a time).

Each side runs in a fresh process for `--steps` optimizer steps (one micro batch each) and reports its peak
resident set (ru_maxrss, the whole process: Python, libraries, model, data, reference pass, training), and a
sampler thread's peak per phase (before training: load, tokenization, probes; the reference pass; each step), so
a difference can be placed. After each step it also reads glibc's heap (mallinfo2, Linux): the bytes malloc hands out
(live: tensors, Python) against the free bytes it holds without giving them back, which the resident set counts too.
Memory does not depend on the machine's load; run with OMP_NUM_THREADS=2 (threads
keep per-thread buffers) and nothing else large running.

Run: python benchmarks/bench_dpo_memory.py [--steps 2] [--micro-batch 2] [--trl-batch B] [--sides finetune,trl]
     MALLOC_MMAP_THRESHOLD_=1048576 python benchmarks/bench_dpo_memory.py ...   (glibc: blocks >= 1 MiB mmapped)
Needs: pip install 'finetune[bench]' (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dpo_vs_trl import HYPER, finetune_recipe, make_pairs  # noqa: E402  (the same pairs and settings)
from bench_train_vs_trl import model_path_for  # noqa: E402

SEQUENCE_LEN, MICRO_BATCH = 1024, 2  # finetune: rows of 2 x sequence_len, two rows a micro batch


class Sampler:
    """Peak VmRSS per phase, sampled every 10 ms (ru_maxrss gives the whole process's peak only). Over `limit_mib`
    the process stops (exit 3): the machine is shared, and a side that outgrows it would take others down."""

    def __init__(self, limit_mib: float):
        self.phase, self.peaks, self._stop, self.limit = "start", {}, threading.Event(), limit_mib
        self.heap = {}  # "after step N" -> heap_gib()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.is_set():
            rss = _rss_mib()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)
            if rss > self.limit:
                print(f"over the limit: {rss / 1024:.1f} GiB in phase {self.phase!r} (--max-rss-gib)", file=sys.stderr)
                os._exit(3)
            time.sleep(0.01)

    def set(self, phase: str) -> None:
        rss = _rss_mib()
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)
        self.phase = phase

    def phase_of(self, cls, method: str, phase: str) -> None:
        """Instrumentation only: `cls.method` runs as its own phase."""
        original = getattr(cls, method)

        def wrapped(obj, *args, **kwargs):
            before = self.phase
            self.set(phase)
            try:
                return original(obj, *args, **kwargs)
            finally:
                self.set(before)

        setattr(cls, method, wrapped)

    def stop(self) -> dict:
        self._stop.set()
        return self.peaks


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def heap_gib() -> dict | None:
    """glibc's heap over every arena (mallinfo2): `in_use` (what malloc has handed out and not had back) and
    `held_free` (freed, kept in its arenas: still resident), in GiB; None off glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    mallinfo2.restype = Mallinfo2
    info = mallinfo2()
    return {"in_use": round((info.uordblks + info.hblkhd) / 2**30, 2), "held_free": round(info.fordblks / 2**30, 2)}


def _phase_callback(sampler):
    from transformers import TrainerCallback

    class Phases(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sampler.set(f"step {state.global_step + 1}")

        def on_step_end(self, args, state, control, **kwargs):
            sampler.set("between steps")
            sampler.heap[f"after step {state.global_step}"] = heap_gib()

    return Phases()


def worker_finetune(args, sampler) -> dict:
    import yaml

    from finetune.recipe import load_recipe
    from finetune.train import run_training
    from finetune.train.imports import skip_unused_libraries
    from finetune.train.preference import trainer as preference_trainer

    work = Path(args.work)
    recipe = finetune_recipe(args, work, sequence_len=SEQUENCE_LEN, micro_batch_size=args.micro_batch,
                             max_steps=args.steps, gradient_checkpointing="off")
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(work / "recipe.yml")
    skip_unused_libraries(loaded)  # as `finetune train recipe.yml` does
    sampler.phase_of(preference_trainer.PreferenceTrainer, "_reference_table", "reference pass")
    summary = run_training(loaded, extra_callbacks=[_phase_callback(sampler)])
    run = json.loads((work / "out" / "run.json").read_text())
    packing = summary["data"].get("packing", {}).get("train", {})
    return {"steps": summary["steps"], "rows": packing.get("rows"), "pairs": packing.get("examples"),
            "tokens": run["preference"]["train_tokens_in_rows"],
            "tokens_per_micro_batch": run["preference"]["train_tokens_in_rows"] / max(1, (packing.get("rows") or 1))
            * args.micro_batch, "losses": [e["loss"] for e in summary["log_history"] if "loss" in e]}


def trl_slots(tokenizer, records, batch: int, shuffles: int = 200) -> float:
    """Mean token slots of TRL's micro batch of `batch` pairs: 2 x batch x the batch's longest prompt + response."""
    def length(messages) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    lengths = [max(length(r["prompt"] + r["chosen"]), length(r["prompt"] + r["rejected"])) for r in records]
    rng, slots = random.Random(0), []
    for _ in range(shuffles):
        order = lengths[:]
        rng.shuffle(order)
        slots += [2 * len(order[i:i + batch]) * max(order[i:i + batch]) for i in range(0, len(order), batch)]
    return statistics.mean(slots)


def worker_trl(args, sampler) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    sampler.phase_of(DPOTrainer, "_precompute_ref_logps", "reference pass")
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    config = DPOConfig(
        output_dir=str(Path(args.work) / "out"), max_steps=args.steps,
        per_device_train_batch_size=args.trl_batch, gradient_accumulation_steps=1,
        learning_rate=HYPER["lr"], lr_scheduler_type="cosine", warmup_steps=0, seed=HYPER["seed"],
        beta=HYPER["beta"], max_length=SEQUENCE_LEN, disable_dropout=False,
        precompute_ref_log_probs=True, precompute_ref_batch_size=args.trl_batch,
        logging_steps=1, save_strategy="no", report_to="none",
        bf16=False, fp16=False, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
    )
    peft_config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                             target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=args.model_path, args=config, train_dataset=Dataset.from_list(records),
                         processing_class=tokenizer, peft_config=peft_config, callbacks=[_phase_callback(sampler)])
    trainer.train()
    history = trainer.state.log_history
    return {"steps": trainer.state.global_step, "pairs_per_step": args.trl_batch,
            "slots_per_micro_batch": trl_slots(tokenizer, records, args.trl_batch),
            "losses": [e["loss"] for e in history if "loss" in e]}


def run_side(side: str, args, model_path: str, data: Path, trl_batch: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-dpo-mem-{side}-"))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
           "--work", str(work), "--cache-dir", args.cache_dir, "--result", str(out), "--steps", str(args.steps),
           "--trl-batch", str(trl_batch), "--max-rss-gib", str(args.max_rss_gib),
           "--micro-batch", str(args.micro_batch)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf-datasets"))
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"], result["log"] = time.perf_counter() - started, str(work / "stderr.log")
    return result


def matched_trl_batch(model_path: str, data: Path, finetune_tokens: float) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    records = [json.loads(line) for line in data.read_text().splitlines()]
    for batch in range(1, len(records) + 1):
        if trl_slots(tokenizer, records, batch, shuffles=50) >= finetune_tokens:
            return batch
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="finetune's packed rows a micro batch")
    parser.add_argument("--trl-batch", type=int, default=0, help="TRL's pairs a micro batch (0: matched in tokens)")
    parser.add_argument("--sides", default="finetune,trl")
    parser.add_argument("--max-rss-gib", type=float, default=15.0, help="stop a side whose resident size passes this")
    parser.add_argument("--cache-dir", default=os.environ.get("FINETUNE_CACHE_DIR")
                        or os.path.expanduser("~/.cache/finetune"))
    for name in ("--worker", "--model-path", "--data", "--work", "--result"):  # a side's process (run_side)
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        sampler = Sampler(args.max_rss_gib * 1024)
        result = {"finetune": worker_finetune, "trl": worker_trl}[args.worker](args, sampler)
        result["phases_mib"], result["heap_gib"] = sampler.stop(), sampler.heap
        result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.result).write_text(json.dumps(result))
        return
    model_path = model_path_for("smollm2", args.cache_dir)
    data = make_pairs(Path(tempfile.mkdtemp(prefix="bench-dpo-mem-data-")) / "pairs.jsonl")
    print(f"SmolLM2-135M-Instruct, 48 pairs, {args.steps} steps; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for side in args.sides.split(","):
        trl_batch = args.trl_batch
        if side == "trl" and not trl_batch:
            tokens = results.get("finetune", {}).get("tokens_per_micro_batch") or 4096
            trl_batch = matched_trl_batch(model_path, data, tokens)
        results[side] = r = run_side(side, args, model_path, data, trl_batch)
        phases = ", ".join(f"{k} {v / 1024:.2f}" for k, v in r["phases_mib"].items())
        size = (f"{r['tokens_per_micro_batch']:.0f} tokens a micro batch ({r['rows']} rows, {r['pairs']} pairs)"
                if side == "finetune" else
                f"batch {r['pairs_per_step']} pairs, {r['slots_per_micro_batch']:.0f} token slots a micro batch")
        print(f"{side:8s} peak RSS {r['peak_mib'] / 1024:.2f} GiB  {size}  steps {r['steps']}  wall {r['wall_s']:.0f} s  "
              f"load {os.getloadavg()[0]:.1f}\n    phase peaks (GiB): {phases}\n    losses {r['losses']}  "
              f"log {r['log']}", flush=True)
        if any(r["heap_gib"].values()):
            print("    glibc heap (GiB, in use / held free): " + ", ".join(
                f"{k} {v['in_use']} / {v['held_free']}" for k, v in r["heap_gib"].items() if v), flush=True)
    if len(results) == 2:
        print(f"finetune / TRL peak: {results['finetune']['peak_mib'] / results['trl']['peak_mib']:.2f}x")


if __name__ == "__main__":
    main()
