"""Mixture-of-experts LoRA: finetune vs TRL's SFTTrainer on a tiny-but-not-trivial Qwen3-MoE, like for like, in one run.

The model: qwen3_moe built from config (seeded) with the tests' tokenizer: hidden 256, 4 layers, 8 experts, top-2,
expert width 256, 8 heads of 32 (~7.3M parameters, 6.3M of them experts). Same data as bench_train_vs_trl.py (64
chat examples of 1-4 question/answer pairs), the same supervised tokens (assistant turns; TRL gets finetune's
`input_ids` + `labels`, its tokenization inside its measured time), the same LoRA on both sides: r=16, alpha=32,
dropout 0 (peft refuses dropout on parameter targets), on the attention projections and on the fused experts
through peft's `target_parameters` (mlp.experts.gate_up_proj, mlp.experts.down_proj); routers frozen on both
sides. The same objective: cross-entropy + 0.001 x the router's load-balancing loss (the coefficient the config
declares; TRL 1.16 adds it by default, finetune too). The rest is bench_train_vs_trl.py's, whose workers run both
sides here with these targets: AdamW lr 1e-3 cosine, no warmup, one epoch, seed 42, fp32, sdpa, no gradient
checkpointing.

TRL runs as in bench_train_vs_trl.py: `default` (no packing, 8 examples a batch padded to the longest) and `packed`
(its BFD packing, padding-free, 2 rows of 512). finetune packs rows of 512, 2 a micro batch. Each side in a fresh
process (whole-process wall: imports, model load, tokenization, training, saving); the order rotates per repeat;
ratios per repeat. The CPU is shared: compare ratios, not seconds.

Run: python benchmarks/bench_moe_vs_trl.py [--repeats 2] [--trl-modes default,packed]
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

import bench_train_vs_trl
from bench_train_vs_trl import TRL_MODES, make_data

ROOT = Path(__file__).resolve().parents[1]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def build_model(out: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                            moe_intermediate_size=256,
                            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, max_position_embeddings=1024,
                            tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


# both sides: LoRA on the attention and on the fused experts, no dropout (peft has none for parameter targets)
LORA = {"target_modules": ATTENTION, "target_parameters": EXPERTS, "lora_dropout": 0.0}


def worker_finetune(args) -> dict:
    return bench_train_vs_trl.worker_finetune(args, {"lora_target_modules": ATTENTION,
                                                     "lora_target_parameters": EXPERTS, "lora_dropout": 0.0})


def worker_trl(args) -> dict:
    return bench_train_vs_trl.worker_trl(args, LORA)


def run_side(side: str, model_path: str, data: Path, cache_dir: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-moe-{side}-"))
    out = work / "result.json"
    worker, _, mode = side.partition("-")
    cmd = [sys.executable, __file__, "--worker", worker, "--model-path", model_path, "--data", str(data),
           "--work", str(work), "--cache-dir", cache_dir, "--result", str(out)] + (["--trl-mode", mode] if mode else [])
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result.update(wall_s=wall, supervised_per_s=result["supervised"] / wall,
                  padding_waste=1 - result["real"] / result["slots"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", default=os.environ.get("FINETUNE_CACHE_DIR")
                        or os.path.expanduser("~/.cache/finetune"))
    parser.add_argument("--trl-modes", default="default,packed")
    parser.add_argument("--worker", choices=["finetune", "trl"])
    parser.add_argument("--trl-mode", choices=TRL_MODES, default="default")
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
    modes = [m for m in args.trl_modes.split(",") if m]
    model_path = build_model(Path(tempfile.mkdtemp(prefix="bench-moe-model-")) / "model")
    data = make_data(Path(tempfile.mkdtemp(prefix="bench-moe-data-")) / "chat.jsonl")
    print(f"qwen3_moe hidden 256, 4 layers, 8 experts top-2 ({model_path}); 64 chat examples; {os.cpu_count()} "
          f"CPUs (shared); TRL modes {','.join(modes)}")
    sides = ["finetune"] + [f"trl-{m}" for m in modes]
    ratios: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
        results = {side: run_side(side, model_path, data, args.cache_dir) for side in order}
        for side in sides:
            r = results[side]
            print(f"[{repeat}] {side:11s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s  "
                  f"steps {r['steps']:3d}  trainable {r['trainable']:,}  supervised {r['supervised']:5d} "
                  f"({r['supervised_per_s']:6.1f}/s)  padding waste {r['padding_waste']:.3f}  "
                  f"loss final {r['final_loss']:.4f} mean {r['mean_loss']:.4f}  last aux {r['aux']}")
        ft = results["finetune"]
        for mode in modes:
            r = results[f"trl-{mode}"]
            ratio, loop = r["wall_s"] / ft["wall_s"], r["train_runtime_s"] / ft["train_runtime_s"]
            ratios[mode].append((ratio, loop))
            print(f"[{repeat}] vs TRL {mode:7s} (TRL / finetune): wall {ratio:.2f}x, training loop {loop:.2f}x; "
                  f"same supervised targets {r['supervised'] == ft['supervised']}, same trainable "
                  f"{r['trainable'] == ft['trainable']}")
    for mode in modes:
        walls, loops = [w for w, _ in ratios[mode]], [t for _, t in ratios[mode]]
        print(f"vs TRL {mode} over {args.repeats} repeats: wall {min(walls):.2f}x-{max(walls):.2f}x, "
              f"loop {min(loops):.2f}x-{max(loops):.2f}x")


if __name__ == "__main__":
    main()
