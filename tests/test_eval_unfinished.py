"""Issue 33, item 5: an lm-eval task that does not exist is refused at validate (not after training), and
`finetune eval` of a run that crashed evaluates its newest checkpoint instead of sending the user in a circle."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import make_records, write_jsonl
from finetune.cli import main as cli_main
from finetune.recipe import load_recipe


def _recipe(root, tiny_model_dir, **extra) -> dict:
    write_jsonl(root / "instruction.jsonl", make_records("instruction", 32))
    return {"base_model": str(tiny_model_dir), "datasets": [{"path": "instruction.jsonl", "type": "instruction"}],
            "adapter": "lora", "lora_r": 8, "max_steps": 4, "micro_batch_size": 8, "learning_rate": 3e-2,
            "val_set_size": 8, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"],
            "logging_steps": 1, **extra}


def test_an_lm_eval_task_that_does_not_exist_is_refused_at_validate_and_before_training(tmp_path, tiny_model_dir,
                                                                                         capsys):
    """Looked up where validate and the training's main process check the machine (finetune/train/preflight.py),
    not in every load_recipe: a launched worker's load_recipe does not import lm_eval (tests/test_preflight.py)."""
    pytest.importorskip("lm_eval")  # installed here (lm-eval 0.4.13): the names are checked with its YAML loader
    from finetune.errors import MachineError
    from finetune.train.preflight import check_machine

    recipe = _recipe(tmp_path, tiny_model_dir, eval={"tasks": ["tiny_facts", "hellaswagg"]})
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(MachineError) as err:
        check_machine(load_recipe(tmp_path / "recipe.yml"), "recipe.yml")
    message = str(err.value)
    assert "`eval.tasks`" in message and "unknown lm-eval task hellaswagg" in message and "tiny_facts" in message
    for verb in ("validate", "train"):
        capsys.readouterr()
        assert cli_main([verb, str(tmp_path / "recipe.yml")]) == 2
        out = capsys.readouterr()
        assert "hellaswagg" in out.err and "Traceback" not in out.err
    assert not (tmp_path / "out").exists()  # refused before the run wrote anything
    # a task of the user's own folder is found there
    tasks = tmp_path / "tasks"
    from finetune.lm_eval_tasks import SHIPPED_TASKS

    shutil.copytree(SHIPPED_TASKS / "tiny_facts", tasks / "facts")
    text = (tasks / "facts" / "tiny_facts.yaml").read_text().replace("task: tiny_facts", "task: hellaswagg")
    (tasks / "facts" / "tiny_facts.yaml").write_text(text)
    recipe["eval"]["tasks_dir"] = str(tasks)
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    assert check_machine(load_recipe(tmp_path / "recipe.yml"), "recipe.yml") is None


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, tiny_model_dir):
    """A run that saved checkpoints at steps 2 and 4, then died before its final model and run.json."""
    root = tmp_path_factory.mktemp("crashed")
    (root / "recipe.yml").write_text(yaml.safe_dump(_recipe(root, tiny_model_dir, checkpoint_interval=2,
                                                            max_checkpoints=2)))
    assert cli_main(["train", str(root / "recipe.yml")]) == 0
    out = root / "out"
    for name in ("adapter_config.json", "adapter_model.safetensors", "run.json"):
        (out / name).unlink()
    assert (out / "checkpoints" / "step-4" / "adapter_config.json").is_file()
    return root


def test_eval_of_a_crashed_run_evaluates_its_newest_checkpoint(crashed, capsys):
    assert cli_main(["eval", str(crashed / "recipe.yml"), "--generations", "1", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr()
    assert "checkpoints/step-4" in out.err  # it says which checkpoint it evaluated, and why
    report = json.loads((crashed / "out" / "eval" / "report.json").read_text())
    assert report["run"].endswith("checkpoints/step-4") and report["checkpoint_step"] == 4
    assert report["prompt_format"].startswith("alpaca")  # the recipe's instruction records, not a guess
    sides = report["heldout"]["sides"]
    assert sides["tuned"]["loss"] < sides["base"]["loss"]


def test_the_folder_or_a_checkpoint_of_a_crashed_run_says_exactly_how_to_evaluate_it(crashed, capsys):
    for target in (crashed / "out", crashed / "out" / "checkpoints" / "step-2"):
        assert cli_main(["eval", str(target)]) != 0
        err = capsys.readouterr().err
        assert "did not finish" in err and "finetune eval RECIPE.yml" in err, err
        assert "checkpoints/step-4" in err and "Traceback" not in err, err
        assert "train first" not in err.lower(), err


def test_a_checkpoint_of_a_finished_run_is_evaluated_with_its_runs_record(tmp_path, tiny_model_dir):
    """The overfit verdict names a checkpoint to use: it can be evaluated as it is (its run's run.json says the
    recipe, data and format); the report goes beside the checkpoint, not over the final model's."""
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(_recipe(tmp_path, tiny_model_dir, checkpoint_interval=2,
                                                                max_checkpoints=2)))
    assert cli_main(["train", str(tmp_path / "recipe.yml")]) == 0
    checkpoint = tmp_path / "out" / "checkpoints" / "step-2"
    assert cli_main(["eval", str(checkpoint), "--generations", "0"]) == 0
    report = json.loads((checkpoint / "eval" / "report.json").read_text())
    assert report["run"] == str(checkpoint) and report["prompt_format"].startswith("alpaca")
    assert not (tmp_path / "out" / "eval").exists()
