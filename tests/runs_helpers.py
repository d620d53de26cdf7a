"""Run folders for the runs page tests, written by real (tiny, in-process) trainings:

    sft/out       LoRA SFT through `finetune train` with an `eval:` section (report, answers, run.html)
    <img ...>/out DPO through `finetune train`, with an eval section too; its folder name carries HTML
    grpo/out      GRPO, full fine-tune, its completions.jsonl; one sample line carries script (the trainer's shape)
    crashed/out   SFT that raised at step 5 (as an out-of-memory error would): checkpoints, stopped.json, no run.json
    interrupted/out  SFT stopped by Ctrl-C (SIGINT) during step 3, logging every 10 steps: its checkpoint at step 3
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import yaml
from transformers import TrainerCallback

from conftest import make_records, write_jsonl
from grpo_helpers import grpo_recipe

XSS_NAME = "<img src=x onerror=window.__pwned=1>"  # a folder name: no slash, so a valid one
XSS_ANSWER = "<script>window.__pwned=2</script><img src=x onerror=window.__pwned=3>"
XSS_PROMPT = "</script><script>window.__pwned=4</script>"
CRASH_STEP = 5
INTERRUPT_STEP = 3


class Crash(TrainerCallback):
    """Raises inside step CRASH_STEP: the run stops with an error after its checkpoint at step 4."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == CRASH_STEP:
            raise RuntimeError("simulated crash (out of memory)")


class CtrlC(TrainerCallback):
    """Ctrl-C during step INTERRUPT_STEP: the run finishes the step, saves a checkpoint and stops (exit 130)."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == INTERRUPT_STEP:
            os.kill(os.getpid(), signal.SIGINT)


def _sft_recipe(folder: Path, base_model: Path, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "chat.jsonl", make_records("chat", 40))
    recipe = {"base_model": str(base_model), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 8, "max_steps": 8, "micro_batch_size": 8, "learning_rate": 3e-2,
              "val_set_size": 8, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"],
              "logging_steps": 1, "eval_steps": 4, **overrides}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return folder / "recipe.yml"


def _dpo_recipe(folder: Path, base_model: Path) -> Path:
    from test_preference_data import chat_pair

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    write_jsonl(folder / "pairs.jsonl", [chat_pair(rng) for _ in range(24)])
    recipe = {"base_model": str(base_model), "method": "dpo",
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}],
              "sequence_len": 128, "micro_batch_size": 4, "max_steps": 6, "learning_rate": 2e-3, "logging_steps": 1,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "val_set_size": 8, "adapter": "lora",
              "lora_dropout": 0.0, "max_checkpoints": 1, "precision": "fp32",
              "eval": {"generations": 2, "max_new_tokens": 4}}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return folder / "recipe.yml"


def build_runs(root: Path, base_model: Path) -> dict[str, Path]:
    """The four run folders under `root`, by kind."""
    from finetune.cli import main
    from finetune.recipe import load_recipe
    from finetune.train.run import run_training

    from finetune.train.callbacks.interrupt import Interrupted

    runs = {"sft": root / "sft" / "out", "dpo": root / XSS_NAME / "out", "grpo": root / "grpo" / "out",
            "crashed": root / "crashed" / "out", "interrupted": root / "interrupted" / "out"}
    sft = _sft_recipe(root / "sft", base_model, eval={"generations": 2, "max_new_tokens": 6})
    assert main(["train", str(sft)]) == 0
    assert main(["train", str(_dpo_recipe(root / XSS_NAME, base_model))]) == 0
    (root / "grpo").mkdir()
    grpo = grpo_recipe(root / "grpo", base_model, rewards=[{"function": "rewards.py:even_tokens"}], adapter="none",
                       learning_rate=1e-2, max_steps=2)
    assert main(["train", str(grpo)]) == 0
    with open(runs["grpo"] / "completions.jsonl", "a", encoding="utf-8") as out:  # the trainer's line shape
        out.write(json.dumps({"step": 2, "prompt": XSS_PROMPT, "completions": [XSS_ANSWER, "plain"],
                              "rewards": [0.5, 0.25], "advantages": [0.5, -0.5], "truncated": [False, False]}) + "\n")
    crashed = load_recipe(_sft_recipe(root / "crashed", base_model, checkpoint_interval=2, learning_rate=1e-2))
    try:
        run_training(crashed, extra_callbacks=[Crash()])
    except RuntimeError as err:
        assert "simulated crash" in str(err)
    else:
        raise AssertionError("the crash never came")
    stopped = load_recipe(_sft_recipe(root / "interrupted", base_model, logging_steps=10, val_set_size=0, eval_steps=None))
    try:
        run_training(stopped, extra_callbacks=[CtrlC()])
    except Interrupted:
        pass
    else:
        raise AssertionError("the Ctrl-C never came")
    return runs


def synthetic_runs(root: Path, sft_run: Path) -> list[Path]:
    """Twelve run folders written by hand (no training) for what only the page shows: r00 logged every 10 steps over
    6 steps (one learning rate, 5e-4; a kl of 0; an unrounded float setting), r01 has the "unknown"
    verdict with its reason, r05 alone has an evaluation (the real SFT run's report), the rest a loss curve each."""
    import shutil

    folders = []
    for i in range(12):
        folder = root / f"r{i:02d}"
        folder.mkdir(parents=True)
        history = [{"step": s, "loss": 2.0 - 0.1 * s - 0.01 * i} for s in range(1, 7)]
        recipe = {"base_model": "m", "adapter": "lora", "learning_rate": 1e-3, "logging_steps": 1, "max_steps": 6}
        if i == 0:
            history = [{"step": 1, "loss": 0.0, "grad_norm": 0.5, "learning_rate": 5e-4, "kl": 0.0, "epoch": 0.1,
                        "step_losses": [[1, 0.0]]},
                       {"step": 6, "kl": 0.0, "step_losses": [[s, 0.0] for s in range(2, 7)]}]
            recipe.update(logging_steps=10, lora_dropout=0.1 + 0.2)  # 0.30000000000000004
        (folder / "run.json").write_text(json.dumps({"recipe": recipe, "versions": {"torch": "2"}, "steps": 6,
                                                     "log_history": history}))
        if i == 1:
            (folder / "diagnosis.json").write_text(json.dumps({
                "verdict": "unknown", "reason": "no reward was logged (set logging_steps lower than the step count)"}))
        if i == 5:
            shutil.copytree(sft_run / "eval", folder / "eval")
        folders.append(folder)
    return folders
