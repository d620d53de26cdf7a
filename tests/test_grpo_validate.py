"""Broken reward functions are caught before a run: `finetune validate` runs each on a few records in the reward
workers with its timeout (the docs and the run's stop message say so), every way a function can break is one line
naming it, exit 2; a signature that cannot take the call is located in the user's file at validate and stops a run
before its model loads; what a call prints is capped and counted, under validate and preprocess alike."""

from __future__ import annotations

import logging
import re

import pytest
import yaml

from grpo_helpers import grpo_recipe

BROKEN = '''import os, sys, time


def returns_none(completions, **kwargs):
    [0.0 for _ in completions]  # no return


def returns_text(completions, **kwargs):
    return "1.0"


def short_list(completions, **kwargs):
    return [1.0]


def raises(completions, **kwargs):
    raise KeyError("answer")


def sleeps(completions, **kwargs):
    time.sleep(600)


def exits(completions, **kwargs):
    sys.exit(3)


def dies(completions, **kwargs):
    os._exit(1)


def prints(completions, **kwargs):
    print("x" * 1_000_000)
    return [0.0] * len(completions)


def imports(completions, **kwargs):
    import no_such_module_xyz  # noqa: F401
    return [0.0] * len(completions)


def singular(completion):
    return [0.0]


def needs_answer(completions, answer):
    return [0.0] * len(completions)


def chatty(completions, **kwargs):
    print("scored", len(completions))
    return [1.0] * len(completions)
'''

# name -> what its line must say (the FAILED line names the kind and the cause)
EXPECTED = {
    "returns_none": "FAILED: not_a_list: returned None, not a list of one value per completion",
    "returns_text": "FAILED: not_a_list: returned a str",
    "short_list": "FAILED: wrong_length: returned 1 values for 3 completions",
    "raises": "FAILED: exception: KeyError: 'answer' at {file} line 17",
    "sleeps": "FAILED: timeout: took longer than timeout_s 1 s",
    "exits": "FAILED: exception: SystemExit: 3 at {file} line 25",
    "dies": "FAILED: exception: its worker process died (exit code 1)",
    "prints": "FAILED: printed 1,000,001 bytes in one call; a run logs the first 4,096",
    "imports": "FAILED: exception: ModuleNotFoundError: No module named 'no_such_module_xyz' at {file} line 38",
    "singular": ("FAILED: reward `{file}:singular` ({file} line 42): its signature (completion) cannot take the "
                 "keyword call: `completion` (did you mean `completions`?) is required"),
    "needs_answer": "`answer` is required but is neither",
}


def _validate(path, capsys) -> tuple[int, str, str]:
    from finetune.cli import main

    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_model_dir):
    """A GRPO recipe whose rewards are one that works, one that prints a line, and every broken one."""
    root = tmp_path_factory.mktemp("broken_rewards")
    (root / "broken.py").write_text(BROKEN)
    rewards = [{"function": "rewards.py:names_the_word"}, {"function": "broken.py:chatty"}]
    rewards += [{"function": f"broken.py:{name}", **({"timeout_s": 1} if name == "sleeps" else {})}
                for name in EXPECTED]
    grpo_recipe(root, tiny_model_dir, rewards=rewards)
    return root


def test_validate_runs_every_reward_and_names_each_broken_one(folder, capsys):
    code, out, err = _validate(folder / "recipe.yml", capsys)
    assert code == 2
    file = str(folder / "broken.py")
    assert re.search(r"reward names_the_word: ok \[\d", out), out
    assert "reward chatty: ok [1, 1, 1]" in out and "it printed 9 bytes:" in out and "scored 3" in out
    for name, said in EXPECTED.items():
        line = next((x for x in out.splitlines() if x.strip().startswith(f"reward {name}:")), "")
        assert said.format(file=file) in line, (name, line)
    assert "x" * 400 not in out + err  # the 1 MB print is not echoed whole
    assert "counted in run.json" not in err  # no run, no run.json: the lines above say each failure


def test_validate_passes_a_recipe_whose_rewards_work(folder, capsys):
    recipe = yaml.safe_load((folder / "recipe.yml").read_text())
    path = folder / "good.yml"
    path.write_text(yaml.safe_dump({**recipe, "rewards": recipe["rewards"][:2]}))
    code, out, _ = _validate(path, capsys)
    assert code == 0, out
    assert "rewards on 3 records" in out and "reward chatty: ok" in out


def test_a_signature_that_cannot_take_the_records_stops_a_run_before_its_model_loads(folder, tmp_path):
    from finetune.errors import RewardError
    from finetune.recipe import load_recipe
    from finetune.train.run import run_training

    recipe = load_recipe(folder / "recipe.yml", [f"output_dir={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}"])
    recipe = recipe.model_copy(update={"rewards": [r for r in recipe.rewards if r.function.endswith(
        ("names_the_word", "singular", "needs_answer"))]})
    with pytest.raises(RewardError) as info:
        run_training(recipe)
    message = str(info.value)
    assert f"{folder / 'broken.py'} line 42" in message and f"{folder / 'broken.py'} line 46" in message
    assert "its signature (completion)" in message and "`answer` is required" in message
    assert "reward_functions.py" not in message  # located in the user's file, never in the library
    assert not (tmp_path / "out").exists()


def test_preprocess_caps_what_a_reward_prints(folder, capsys):
    from finetune.cli import main

    recipe = yaml.safe_load((folder / "recipe.yml").read_text())
    path = folder / "printing.yml"
    path.write_text(yaml.safe_dump({**recipe, "rewards": [r for r in recipe["rewards"]
                                                          if r["function"].endswith(("prints", "chatty"))]}))
    code = main(["preprocess", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    assert "reward prints: FAILED: printed 1,000,001 bytes" in captured.out
    assert len(captured.out) + len(captured.err) < 20_000  # not the megabyte


def test_a_run_logs_what_a_reward_prints_capped_and_counts_it(folder):
    from finetune.train.grpo.reward_worker import OUTPUT_CAP
    from finetune.train.grpo.rewards import RewardRunner, RewardSpec

    from finetune.log import get_logger

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    get_logger().addHandler(handler)
    try:
        with RewardRunner([RewardSpec("broken.py:prints", 1.0, 10), RewardSpec("broken.py:chatty", 1.0, 10)],
                          folder) as runner:
            for _ in range(2):
                batch = runner.score(["p", "q"], ["a", "b"], [[1], [2]])
            summary = runner.failure_summary()
    finally:
        get_logger().removeHandler(handler)
    printed = [line for line in logged if line.startswith("reward `prints` printed")]
    assert printed[1].startswith("reward `prints` printed 1,000,001 bytes in call 2, the first 4,096 shown:\n")
    assert len(printed) == 2 and all(len(line) < OUTPUT_CAP + 100 for line in printed)
    assert "reward `chatty` printed 9 bytes in call 1:\nscored 2" in logged
    assert batch.values == [[0.0, 0.0], [1.0, 1.0]]  # printing is no failure in a run
    text, size = batch.printed["prints"]
    assert size == 1_000_001 and len(text) == OUTPUT_CAP
    assert summary["prints"]["printed"] == {"calls": 2, "bytes": 2_000_002, "cut": 2}
    assert summary["chatty"]["printed"] == {"calls": 2, "bytes": 2 * len("scored 2\n"), "cut": 0}
