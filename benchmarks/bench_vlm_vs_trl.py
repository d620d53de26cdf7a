"""Vision-language LoRA: finetune vs TRL's SFTTrainer with its vision collator, like for like, whole process and
peak memory, in one run.

Model (`--model`): `smollm2` is SmolLM2-135M-Instruct (the quickstart's GGUF) behind a 1-layer random vision tower
in SmolVLM's layout (Idefics3; tests/tiny_vision.py: smollm2_vision; 32-px pictures, 4 image tokens each); `tiny`
is tests/tiny_vision.py's tiny Idefics3; a model folder or hub id (`--model HuggingFaceTB/SmolVLM-256M-Instruct` on a
GPU) is used as it is.
Data: 64 chat records, one drawn picture each (a colour, a shape), the question, and an answer of 1 to 8 sentences
about the picture, so the rows differ in length as real captions do.
Same LoRA (r 16, alpha 32, dropout 0.05) on the same layers: finetune's `all-linear` under the default vision keys
(the language model and the projector, never the frozen tower), given to TRL as that list of names. Same optimizer
and schedule (AdamW, lr 1e-3 cosine, no warmup, clip 1.0, seed 42), one epoch, fp32 (on a GPU too), sdpa, no
gradient checkpointing, the same supervised tokens (the answers: TRL's prompt-completion records with
`completion_only_loss`; tests/test_vision_trl_oracle.py holds the two losses equal on the same batch).

TRL 1.16 refuses packing and padding-free for vision datasets, so it runs its only configuration: 8 records a batch,
padded to the longest, each batch tokenized and its pictures processed by DataCollatorForVisionLanguageModeling,
the loss over every position's logits (about 530 token slots a step, 370 of them real). finetune: `sample_packing:
true` (Idefics3's positions allow it), rows of 512 tokens, 1 row a micro batch (`FINETUNE_SHAPE`: as many token
slots a forward as TRL's batch, so peak memory compares like for like; 6 steps to TRL's 8 over the same tokens), the
rows tokenized once (image tokens counted then), the pictures processed per batch by its collator, the output layer
on supervised positions only.

Each side runs in its own fresh process: wall time from outside (imports, model load, tokenization, training,
saving the adapter), peak RSS from the process itself (`ru_maxrss`; on a GPU also torch's peak allocated memory).
The order alternates every round and the ratios are taken per round. The CPU here is shared: compare ratios.

Run: python benchmarks/bench_vlm_vs_trl.py [--model smollm2|tiny|PATH] [--rounds 3]
Needs: pip install 'finetune[bench]' (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_vs_trl import HYPER, ROOT, Counter, counted_training, model_path_for, worker_finetune  # noqa: E402

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's finetune; tiny_vision's builders

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (40, 60, 220), "yellow": (240, 210, 20)}
FINETUNE_SHAPE = {"micro_batch_size": 1}  # a 512-token row a forward: TRL's 8 records take about as many slots
SENTENCES = ["The picture is {c}.", "A {s} sits on it.", "The {s} is white.", "Nothing else is drawn.",
             "The background fills the frame.", "Its edges are sharp.", "It is a drawing, not a photo.",
             "The colour is {c} all over."]


def make_data(folder: Path, n: int = 64, seed: int = 0) -> Path:
    """n records: a 32-px picture (a colour with a white circle or square), a question, 1-8 sentences of answer."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    with (folder / "data.jsonl").open("w") as fh:
        for i in range(n):
            colour, shape = rng.choice(list(COLOURS)), rng.choice(["circle", "square"])
            image = Image.new("RGB", (32, 32), COLOURS[colour])
            size, x, y = rng.randint(6, 12), rng.randint(0, 20), rng.randint(0, 20)
            draw = ImageDraw.Draw(image)
            (draw.ellipse if shape == "circle" else draw.rectangle)([x, y, x + size, y + size], fill="white")
            path = folder / "images" / f"{i}.png"
            image.save(path)
            answer = " ".join(s.format(c=colour, s=shape) for s in SENTENCES[:rng.randint(1, len(SENTENCES))])
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": [{"type": "image", "path": str(path)},
                                             {"type": "text", "text": "Describe the picture."}]},
                {"role": "assistant", "content": answer}]}) + "\n")
    return folder / "data.jsonl"


def lora_layers(model_path: str) -> list[str]:
    """The layers finetune's LoRA adapts under `all-linear` and the default vision keys (a meta model: names only)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from finetune.model.vision import lora_target_names
    from finetune.recipe.vision import VisionKeys

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_path))
    return lora_target_names(model, SimpleNamespace(lora_target_modules="all-linear", **VisionKeys().model_dump()))


def trl_dataset(data: str):
    """The records in TRL's prompt-completion layout: {"type": "image"} placeholders, the pictures in `images`."""
    from datasets import Dataset
    from PIL import Image

    rows = {"prompt": [], "completion": [], "images": []}
    for line in Path(data).read_text().splitlines():
        user, assistant = json.loads(line)["messages"]
        rows["prompt"].append([{"role": "user", "content": [{"type": "image"},
                                                            {"type": "text", "text": user["content"][1]["text"]}]}])
        rows["completion"].append([{"role": "assistant", "content": [{"type": "text", "text": assistant["content"]}]}])
        rows["images"].append([Image.open(user["content"][0]["path"]).convert("RGB")])
    return Dataset.from_dict(rows)


