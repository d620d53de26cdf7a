"""Agents' turns: each continued from the rollouts' KV cache (finetune/train/grpo/turns.py, CachedTurns: what a run
uses) against re-running every rollout's whole ids each turn (Reprefill over generate_completions: what a run did
before), side by side in one process, on the same episodes.

    python benchmarks/bench_agent_turns.py [--sft DIR] [--prompts 2] [--generations 8] [--completion-len 96]
        [--iterations 2] [--repeats 3]

The model: SmolLM2-135M-Instruct with the calculator SFT adapter merged (benchmarks/agents_vs_trl_parts.py, the
multi-turn row of bench_grpo_vs_trl.py), fp32, sdpa with the CPU's per-example attention (as a run has it), a fresh
LoRA r 16 on every linear layer with its B weights off zero (live, as after a few steps). The prompts: that bench's
calculator questions with the tool's schema in the system turn (chatml_tools); the tool: the calculator, run in
this process (the episodes' loop, parser and template suffixes are the run's own). Both sides sample with the same
seed; the bench checks that they built the same episodes, and prints each side's seconds, the positions each fed the
model (a forward hook), and the ratio, per repeat, the order alternating.
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
import agents_vs_trl_parts as agents  # noqa: E402
from bench_grpo_rollout import live_lora  # noqa: E402  (the same live adapter as the single-turn rollout bench)
from bench_train_vs_trl import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))


def load(sft: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = agents.merged_model(sft, Path(tempfile.mkdtemp(prefix="bench-turns-")) / "model")
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    return live_lora(base), AutoTokenizer.from_pretrained(path)


def calculator_tools():
    """call_tools for run_episodes: the calculator, one instance per rollout, in this process."""
    import importlib.util

    from finetune.train.grpo.tools import ToolOutcome

    folder = Path(tempfile.mkdtemp())
    _, path = agents.write_files(folder)
    spec = importlib.util.spec_from_file_location("bench_calculator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    envs = {}

    def call(calls):
        out = []
        for rollout, name, arguments in calls:
            if rollout not in envs:
                envs[rollout] = module.Calculator()
                envs[rollout].reset()
            env = envs[rollout]
            try:
                out.append(ToolOutcome(ok=True, value=str(getattr(env, name)(**arguments))))
            except Exception as error:  # noqa: BLE001  (what the model reads, as a run shows it)
                out.append(ToolOutcome(ok=False, value=str(error), kind="exception", shown=str(error)))
        return out

    return call


def main() -> None:
    from finetune.agent_tools import schemas_in_worker
    from finetune.data.tool_chat import prompt_ids, tool_suffix_ids
    from finetune.model import base_causal_lm
    from finetune.train.grpo.episodes import EpisodeSettings, run_episodes
    from finetune.train.grpo.generation import generate_completions
    from finetune.train.grpo.tool_calls import call_parser
    from finetune.train.grpo.turns import CachedTurns, Reprefill, turn_seed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", default="/tmp/agents_bench/seed0/sft")
    for name, default in (("prompts", 2), ("generations", 8), ("completion-len", 96), ("iterations", 2),
                          ("repeats", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    model, tokenizer = load(Path(args.sft))
    folder = Path(tempfile.mkdtemp())
    _, calculator = agents.write_files(folder)
    schemas = schemas_in_worker(f"{calculator}:Calculator", [], folder)["schemas"]
    records = agents.make_questions(folder / "questions.jsonl", args.prompts)
    prompts = [prompt_ids(tokenizer, r["prompt"], schemas) for r in records for _ in range(args.generations)]
    eos, pad = [tokenizer.convert_tokens_to_ids("<|im_end|>")], tokenizer.pad_token_id or 0
    settings = EpisodeSettings(args.completion_len, args.iterations, 512, 8192, tuple(eos))
    parse = call_parser(tokenizer)
    sides = {
        "reprefill": lambda seed: Reprefill(lambda p, g, n, turn: generate_completions(
            model, p, g, n, seed=turn_seed(seed, turn), eos_ids=eos, pad_id=pad).ids),
        "cached": lambda seed: CachedTurns(model, seed, eos_ids=eos, pad_id=pad)}
    fed = []
    base_causal_lm(model).get_input_embeddings().register_forward_pre_hook(
        lambda module, inputs: fed.append(inputs[0].numel()))

    def episodes(side, seed):
        return run_episodes(prompts, args.generations, sides[side](seed), parse, calculator_tools(),
                            lambda messages: tool_suffix_ids(tokenizer, messages, eos),
                            lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]), schemas,
                            settings)

    print(f"{args.prompts} prompts of {sorted({len(p) for p in prompts})} tokens x G {args.generations}, at most "
          f"{args.completion_len} tokens an episode, {args.iterations} tool rounds; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    episodes("cached", 0), episodes("reprefill", 0)  # warm-up: first touch of the weights, kernels' first calls
    ratios = []
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]
        seconds, batches, positions = {}, {}, {}
        for side in order:
            fed.clear()
            started = time.perf_counter()
            batches[side] = episodes(side, repeat + 1)
            seconds[side], positions[side] = time.perf_counter() - started, sum(fed)
        a, b = batches["cached"], batches["reprefill"]
        same = a.ids == b.ids and a.masks == b.masks
        turns = sum(e.rounds + 1 for e in a.episodes) / len(a.episodes)
        calls = sum(e.calls for e in a.episodes) / len(a.episodes)
        ratios.append(seconds["reprefill"] / seconds["cached"])
        print(f"[{repeat}] reprefill {seconds['reprefill']:6.2f} s ({positions['reprefill']} positions fed)  cached "
              f"{seconds['cached']:6.2f} s ({positions['cached']})  {sum(a.lengths)} model tokens, {turns:.2f} turns "
              f"and {calls:.2f} calls an episode  same episodes: {same}  reprefill / cached {ratios[-1]:.2f}x  "
              f"load {os.getloadavg()[0]:.1f}")
    ratios.sort()
    print(f"reprefill / cached over {args.repeats} repeats: median {ratios[len(ratios) // 2]:.2f}x "
          f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x)")


if __name__ == "__main__":
    main()
