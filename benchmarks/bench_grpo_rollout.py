"""GRPO rollouts: finetune's generation (each prompt prefilled once, its cache held G times, its own decoding loop)
against what it replaced (transformers' `generate` with num_return_sequences = G), side by side in one process.

    python benchmarks/bench_grpo_rollout.py [--model smollm2|tiny] [--prompts 2] [--generations 8]
        [--completion-len 64] [--prompt-len 0] [--repeats 3] [--device cpu|cuda]

The model as GRPO samples from it: fp32 (bf16 with --device cuda), sdpa, a LoRA adapter r 16 / alpha 32 on every
linear layer with its B weights off zero (the adapter live, as after a few steps), eval mode. Prompts: the GRPO
bench's arithmetic questions through the chat template (40-45 tokens on SmolLM2), or, with --prompt-len N,
questions padded with filler text to N tokens. Both sides sample with the same seed; the bench checks that they
gave the same tokens (the two paths are token-identical: tests/test_grpo_rollout.py) and prints each side's
seconds, ms per decoding step (a batched decode runs to its longest completion) and the ratio, per repeat,
the order alternating.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_vs_trl import make_prompts  # noqa: E402  (the same questions as the GRPO vs TRL bench)
from bench_train_vs_trl import ROOT, model_path_for  # noqa: E402

sys.path.insert(0, str(ROOT))

FILLER = " Please show the steps you take and check the result twice before you answer."


def load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path_for(args.model, os.path.expanduser("~/.cache/finetune"))
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(args.device)
    return live_lora(base), AutoTokenizer.from_pretrained(path)


def live_lora(base):
    """The model as GRPO samples from it: a LoRA r 16 on every linear layer, its B weights off zero, eval mode."""
    from peft import LoraConfig, get_peft_model

    from finetune.model import base_causal_lm
    from finetune.model.varlen_attention import use_varlen_attention

    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    if base.device.type == "cpu":
        use_varlen_attention(base_causal_lm(model))  # as a GRPO run on CPU has it (decoding takes the stock path)
    model.eval()
    return model


def prompts(tokenizer, args) -> list[list[int]]:
    records = make_prompts(Path(tempfile.mkdtemp()) / "prompts.jsonl", args.prompts)
    out = []
    for record in records:
        messages = record["prompt"]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        while args.prompt_len and len(ids) < args.prompt_len:
            messages = [{"role": "user", "content": messages[0]["content"] + FILLER}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out.append(ids[-args.prompt_len:] if args.prompt_len else ids)
    return out


def with_generate(model, prompt_ids, group, limit, seed, eos, pad):
    """The path generate_completions took before: one `generate`, num_return_sequences = G."""
    from transformers import GenerationConfig

    width = max(map(len, prompt_ids))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    config = GenerationConfig(max_new_tokens=limit, do_sample=True, num_return_sequences=group, temperature=1.0,
                              top_p=1.0, top_k=0, eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
                              use_cache=True)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    out = []
    for row in rows:
        end = next((t for t, token in enumerate(row) if token in eos), None)
        out.append(row[:end + 1] if end is not None else row)
    return out


def main() -> None:
    from finetune.train.grpo.generation import generate_completions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    for name, default in (("prompts", 2), ("generations", 8), ("completion-len", 64), ("prompt-len", 0),
                          ("repeats", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    model, tokenizer = load(args)
    prompt_ids = prompts(tokenizer, args)
    eos, pad = [tokenizer.convert_tokens_to_ids("<|im_end|>")], tokenizer.pad_token_id or 0
    print(f"{args.model} on {args.device}, {args.prompts} prompts of {[len(p) for p in prompt_ids]} tokens x G "
          f"{args.generations}, at most {args.completion_len} tokens; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    sides = {
        "generate": lambda seed: with_generate(model, prompt_ids, args.generations, args.completion_len, seed, eos,
                                               pad),
        "finetune": lambda seed: generate_completions(model, prompt_ids, args.generations, args.completion_len,
                                                      seed=seed, eos_ids=eos, pad_id=pad).ids}
    sides["finetune"](0), sides["generate"](0)  # warm-up: first touch of the weights, kernels' first calls
    ratios = []
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]
        seconds, ids = {}, {}
        for side in order:
            if args.device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            ids[side] = sides[side](repeat + 1)
            if args.device == "cuda":
                torch.cuda.synchronize()
            seconds[side] = time.perf_counter() - started
        steps = max(len(row) for row in ids["finetune"])
        tokens = sum(len(row) for row in ids["finetune"])
        ratios.append(seconds["generate"] / seconds["finetune"])
        print(f"[{repeat}] generate {seconds['generate']:6.2f} s ({seconds['generate'] / steps * 1e3:5.1f} ms/step)  "
              f"finetune {seconds['finetune']:6.2f} s ({seconds['finetune'] / steps * 1e3:5.1f} ms/step)  "
              f"{steps} decoding steps, {tokens} tokens  same tokens: {ids['generate'] == ids['finetune']}  "
              f"generate / finetune {ratios[-1]:.2f}x  load {os.getloadavg()[0]:.1f}")
    ratios.sort()
    print(f"generate / finetune over {args.repeats} repeats: median {ratios[len(ratios) // 2]:.2f}x "
          f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x)")


if __name__ == "__main__":
    main()
