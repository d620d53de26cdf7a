"""Training end to end on the tiny model: LoRA changes only adapters, full fine-tune changes weights,
the subprocess entry point writes the expected files, run.json records what ran."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from finetune.recipe import load_recipe
from finetune.train import run_training


def base_weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def test_lora_trains_adapters_and_leaves_base_frozen(make_recipe, tiny_model_dir, tmp_path):
    recipe = load_recipe(make_recipe("chat", n=24, adapter="lora", lora_r=4, val_set_size=0.25, num_epochs=2))
    summary = run_training(recipe)
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert not (out / "model.safetensors").exists()
    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: non-zero means it trained

    # plain peft loads the adapter onto the base; base weights are untouched
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(out))
    original = base_weights(tiny_model_dir)
    merged_free = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                   for k, v in model.state_dict().items() if "lora_" not in k}
    for name, tensor in original.items():
        assert torch.equal(merged_free[name], tensor), name

    assert summary["steps"] == summary["plan"]["total_steps"] == 2 * 5  # 18 train / 4 per step = 5 per epoch
    assert summary["final_train_loss"] < summary["first_train_loss"]
    assert summary["eval_loss_before"] is not None and summary["final_eval_loss"] < summary["eval_loss_before"]


def test_full_finetune_changes_the_weights(make_recipe, tiny_model_dir, tmp_path):
    recipe = load_recipe(make_recipe("instruction", n=16, adapter="none", max_steps=3))
    summary = run_training(recipe)
    trained = load_file(str(tmp_path / "out" / "model.safetensors"))
    original = base_weights(tiny_model_dir)
    changed = [k for k in original if not torch.equal(original[k], trained[k])]
    assert len(changed) == len(original)  # every weight gets gradient in a full fine-tune
    assert summary["steps"] == 3 and summary["trainable_parameters"] == summary["total_parameters"]


def test_module_entry_point_writes_outputs_and_run_json(make_recipe, tmp_path):
    recipe = make_recipe("completion", n=12, adapter="lora", val_set_size=4)
    proc = subprocess.run(
        [sys.executable, "-m", "finetune.train", str(recipe), "--set", "max_steps=2", "--set", "lora_r=2"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "run.json",
                 "recipe.resolved.yml"):
        assert (out / name).is_file(), name
    run = json.loads((out / "run.json").read_text())
    assert run["recipe"]["lora_r"] == 2 and run["recipe"]["max_steps"] == 2 and run["steps"] == 2
    assert run["data"]["train"]["examples"] == 8 and run["data"]["eval"]["examples"] == 4
    assert len(run["data_hash"]) == 64 and run["versions"]["torch"].startswith(torch.__version__.split("+")[0])
    assert run["first_train_loss"] > 0 and run["final_eval_loss"] > 0
    assert "optimizer steps" in proc.stderr and "supervised" in proc.stderr
    # what the run resolved is recorded as logged: the attention and compile choices with their reasons
    assert f"attention {run['attn_implementation']} ({run['attn_reason']})" in proc.stderr
    assert run["compile"] is torch.cuda.is_available() and run["compile_reason"].startswith("auto")
    assert run["optimizer"]


@pytest.mark.parametrize("override, needle", [
    ("base_model=/nonexistent/model", "does not exist"),
    ("datasets.0.path=missing.jsonl", "no data file"),
    ("lerning_rate=1", "did you mean `learning_rate`"),
])
def test_bad_input_exits_2_without_traceback_or_output(make_recipe, tmp_path, override, needle):
    recipe = make_recipe("completion", n=4)
    proc = subprocess.run([sys.executable, "-m", "finetune.cli", "train", str(recipe), "--set", override],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_example_tiny_recipe_trains(tiny_model_dir, tmp_path):
    from pathlib import Path

    recipe_path = Path(__file__).parent.parent / "examples" / "tiny" / "recipe.yml"
    recipe = load_recipe(recipe_path, [f"base_model={tiny_model_dir}", f"output_dir={tmp_path / 'tiny'}",
                                       f"cache_dir={tmp_path / 'cache'}", "max_steps=2"])
    summary = run_training(recipe)
    assert summary["steps"] == 2 and summary["plan"]["examples_per_step"] == 8
    assert (tmp_path / "tiny" / "adapter_model.safetensors").is_file()


def test_tensorboard_logs_land_in_output_dir_not_cwd(make_recipe, tmp_path, monkeypatch):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    run_training(load_recipe(make_recipe("completion", n=8, adapter="lora", max_steps=1, report_to=["tensorboard"])))
    assert list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert list(cwd.iterdir()) == []


def test_auto_learning_rate_curves_and_throughput_are_recorded(make_recipe, tmp_path):
    recipe = load_recipe(make_recipe("instruction", n=16, adapter="lora", val_set_size=4, max_steps=4,
                                     learning_rate="auto", lr_base=1e-3, lr_pretrained_batch_tokens=4000))
    summary = run_training(recipe)
    plan = summary["learning_rate_plan"]
    expected = 1e-3 * (plan["supervised_tokens"] / plan["total_steps"] * plan["num_epochs"] / 4000) ** 0.5
    assert plan["total_steps"] == 4 and summary["learning_rate"] == pytest.approx(expected, rel=1e-6)
    assert summary["recipe"]["learning_rate"] == "auto"
    assert (tmp_path / "out" / "loss_curve.png").stat().st_size > 1000
    assert summary["curves"]["verdict"] in {"underfit", "overfit", "well-fit", "too short"}
    assert any("tokens_per_second" in k or "tokens/s" in k for e in summary["log_history"] for k in e), \
        summary["log_history"][-3:]


class EvalCounter(TrainerCallback):
    """Counts evaluations by the step they ran at."""

    def __init__(self):
        self.at_step = Counter()

    def on_evaluate(self, args, state, control, **kwargs):
        self.at_step[state.global_step] += 1


@pytest.mark.parametrize("eval_steps", [None, 3, 2])  # each epoch's end; a divisor of the 3 steps; not one
def test_the_final_evaluation_runs_once(make_recipe, eval_steps):
    """Issue 14 item 6: the Trainer's own last evaluation (epoch end, or an eval_steps that lands on the last
    step) was followed by a second, identical one; now it is reused, and run only when none fell on the
    last step."""
    recipe = load_recipe(make_recipe("completion", n=16, val_set_size=4, eval_steps=eval_steps))
    counter = EvalCounter()
    summary = run_training(recipe, extra_callbacks=[counter])
    final = summary["steps"]
    assert final == 3  # 12 train examples / 4 per step
    assert counter.at_step[0] == 1 and counter.at_step[final] == 1, counter.at_step
    expected = {None: {0, 3}, 3: {0, 3}, 2: {0, 2, 3}}[eval_steps]
    assert set(counter.at_step) == expected
    final_evals = [e["eval_loss"] for e in summary["log_history"] if "eval_loss" in e and e["step"] == final]
    assert final_evals == [summary["final_eval_loss"]]


class AutocastSeen(TrainerCallback):
    """Records, for each training forward pass, the CPU autocast dtype in force (None: autocast off)."""

    def __init__(self):
        self.seen = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def hook(module, inputs):
            if module.training:
                self.seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)

        model.get_input_embeddings().register_forward_pre_hook(hook)  # inside the forward accelerate wraps


@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_bf16_on_a_cpu_trains_in_bf16(make_recipe, tmp_path, adapter, capsys):
    """Issue 33 item 7: `precision: bf16` (axolotl's `bf16: true`, ported) on a machine without a GPU ended in
    transformers' "Your setup doesn't support bf16/gpu" traceback. It trains, under torch's CPU bf16 autocast, and
    the log says what that costs there."""
    recipe = load_recipe(make_recipe("completion", n=8, adapter=adapter, precision="bf16", max_steps=2))
    seen = AutocastSeen()
    summary = run_training(recipe, extra_callbacks=[seen])
    assert summary["steps"] == 2 and seen.seen and set(seen.seen) == {torch.bfloat16}
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert summary["precision"] == run["precision"] == "bf16"
    assert "precision: bf16 on CPU" in capsys.readouterr().err
