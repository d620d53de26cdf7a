"""GPU training speed: finetune vs TRL's SFTTrainer at its best, like for like, on random-init Llama shapes.

Needs no hub: the models are built from a config (random weights; speed does not depend on their values), the
data is made from examples/quickstart/data.jsonl, the tokenizer is the tests' tiny BPE one (or `--tokenizer
DIR`) and the model's vocabulary is 49,152 (SmolLM2's) so the LM head and loss cost what a real one does.

    1b-full    TinyLlama shape (22 layers, hidden 2048, GQA 32/4; 1.1B + the 49k head), full fine-tune,
               bf16 autocast over fp32 weights, seq 4096 packed, micro batch 2, adamw_torch_fused, lr 1e-5
    7b-qlora   Llama-2-7B shape (32 layers, hidden 4096), QLoRA NF4 + double quant, r16 alpha 32 all-linear,
               seq 2048 packed, micro batch 1 x 4 accumulation, paged_adamw_8bit, full checkpointing

TRL runs its best configuration, not its defaults: its own packing (`packing=True`, best-fit decreasing) and
padding-free batches where its version has them, flash-attn when installed, else sdpa (`--trl-attention
flex_attention` tries transformers' flex path for it too: its padding-free rows carry position_ids, from
which transformers builds the same document mask finetune's flex path uses), the same optimizer, precision,
learning rate and seed. finetune runs as a user gets it (`attn_implementation: auto`, `compile: auto`); the
table names each side's attention. Neither side writes a checkpoint inside the timed loop. Both sides
train on the same tokens: TRL gets finetune's tokenization as `input_ids` + `completion_mask` (assistant
turns only), so the supervised targets match.
Each side runs in its own fresh process; the order alternates per repeat; the ratio is taken per repeat.

    python benchmarks/bench_gpu.py --out bench-gpu/                     # both scenarios on the GPU
    python benchmarks/bench_gpu.py --scenario 1b-full --repeats 2 --out bench-gpu/
    python benchmarks/bench_gpu.py --tiny --out /tmp/bench-smoke        # CPU smoke run, seconds

Writes OUT/results.json and OUT/results.md (a table; the machine is named in it). Needs `finetune[bench]` (trl)
for the TRL side; without it the TRL rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
VOCAB = 49_152  # SmolLM2's vocabulary: the LM head and cross-entropy of a real small model

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}
SCENARIOS = {
    "1b-full": dict(shape="1b", adapter="none", seq=4096, mbs=2, accumulation=1, lr=1e-5, scheduler="constant",
                    optimizer="adamw_torch_fused", checkpointing="off", examples=4000, max_steps=None),
    "7b-qlora": dict(shape="7b", adapter="qlora", seq=2048, mbs=1, accumulation=4, lr=2e-4, scheduler="constant",
                     optimizer="paged_adamw_8bit", checkpointing="full", examples=1000, max_steps=20),
}
LORA = dict(r=16, alpha=32, dropout=0.05)
SEED = 42


def tiny(scenario: dict) -> dict:
    """The same scenario at a size a CPU runs in seconds: fp32, plain AdamW, 6 steps of 256-token rows."""
    return {**scenario, "shape": "tiny", "seq": 256, "examples": 48, "max_steps": 6, "optimizer": "adamw_torch",
            "checkpointing": "off", "vocab": 512, "logging_steps": 1}


def build_model(shape: str, vocab: int, tokenizer_dir: str | None, out: Path) -> Path:
    """A random-init Llama of `shape` with `vocab` rows, saved in bf16 (fp32 for tiny) with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tiny import build_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else build_tokenizer()
    config = LlamaConfig(vocab_size=max(vocab, len(tokenizer)), max_position_embeddings=8192, rope_theta=10000.0,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config)
    if shape != "tiny":
        model = model.to(torch.bfloat16)  # half the disk; finetune and TRL load it in the dtype they train in
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the timed runs are child processes: this one keeps no GPU memory
    return out


def attention() -> str:
    """TRL's attention by default: flash-attn's kernels when installed (its padding-free path is documented for
    them), else sdpa. finetune uses its own `attn_implementation: auto` choice (flash-attn, else flex_attention
    for packed rows on CUDA) and compiles its layers (`compile: auto`); each row of the table names both."""
    import importlib.util

    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def peak_memory_gib() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: peak RSS


