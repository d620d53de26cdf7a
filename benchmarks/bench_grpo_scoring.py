"""GRPO scoring: packed rows holding each prompt once vs one prompt per completion vs TRL's padded batch, in one run.

    python benchmarks/bench_grpo_scoring.py [--prompts 4] [--generations 8] [--prompt-len 32] [--completion-len 64]

The tiny test Llama (hidden 64, 2 layers, vocab ~512, LoRA r=8 on every linear layer, fp32, the per-example SDPA
path), random tokens; each layout scores the same completions (forward + backward of the summed log-probs, and a
no-grad forward), best of --repeats. Prints seconds and the ratios to the padded batch. On a model this small the
per-call overhead weighs more than it would on a real one; the token counts say what the layouts save.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _model(folder: str):
    from peft import LoraConfig, get_peft_model
    from tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    from finetune.model import base_causal_lm
    from finetune.model.varlen_attention import use_varlen_attention

    base = AutoModelForCausalLM.from_pretrained(build_tiny_model(folder), attn_implementation="sdpa",
                                                dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    assert use_varlen_attention(base_causal_lm(model))
    return model


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    from finetune.train.grpo.scoring import completion_logps, pack_scoring_rows, padded_completion_logps

    parser = argparse.ArgumentParser()
    for name, default in (("prompts", 4), ("generations", 8), ("prompt-len", 32), ("completion-len", 64),
                          ("repeats", 5)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 500, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]
    completions = [torch.randint(5, 500, (args.completion_len,), generator=gen).tolist()
                   for _ in range(args.prompts * args.generations)]
    # two prompts' segments a row: 2 x (32 + 8 x 64) = 1,088 tokens with the defaults
    capacity = 2 * (args.prompt_len + args.generations * args.completion_len)
    with tempfile.TemporaryDirectory() as folder:
        model = _model(folder)
        model.train()
        layouts = {
            "packed, prompt shared": lambda: completion_logps(model, pack_scoring_rows(prompts, completions, capacity)),
            "packed, prompt per completion": lambda: completion_logps(
                model, pack_scoring_rows(prompts, completions, capacity, share_prompt=False)),
            "padded batch (TRL)": lambda: padded_completion_logps(model, prompts, completions),
        }
        tokens = {"packed, prompt shared": sum(len(r.input_ids) for r in pack_scoring_rows(prompts, completions,
                                                                                            capacity)),
                  "packed, prompt per completion": len(completions) * (args.prompt_len + args.completion_len),
                  "padded batch (TRL)": len(completions) * (args.prompt_len + args.completion_len)}
        results = {}
        for name, score in layouts.items():
            def step():
                model.zero_grad(set_to_none=True)
                score().logps.sum().backward()

            def forward():
                with torch.no_grad():
                    score()

            step(), forward()  # warm-up
            results[name] = (_best(step, args.repeats), _best(forward, args.repeats))
    base = results["padded batch (TRL)"]
    print(f"{args.prompts} prompts x G={args.generations}, prompt {args.prompt_len} + completion "
          f"{args.completion_len} tokens, {torch.get_num_threads()} threads")
    for name, (train, score) in results.items():
        print(f"{name:32s} tokens {tokens[name]:6d}  fwd+bwd {train:.3f}s ({base[0] / train:.2f}x)  "
              f"no-grad fwd {score:.3f}s ({base[1] / score:.2f}x)")


if __name__ == "__main__":
    main()
