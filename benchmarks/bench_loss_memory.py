"""Memory of the LM head + loss on CPU: every position's logits (plain transformers), the supervised rows'
logits at once (finetune before chunking), and the supervised rows in chunks (finetune now).

A one-layer Llama with a SmolLM2 (49,152) or Qwen2 (152,064) vocabulary and hidden size 576 runs one
forward + backward on a row of 2,048 tokens whose first third is prompt (unsupervised). Each (vocabulary,
mode) runs in a fresh process, which reports its peak RSS above the RSS just before the step (ru_maxrss)
and the step's seconds; all modes of one vocabulary run in the same invocation, side by side, and the
table gives ratios against the plain path. Losses are printed to show the three compute the same number.

Run: python benchmarks/bench_loss_memory.py [--vocab 49152 152064] [--seq 2048]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MODES = ("plain", "supervised", "chunked")


def measure(vocab: int, seq: int, mode: str) -> dict:
    """One step in this process: {'peak_mib', 'seconds', 'loss'}."""
    import resource
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune.model.supervised_logits import SupervisedLogits

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=seq,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).train()
    if mode != "plain":
        hooks = SupervisedLogits(model)
        if mode == "supervised":
            hooks.chunk_rows = seq  # every supervised row in one head call: the path before chunking
    ids = torch.randint(0, vocab, (1, seq))
    labels = ids.clone()
    labels[:, : seq // 3] = -100  # the prompt
    before = _rss_mib()
    started = time.perf_counter()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"peak_mib": peak - before, "seconds": seconds, "loss": loss.item()}


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 152064])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # vocab seq mode: measure in this process
    args = parser.parse_args()
    if args.child:
        vocab, seq, mode = args.child
        print(json.dumps(measure(int(vocab), int(seq), mode)))
        return
    print(f"| vocabulary | mode | peak RSS above baseline (MiB) | vs plain | step (s) | loss |")
    print("|---|---|---|---|---|---|")
    for vocab in args.vocab:
        results = {}
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--child", str(vocab), str(args.seq), mode],
                                 capture_output=True, text=True, check=True)
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        plain = results["plain"]["peak_mib"]
        for mode, r in results.items():
            print(f"| {vocab:,} | {mode} | {r['peak_mib']:,.0f} | {r['peak_mib'] / plain:.2f}x | "
                  f"{r['seconds']:.2f} | {r['loss']:.6f} |", flush=True)


if __name__ == "__main__":
    main()
