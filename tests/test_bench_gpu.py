"""benchmarks/bench_gpu.py's CPU smoke mode: the same scenario at a tiny size writes its JSON and table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_smoke_run_writes_json_and_a_markdown_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--tiny", "--scenario", "1b-full",
                           "--sides", "finetune", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["tiny"] and [(r["scenario"], r["side"]) for r in report["runs"]] == [("1b-full", "finetune")]
    result = report["runs"][0]["result"]
    assert result["steps"] == 6 and result["supervised"] > 0 and result["real"] <= result["slots"]
    assert result["tokens_per_second"] > 0 and result["final_loss"] > 0
    table = (tmp_path / "results.md").read_text()
    if not torch.cuda.is_available():  # what `auto` chooses on a CPU
        assert result["attention"] == "sdpa" and result["compile"] is False
    compiled = " (yes)" if result["compile"] else ""
    assert table.startswith("Machine: ") and f"| 1b-full | 0 | finetune | {result['attention']}{compiled} | 6 |" in table


def test_without_cuda_the_full_benchmark_says_how_to_run(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the full run is the real benchmark, not this refusal")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--tiny" in proc.stderr and "Traceback" not in proc.stderr