class BatchCounter(Counter):
    """The SFT bench's counter for TRL's vision batches, which arrive as records (tokenized in the collator): the
    real tokens are the attention mask's."""

    def __call__(self, features):
        batch = self.collate(features)
        self.slots += batch["input_ids"].numel()
        self.real += int(batch["attention_mask"].sum())
        self.supervised += int(batch["labels"][..., 1:].ne(-100).sum())
        return batch


def worker_trl(args) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        output_dir=str(Path(args.work) / "out"), num_train_epochs=1, per_device_train_batch_size=8,
        learning_rate=HYPER["lr"], lr_scheduler_type="cosine", warmup_steps=0, seed=HYPER["seed"], logging_steps=1,
        save_strategy="no", report_to="none", bf16=False, fp16=False, gradient_checkpointing=False, max_length=None,
        completion_only_loss=True, model_init_kwargs={"dtype": torch.float32, "attn_implementation": "sdpa"})
    peft_config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                             target_modules=lora_layers(args.model_path), task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=args.model_path, args=config, train_dataset=trl_dataset(args.data),
                         processing_class=AutoProcessor.from_pretrained(args.model_path), peft_config=peft_config)
    return counted_training(trainer, args.work, BatchCounter)


def worker(args) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result = worker_finetune(args, FINETUNE_SHAPE) if args.worker == "finetune" else worker_trl(args)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
    if torch.cuda.is_available():
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def run_side(side: str, model_path: str, data: Path, cache_dir: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-vlm-{side}-"))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
           "--work", str(work), "--cache-dir", cache_dir, "--result", str(out)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = wall
    result["padding_waste"] = 1 - result["real"] / result["slots"]
    return result


def vlm_path(name: str, cache_dir: str) -> str:
    if name == "tiny":
        from tiny_vision import build_tiny_vlm

        return str(build_tiny_vlm("idefics3", Path(tempfile.mkdtemp(prefix="bench-vlm-tiny-")) / "model"))
    if name == "smollm2":
        from tiny_vision import smollm2_vision

        text = model_path_for("smollm2", cache_dir)
        return str(smollm2_vision(text, Path(tempfile.mkdtemp(prefix="bench-vlm-smollm2-")) / "model"))
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a VLM folder / hub id")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-dir", default=os.environ.get("FINETUNE_CACHE_DIR")
                        or os.path.expanduser("~/.cache/finetune"))
    parser.add_argument("--worker", choices=["finetune", "trl"])
    for name in ("--model-path", "--data", "--work", "--result"):
        parser.add_argument(name)
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        Path(args.result).write_text(json.dumps(worker(args)))
        return
    model_path = vlm_path(args.model, args.cache_dir)
    data = make_data(Path(tempfile.mkdtemp(prefix="bench-vlm-data-")))
    print(f"model {args.model} ({model_path}); 64 image records; {os.cpu_count()} CPUs (shared); "
          f"LoRA on {len(lora_layers(model_path))} layers")
    ratios = []
    for round_ in range(args.rounds):
        order = ["finetune", "trl"] if round_ % 2 == 0 else ["trl", "finetune"]
        results = {side: run_side(side, model_path, data, args.cache_dir) for side in order}
        for side in ("finetune", "trl"):
            r = results[side]
            print(f"[{round_}] {side:8s} wall {r['wall_s']:6.1f} s  train {r['train_runtime_s']:6.1f} s  steps "
                  f"{r['steps']:3d}  supervised {r['supervised']:5d}  slots {r['slots']:6d}  padding waste "
                  f"{r['padding_waste']:.3f}  peak RSS {r['peak_rss_gib']:.2f} GiB"
                  + (f"  peak GPU {r['peak_gpu_gib']:.2f} GiB" if "peak_gpu_gib" in r else "")
                  + f"  loss final {r['final_loss']:.4f} mean {r['mean_loss']:.4f}")
        ours, theirs = results["finetune"], results["trl"]
        ratio = (theirs["wall_s"] / ours["wall_s"], theirs["train_runtime_s"] / ours["train_runtime_s"],
                 ours["peak_rss_gib"] / theirs["peak_rss_gib"])
        ratios.append(ratio)
        print(f"[{round_}] speed-up vs TRL (TRL wall / finetune wall): {ratio[0]:.2f}x; training loop only: "
              f"{ratio[1]:.2f}x; peak RSS finetune / TRL {ratio[2]:.2f}; same supervised targets: "
              f"{ours['supervised'] == theirs['supervised']} ({ours['supervised']} vs {theirs['supervised']})")
    walls, loops, memory = zip(*ratios)
    print(f"over {args.rounds} rounds: wall {min(walls):.2f}x-{max(walls):.2f}x, loop {min(loops):.2f}x-"
          f"{max(loops):.2f}x, peak RSS finetune / TRL {min(memory):.2f}-{max(memory):.2f}")


if __name__ == "__main__":
    main()
