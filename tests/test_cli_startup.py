"""CLI start-up stays light: `finetune --help`, a verb's --help and `finetune validate` never import torch,
transformers or datasets (measured in a fresh interpreter; the timings live in benchmarks/cli_startup.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "datasets", "peft", "accelerate")

PROBE = """
import contextlib, io, json, sys
from finetune.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # argparse --help exits
        code = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(%r))
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()}))
""" % (HEAVY,)


def run_cli(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["preprocess", "--help"]])
def test_help_imports_no_heavy_library(argv):
    result = run_cli(*argv)
    assert result["code"] == 0 and "usage" in result["out"]
    assert result["heavy"] == []


def test_validate_imports_no_heavy_library(make_recipe):
    recipe = make_recipe("chat", n=4, sample_packing=True, adapter="lora")
    result = run_cli("validate", str(recipe))
    assert result["code"] == 0 and "sample_packing: true" in result["out"]
    assert result["heavy"] == []


def test_probe_detects_a_heavy_import():
    # the probe itself must be able to fail: a verb that loads torch is reported
    proc = subprocess.run([sys.executable, "-c", "import torch\n" + PROBE, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert "torch" in json.loads(proc.stdout.strip().splitlines()[-1])["heavy"]
