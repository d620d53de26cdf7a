"""Agents learn: the cpu_agents notebook (SFT on calculator transcripts, then GRPO with the calculator environment)
on SmolLM2-135M-Instruct at its own settings, for each seed, and the reward's first and last thirds; then, from
seed 0's SFT adapter, a GRPO run whose reward ignores the tools (it pays for a short episode, whatever the turns)
and the verdict it gets. Minutes per seed on a CPU: the suite runs the notebook on the tiny model instead
(tests/test_notebooks.py).

    python benchmarks/bench_agents_learning.py --seeds 0 1 [--grpo-steps 12] [--out results.json]

Prints, per seed: the SFT loss, the reward and the tool calls per episode at every step, the means of the first and
last thirds, and the verdict; then the run whose reward ignores tools: its calls per episode and its verdict
(expected: "stopped calling tools"). The claim is in docs/grpo.md ("Agents").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "notebooks" / "cpu_agents.ipynb"
# pays for a short episode (its token count, tool results included) and nothing else: calling the calculator makes
# an episode longer, so a policy that follows this reward learns to answer without it
SHORT_PY = '''
def short(completion_ids, **kwargs):
    return [-len(ids) / 64 for ids in completion_ids]
'''


def run_notebook(workdir: Path, seed: int, grpo_steps: int) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    params = f"WORKDIR = {str(workdir)!r}\nSEED = {seed}\nGRPO_STEPS = {grpo_steps}"
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(params))
    NotebookClient(nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()


def thirds(values: list[float]) -> tuple[float, float]:
    third = max(1, len(values) // 3)
    return sum(values[:third]) / third, sum(values[-third:]) / third


def summary(out: Path) -> dict:
    run = json.loads((out / "run.json").read_text())
    log = [e for e in run["log_history"] if "reward" in e]
    rewards, calls = [e["reward"] for e in log], [e["tools/call_frequency"] for e in log]
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    return {"rewards": rewards, "calls": calls, "reward_thirds": thirds(rewards), "call_thirds": thirds(calls),
            "verdict": diagnosis["verdict"], "reason": diagnosis["reason"]}


def ignoring_tools(workdir: Path, grpo_steps: int) -> dict:
    """GRPO from the SFT adapter with the `short` reward only, in a fresh process."""
    import subprocess

    import yaml

    recipe = yaml.safe_load((workdir / "grpo.yml").read_text())
    (workdir / "short.py").write_text(SHORT_PY)
    recipe.update(rewards=[{"function": "short.py:short"}], output_dir="grpo_short", max_steps=grpo_steps)
    (workdir / "short.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    subprocess.run([sys.executable, "-m", "finetune.cli", "train", "short.yml"], cwd=workdir, check=True)
    return summary(workdir / "grpo_short")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--workdir", default="bench_agents")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    results = {}
    for seed in args.seeds:
        workdir = Path(args.workdir).resolve() / f"seed{seed}"
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        run_notebook(workdir, seed, args.grpo_steps)
        sft = json.loads((workdir / "sft" / "run.json").read_text())
        result = {**summary(workdir / "grpo"), "sft_loss": [e["loss"] for e in sft["log_history"] if "loss" in e],
                  "seconds": round(time.perf_counter() - started)}
        results[f"seed {seed}"] = result
        first, last = result["reward_thirds"]
        print(f"seed {seed}: reward {first:.3f} -> {last:.3f} (first -> last third), calls per episode "
              f"{result['call_thirds'][0]:.2f} -> {result['call_thirds'][1]:.2f}; {result['verdict']}; "
              f"{result['seconds']} s", flush=True)
    workdir = Path(args.workdir).resolve() / f"seed{args.seeds[0]}"
    result = ignoring_tools(workdir, args.grpo_steps)
    results["reward ignoring tools"] = result
    print(f"reward ignoring tools: calls per episode {result['call_thirds'][0]:.2f} -> {result['call_thirds'][1]:.2f}; "
          f"verdict {result['verdict']}: {result['reason']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