def worker_finetune(s: dict, args) -> dict:
    import yaml

    import finetune.data.collate as collate_module
    import finetune.model.isolation as isolation
    from bench_train_vs_trl import Counter
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    counters, original, guard = [], collate_module.Collator, isolation.guard_packing

    def counting(*a, **kw):
        counters.append(Counter(original(*a, **kw)))
        return counters[-1]

    def guard_then_reset(model, collator, attn):  # the isolation probe's batch is not training data
        leak = guard(model, collator, attn)
        collator.slots = collator.real = collator.supervised = 0
        return leak

    collate_module.Collator, isolation.guard_packing = counting, guard_then_reset  # instrumentation only
    work = Path(args.work)
    recipe = {
        "base_model": args.model_path, "adapter": s["adapter"], "datasets": [{"path": args.data, "type": "chat"}],
        "sequence_len": s["seq"], "sample_packing": True, "micro_batch_size": s["mbs"],
        "gradient_accumulation_steps": s["accumulation"], "num_epochs": 1, "learning_rate": s["lr"],
        "lr_scheduler": s["scheduler"], "warmup_steps": 0, "seed": SEED, "optimizer": s["optimizer"],
        "precision": "bf16" if _cuda() else "fp32", "gradient_checkpointing": s["checkpointing"],
        "logging_steps": s.get("logging_steps", 10), "report_to": ["none"], "output_dir": str(work / "out"),
        "dataset_prepared_path": str(work / "prepared"), "resume": False,
        # no checkpoint inside the timed loop (the default writes one at the epoch's end: ~13 GB of fp32
        # weights + Adam states for the 1B), as TRL runs with save_strategy="no"
        "checkpoint_interval": 10**9,
    }
    if s["max_steps"]:
        recipe["max_steps"] = s["max_steps"]
    if s["adapter"] != "none":
        recipe.update(lora_r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      lora_target_modules="all-linear")
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    summary = run_training(load_recipe(work / "recipe.yml"))
    counter, numbers = counters[-1], summary["throughput"]
    return {"steps": summary["steps"], "train_runtime_s": summary["train_runtime_s"], "real": counter.real,
            "slots": counter.slots, "supervised": counter.supervised, "final_loss": summary["final_train_loss"],
            "peak_gib": peak_memory_gib(), "planned_gib": (numbers.get("planned_memory_gib") or {}).get("peak_allocated_gib"),
            "mfu": numbers.get("mfu"), "steady_mfu": numbers.get("steady_mfu"),
            "steady_tokens_per_second": numbers.get("steady_tokens_per_second"),
            "attention": summary["attn_implementation"], "compile": summary["compile"]}


def worker_trl(s: dict, args) -> dict:
    import dataclasses

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    from bench_train_vs_trl import Counter
    from finetune.data.encode import encode_batch
    from finetune.ingest.records import read_records

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    examples = encode_batch(tokenizer, list(read_records(args.data, "chat")), False)  # the same labels as ours
    examples = [e for e in examples if len(e.input_ids) <= s["seq"]]  # what finetune keeps (it drops longer ones)
    dataset = Dataset.from_dict({"input_ids": [e.input_ids for e in examples],
                                 "completion_mask": [[int(t != -100) for t in e.labels] for e in examples]})
    fields = {f.name for f in dataclasses.fields(SFTConfig)}
    best = {k: v for k, v in {"padding_free": True, "completion_only_loss": True}.items() if k in fields}
    cuda = _cuda()
    init = {"dtype": torch.float32 if s["adapter"] == "none" else torch.bfloat16,
            "attn_implementation": args.trl_attention or attention()}
    if not cuda:
        init["dtype"] = torch.float32
    if s["adapter"] == "qlora":
        init["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if cuda else torch.float32)
    config = SFTConfig(
        output_dir=str(Path(args.work) / "out"), per_device_train_batch_size=s["mbs"],
        gradient_accumulation_steps=s["accumulation"], num_train_epochs=1, max_steps=s["max_steps"] or -1,
        learning_rate=s["lr"], lr_scheduler_type=s["scheduler"], warmup_steps=0, seed=SEED, optim=s["optimizer"],
        bf16=cuda, gradient_checkpointing=s["checkpointing"] == "full", max_length=s["seq"], packing=True,
        logging_steps=s.get("logging_steps", 10), save_strategy="no", report_to="none", model_init_kwargs=init, **best)
    peft_config = None
    if s["adapter"] != "none":
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=args.model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    counter = Counter(trainer.data_collator)
    trainer.data_collator = counter
    result = trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"steps": trainer.state.global_step, "train_runtime_s": result.metrics["train_runtime"],
            "real": counter.real, "slots": counter.slots, "supervised": counter.supervised,
            "final_loss": losses[-1] if losses else None, "peak_gib": peak_memory_gib(), "settings": best,
            "attention": init["attn_implementation"], "compile": False}


