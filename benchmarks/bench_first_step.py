"""Time to the first step: from the command starting to the first optimizer step beginning, on CPU.

Each run is a fresh `python` process running `finetune train RECIPE` (everything a user waits for); it stops
when the first step begins, so only start-up is measured. Phases are stamped where they end; imports land in
the phase that first needs them:

    cli       interpreter, `finetune` CLI, recipe validated
    data      transformers import, tokenizer, dataset (a fresh prepared cache each run: tokenizing counts)
    model     peft import (and bitsandbytes, if imported), base load, LoRA
    probes    the isolation guard's and the supervised-logits probe's forwards
    trainer   Trainer construction (accelerate; DeepSpeed, if imported), eval-before
    first     the Trainer's own set-up until the first step begins

    python benchmarks/bench_first_step.py --model tiny|smollm2 --repeats 3

The default variant runs beside `--compare-env` (default `FINETUNE_IMPORT_ALL=1`: every optional library
imported, as before finetune/train/imports.py), alternately, and the ratio is taken per repeat.
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

ROOT = Path(__file__).resolve().parents[1]
STAMPS = ("cli", "data", "model", "probes", "trainer", "first")


def child(args) -> None:
    """Runs in the fresh process: `finetune train RECIPE` until the first step begins, writing time stamps."""
    stamps = {"start": float(os.environ["BENCH_T0"])}
    import finetune.train.run as run_module
    from finetune.cli import main

    run_training, probe_model = run_module.run_training, run_module.probe_model

    def stamp_after(name, fn):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            stamps[name] = time.time()
            return out
        return wrapper

    def first_step_callback():
        from transformers import TrainerCallback

        class FirstStep(TrainerCallback):
            def on_train_begin(self, *a, **k):
                stamps["trainer"] = time.time()

            def on_step_begin(self, *a, **k):
                stamps["first"] = time.time()
                Path(args.result).write_text(json.dumps(stamps))
                os._exit(0)  # start-up measured; nothing else to wait for

        return FirstStep()

    def timed_run(recipe, extra_callbacks=()):
        import finetune.data as data_module
        import finetune.model as model_module

        stamps["cli"] = time.time()  # interpreter, CLI, recipe validated: run_training starts
        data_module.build_dataset = stamp_after("data", data_module.build_dataset)  # stamps only
        model_module.build_model = stamp_after("model", model_module.build_model)
        return run_training(recipe, extra_callbacks=[first_step_callback(), *extra_callbacks])

    run_module.run_training, run_module.probe_model = timed_run, stamp_after("probes", probe_model)
    main(["train", args.recipe])


def run_once(python: str, recipe: Path, env_extra: dict) -> dict:
    result = Path(tempfile.mkdtemp(prefix="first-step-")) / "stamps.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", **env_extra}
    cmd = [python, str(ROOT / "benchmarks" / "bench_first_step.py"), "--child", "--recipe", str(recipe),
           "--result", str(result)]
    env["BENCH_T0"] = repr(time.time())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if not result.exists():
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    stamps = json.loads(result.read_text())
    out, previous = {}, stamps["start"]
    for name in STAMPS:
        out[name] = stamps.get(name, previous) - previous
        previous = stamps.get(name, previous)
    out["total"] = previous - stamps["start"]
    return out


def make_recipe(model: str, work: Path) -> Path:
    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_train_vs_trl import make_data, model_path_for

    cache = os.environ.get("FINETUNE_CACHE_DIR") or os.path.expanduser("~/.cache/finetune")
    recipe = {"base_model": model_path_for(model, cache), "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
              "lora_target_modules": "all-linear", "datasets": [{"path": str(make_data(work / "chat.jsonl")), "type": "chat"}],
              "sequence_len": 512, "sample_packing": True, "micro_batch_size": 2, "num_epochs": 1, "precision": "fp32",
              "learning_rate": 1e-3, "logging_steps": 1, "report_to": ["none"], "output_dir": str(work / "out"),
              "dataset_prepared_path": str(work / "prepared"), "cache_dir": cache, "resume": False}
    path = work / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-env", metavar="NAME=VALUE", default="FINETUNE_IMPORT_ALL=1",
                        help="the variant run beside the default, alternately (default: every library imported)")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--recipe")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.child:
        return child(args)
    name, _, value = args.compare_env.partition("=")
    variants = {"default": {}, args.compare_env: {name: value}}
    ratios = []
    for repeat in range(args.repeats):
        totals = {}
        for label in list(variants) if repeat % 2 else list(variants)[::-1]:
            work = Path(tempfile.mkdtemp(prefix="first-step-work-"))
            times = run_once(sys.executable, make_recipe(args.model, work), variants[label])
            totals[label] = times["total"]
            print(f"[{repeat}] {label:22s} " + "  ".join(f"{k} {v:5.2f}s" for k, v in times.items()), flush=True)
        ratios.append(totals[args.compare_env] / totals["default"])
        print(f"[{repeat}] start-up {args.compare_env} / default: {ratios[-1]:.2f}x", flush=True)
    print(f"ratio over {len(ratios)} repeats: min {min(ratios):.2f}x, max {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