def run_side(side: str, scenario: str, s: dict, model_path: Path, data: Path, trl_attention: str | None) -> dict:
    if side == "trl":
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            return {"skipped": "trl is not installed (pip install 'finetune[bench]')"}
    work = Path(tempfile.mkdtemp(prefix=f"bench-gpu-{side}-"))
    result_path = work / "result.json"
    started = time.perf_counter()
    command = [sys.executable, __file__, "--worker", side, "--settings", json.dumps(s), "--model-path",
               str(model_path), "--data", str(data), "--work", str(work), "--result", str(result_path)]
    if trl_attention:
        command += ["--trl-attention", trl_attention]
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    result = json.loads(result_path.read_text()) if proc.returncode == 0 else {"failed": proc.stderr[-3000:]}
    shutil.rmtree(work, ignore_errors=True)  # a 1B full fine-tune's output is GBs; the disk is not endless
    if "failed" in result:
        return result
    result["wall_s"] = wall
    result["tokens_per_second"] = result["real"] / result["train_runtime_s"]  # real tokens through the loop
    return result


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), torch {torch.__version__}"


def markdown(report: dict) -> str:
    lines = [f"Machine: {report['machine']}.", "",
             "| scenario | repeat | side | attention (compiled) | steps | real tokens | supervised | loop s | wall s | "
             "real tokens/s | finetune / TRL | peak GiB | plan GiB | MFU steady | final loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["runs"]:
        r = row["result"]
        if "skipped" in r or "failed" in r:
            why = r.get("skipped") or "failed: " + r["failed"].strip().splitlines()[-1][:120]
            lines.append(f"| {row['scenario']} | {row['repeat']} | {row['side']} | {why} |" + " |" * 11)
            continue
        fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) else "-"  # noqa: E731
        lines.append(
            f"| {row['scenario']} | {row['repeat']} | {row['side']} | {r.get('attention', '-')}"
            f"{' (yes)' if r.get('compile') else ''} | {r['steps']} | {r['real']:,} | {r['supervised']:,} | "
            f"{r['train_runtime_s']:.1f} | {r['wall_s']:.1f} | {r['tokens_per_second']:,.0f} | "
            f"{fmt(row.get('ratio'), '.2f')} | {r['peak_gib']:.2f} | {fmt(r.get('planned_gib'), '.2f')} | "
            f"{fmt(r.get('steady_mfu') and 100 * r['steady_mfu'], '.1f')} | {fmt(r.get('final_loss'), '.4f')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized smoke run of the same scenarios")
    parser.add_argument("--sides", default="finetune,trl", help="comma-separated: finetune,trl")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder with a chat template (default: tiny BPE)")
    parser.add_argument("--out", default="bench-gpu", help="folder for results.json and results.md")
    parser.add_argument("--trl-attention", default=None, choices=["sdpa", "flex_attention", "flash_attention_2"],
                        help="TRL's attention (default: flash-attn when installed, else sdpa); finetune's is its "
                             "`auto` choice, recorded per run in the table")
    parser.add_argument("--worker", choices=["finetune", "trl"])
    for name in ("--settings", "--model-path", "--data", "--work", "--result"):
        parser.add_argument(name)
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        settings = json.loads(args.settings)
        result = (worker_finetune if args.worker == "finetune" else worker_trl)(settings, args)
        Path(args.result).write_text(json.dumps(result))
        return
    if not args.tiny and not _cuda():
        raise SystemExit("bench_gpu.py: no CUDA device here. Run it on a GPU machine, or add --tiny for the CPU smoke run.")
    from bench_train_vs_trl import make_data

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    report = {"machine": machine(), "trl_attention": args.trl_attention or attention(), "tiny": args.tiny,
              "runs": []}
    for name in SCENARIOS if args.scenario == "all" else [args.scenario]:
        s = tiny(SCENARIOS[name]) if args.tiny else SCENARIOS[name]
        model = build_model(s["shape"], s.get("vocab", VOCAB), args.tokenizer, work / f"model-{name}")
        data = make_data(work / f"{name}.jsonl", n=s["examples"])
        sides = args.sides.split(",")
        for repeat in range(args.repeats):
            results = {side: run_side(side, name, s, model, data, args.trl_attention)
                       for side in (sides if repeat % 2 == 0 else sides[::-1])}
            ours, theirs = results.get("finetune", {}), results.get("trl", {})
            ratio = (ours["tokens_per_second"] / theirs["tokens_per_second"]
                     if "tokens_per_second" in ours and "tokens_per_second" in theirs else None)
            for side in sides:
                row = {"scenario": name, "repeat": repeat, "side": side, "settings": s, "result": results[side]}
                if side == "finetune":
                    row["ratio"] = ratio
                report["runs"].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "settings"})[:600], flush=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
