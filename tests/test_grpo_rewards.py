"""GRPO reward functions (finetune/reward_functions.py, finetune/train/grpo/rewards.py): loaded from a file or a
module, each loading mistake one RewardError naming the spec and the file, TRL-style functions called unchanged in
worker processes, and every way a function can fail (raise, hang, die, wrong length, not a number) costing that
function's values of that batch only, while the run goes on. One runner (two spawned workers) serves most tests.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from finetune.errors import FinetuneError, RewardError
from finetune.reward_functions import check_reward, load_reward
from finetune.train.grpo.reward_check import sample_check
from finetune.train.grpo.rewards import RewardRunner, RewardSpec

REWARDS = '''
import os, subprocess, time

def length(prompts, completions, **kwargs):
    """TRL style: **kwargs takes whatever else the trainer passes."""
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]

def exact(completions, answer):
    """Named parameters only, one of them a column of the records."""
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

def flaky(completions, mode, trainer_state, log_metric, **kwargs):
    m = mode[0]
    log_metric("flaky_calls", 1)
    if m == "raise":
        raise ValueError("no answer found")
    if m == "hang":
        time.sleep(60)
    if m.startswith("spawn:"):  # a sandbox it started, then hangs
        child = subprocess.Popen(["sleep", "60"])
        open(m[len("spawn:"):], "w").write(str(child.pid))
        time.sleep(60)
    if m == "exit":
        os._exit(3)
    if m == "short":
        return [1.0]
    if m == "text":
        return ["1.0"] * len(completions)
    if m == "inf":
        return [float("inf")] * len(completions)
    if m == "none":
        return [None] * len(completions)
    if m == "some_none":
        return [None] + [1.0] * (len(completions) - 1)
    if m == "step":
        return [float(trainer_state.global_step)] * len(completions)
    return [0.5] * len(completions)
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recipe")
    (root / "rewards.py").write_text(REWARDS)
    (root / "sub").mkdir()
    (root / "sub" / "rewards.py").write_text("def length(completions, **kwargs):\n"
                                             "    return [-1.0 for _ in completions]\n")
    return root


@pytest.fixture(scope="module")
def runner(folder):
    specs = [RewardSpec("rewards.py:length", 1.0, 10), RewardSpec("rewards.py:exact", 1.0, 10),
             RewardSpec(str(folder / "rewards.py") + ":flaky", 0.5, 1)]  # an absolute path works too
    with RewardRunner(specs, folder, workers=2) as r:
        yield r


def score(runner, mode: str, **kw):
    completions = ["42", "seven"]
    return runner.score(["q1", "q2"], completions, [[4, 2], [7]], {"answer": ["42", "7"], "mode": [mode, mode]}, **kw)


def gone(pid: int) -> bool:
    """No such process (a zombie still counts as there: nobody reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- loading -----------------------------------------------------------------------------------------------------
def test_load_from_a_relative_file_an_absolute_file_and_a_module(folder):
    assert load_reward("rewards.py:length", folder)(prompts=["p"], completions=["abc"]) == [3.0]
    assert load_reward(f"{folder}/rewards.py:exact", "/elsewhere")(completions=["a"], answer=["a"]) == [1.0]
    import trl.rewards

    assert load_reward("trl.rewards:think_format_reward", folder) is trl.rewards.think_format_reward


def test_two_files_named_rewards_py_stay_two_modules(folder):
    top, nested = load_reward("rewards.py:length", folder), load_reward("sub/rewards.py:length", folder)
    assert top(prompts=["p"], completions=["abc"]) == [3.0]
    assert nested(completions=["abc"]) == [-1.0]
    assert top.__module__ != nested.__module__


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("case, text, spec, expected", [
    ("missing", None, "missing.py:f", ["does not exist", "missing.py"]),
    ("no colon", None, "rewards.py", ["FILE.py:NAME"]),
    ("syntax", "x = 1\ndef f(:\n    pass\n", "bad_syntax.py:f", ["line 2", "syntax error", "bad_syntax.py"]),
    ("name", None, "rewards.py:correct", ["has no `correct`", "it has: exact, flaky, length", "rewards.py"]),
    ("not callable", "THRESHOLD = 3\n", "constant.py:THRESHOLD", ["is a int, not a function", "constant.py"]),
    ("import fails", "import json\nimport no_such_dependency_xyz\n", "imports.py:f",
     ["imports.py line 2", "ModuleNotFoundError", "no_such_dependency_xyz", "install"]),
    ("no module", None, "no_such_pkg_xyz.checks:f", ["no module named `no_such_pkg_xyz`", "PYTHONPATH"]),
])
def test_each_loading_mistake_is_one_reward_error_naming_spec_and_file(folder, case, text, spec, expected):
    if text is not None:
        _write(folder, spec.split(":")[0], text)
    with pytest.raises(RewardError) as err:
        load_reward(spec, folder)
    assert isinstance(err.value, FinetuneError) and err.value.exit_code == 2
    message = str(err.value)
    assert f"`{spec}`" in message
    for fragment in expected:
        assert fragment in message, (fragment, message)


def test_a_module_beside_the_recipe_that_is_not_on_the_path_gets_a_hint(folder):
    (folder / "my_pkg").mkdir(exist_ok=True)
    _write(folder, "my_pkg/checks.py", "def format_ok(completions, **kw):\n    return [1.0] * len(completions)\n")
    with pytest.raises(RewardError, match="write `my_pkg/checks.py:format_ok`"):
        load_reward("my_pkg.checks:format_ok", folder)
    assert load_reward("my_pkg/checks.py:format_ok", folder)(completions=["a"]) == [1.0]


def test_a_module_on_the_path_loads(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(folder))
    assert load_reward("my_pkg.checks:format_ok", None)(completions=["a", "b"]) == [1.0, 1.0]


@pytest.mark.parametrize("signature, columns, expected", [
    ("completions, /", None, "positional-only"),
    ("completions, solution", ["answer"], "`solution` is required but is neither"),
    ("*args", None, "takes no keyword arguments"),
    ("completions, **kw", ["prompts"], "a column `prompts`"),
])
def test_a_signature_that_cannot_take_the_keyword_call_is_refused(folder, signature, columns, expected):
    _write(folder, "sig.py", f"def f({signature}):\n    return []\n")
    func = load_reward("sig.py:f", folder)
    with pytest.raises(RewardError) as err:
        check_reward(func, "sig.py:f", columns)
    assert "`sig.py:f`" in str(err.value) and "sig.py line 1" in str(err.value) and expected in str(err.value)


@pytest.mark.parametrize("signature, columns", [
    ("prompts, completions, **kwargs", ["answer"]),  # TRL's usual shape
    ("completions, answer", ["answer"]),  # named, one a column
    ("completions, solution", None),  # columns unknown: `solution` may be one
    ("completions, completion_ids, trainer_state=None", []),
])
def test_signatures_that_take_the_call_pass(folder, signature, columns):
    _write(folder, "sig_ok.py", f"def f({signature}):\n    return []\n")
    check_reward(load_reward("sig_ok.py:f", folder), "sig_ok.py:f", columns)


# --- running -------------------------------------------------------------------------------------------------------
def test_trl_style_functions_run_unchanged_in_workers(runner):
    batch = score(runner, "ok")
    assert batch.names == ["length", "exact", "flaky"]
    assert batch.values == [[2.0, 5.0], [1.0, 0.0], [0.5, 0.5]]
    assert batch.failures == {}
    assert batch.metrics == {"flaky_calls": [1.0]}  # log_metric reached the training process
    assert os.getpid() not in runner.worker_pids()


def test_trainer_state_is_read_as_trl_reads_it(runner):
    assert score(runner, "step", trainer_state={"global_step": 7}).values[2] == [7.0, 7.0]


@pytest.mark.parametrize("mode, kind, message", [
    ("raise", "exception", "ValueError: no answer found at"),
    ("short", "wrong_length", "returned 1 values for 2 completions"),
    ("text", "non_numeric", "value 0 is '1.0' (str), not a number"),
    ("inf", "non_numeric", "not a finite number"),
])
def test_a_failure_costs_that_function_that_batch_only(runner, mode, kind, message):
    before = runner.failures["flaky"][kind]
    batch = score(runner, mode)
    assert all(math.isnan(v) for v in batch.values[2])
    assert batch.values[:2] == [[2.0, 5.0], [1.0, 0.0]]  # the others' values intact
    assert batch.failures["flaky"][0] == kind and message in batch.failures["flaky"][1]
    assert runner.failures["flaky"][kind] == before + 1
    assert runner.failures["length"] == {} and runner.failures["exact"] == {}
    summary = runner.failure_summary()["flaky"]
    assert summary["failures"][kind] >= 1 and summary["first_messages"][kind]
    assert score(runner, "ok").values[2] == [0.5, 0.5]


def test_none_is_missing_not_a_failure(runner):
    counted = sum(runner.failures["flaky"].values())
    assert all(math.isnan(v) for v in score(runner, "none").values[2])
    some = score(runner, "some_none").values[2]
    assert math.isnan(some[0]) and some[1] == 1.0
    assert sum(runner.failures["flaky"].values()) == counted


def test_a_hang_is_killed_and_the_next_call_works(runner):
    pids = runner.worker_pids()
    started = time.monotonic()
    batch = score(runner, "hang")  # sleeps 60 s; timeout_s is 1
    assert time.monotonic() - started < 15  # the timeout, a kill and a fresh worker: about 1.2 s on 2 cores
    assert batch.failures["flaky"][0] == "timeout" and "timeout_s 1" in batch.failures["flaky"][1]
    assert batch.values[:2] == [[2.0, 5.0], [1.0, 0.0]]
    killed = set(pids) - set(runner.worker_pids())
    assert len(killed) == 1 and all(gone(pid) for pid in killed)  # killed and reaped
    started = time.monotonic()
    assert score(runner, "ok").values == [[2.0, 5.0], [1.0, 0.0], [0.5, 0.5]]
    assert time.monotonic() - started < 5


def test_what_a_hung_function_started_is_killed_with_it(runner, tmp_path):
    pidfile = tmp_path / "child.pid"
    assert score(runner, f"spawn:{pidfile}").failures["flaky"][0] == "timeout"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _dead_or_zombie(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead_or_zombie(child), "the `sleep 60` the reward function started outlived its worker"


def _dead_or_zombie(pid: int) -> bool:
    # the orphan's new parent (init, or a container's first process) reaps it when it gets round to it
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_worker_that_dies_is_counted_and_replaced(runner):
    batch = score(runner, "exit")
    assert batch.failures["flaky"] == ("exception", "its worker process died (exit code 3)")
    assert score(runner, "ok").values[2] == [0.5, 0.5]


def test_bad_inputs_are_refused(runner):
    with pytest.raises(ValueError, match="answer has 1 entries for 2 prompts"):
        runner.score(["a", "b"], ["x", "y"], [[1], [2]], {"answer": ["x"], "mode": ["ok", "ok"]})
    with pytest.raises(RewardError, match="column.*completion_ids"):
        runner.score(["a"], ["x"], [[1]], {"completion_ids": [[1]]})
    assert score(runner, "ok").failures == {}


def test_every_function_failing_for_n_batches_in_a_row_stops_the_run(folder):
    with RewardRunner([RewardSpec("rewards.py:flaky", 1.0, 5)], folder, max_failed_steps=3) as one:
        for mode in ("raise", "none", "ok", "raise", "raise"):  # "ok" gives values: the count starts again
            score(one, mode)
        assert one.failed_steps == 2
        with pytest.raises(RewardError) as err:
            score(one, "raise")
    message = str(err.value)
    assert "3 batches in a row" in message and "`flaky`: exception: ValueError: no answer found" in message


def test_close_leaves_no_process_behind(folder):
    runner = RewardRunner([RewardSpec("rewards.py:length", 1.0, 5)] * 2, folder, workers=2)
    pids = runner.worker_pids()
    assert len(pids) == 2 and not any(gone(p) for p in pids)
    runner.close()
    runner.close()  # twice is fine
    assert all(gone(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        runner.score(["a"], ["b"], [[1]])
    forgotten = RewardRunner([RewardSpec("rewards.py:length", 1.0, 5)], folder)
    pids = forgotten.worker_pids()
    del forgotten
    gc.collect()  # a runner nobody closed stops its workers when it is collected (and at exit)
    assert all(gone(p) for p in pids)
    assert not {p.pid for p in multiprocessing.active_children()} & set(pids)


def test_a_function_the_workers_cannot_load_fails_at_start(folder):
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(RewardError, match="`nope.py:f`: the file .*nope.py does not exist"):
        RewardRunner([RewardSpec("rewards.py:length", 1.0, 5), RewardSpec("nope.py:f", 1.0, 5)], folder, workers=2)
    assert {p.pid for p in multiprocessing.active_children()} <= before  # both workers stopped


# --- before a long run ---------------------------------------------------------------------------------------------
def test_sample_check_reports_each_function(folder):
    records = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"},
               {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6"}]
    specs = [RewardSpec("trl.rewards:think_format_reward", 1.0, 10),  # TRL's own, for chat completions
             RewardSpec("rewards.py:length", 1.0, 10), RewardSpec("rewards.py:missing", 1.0, 10),
             RewardSpec("rewards.py:exact", 1.0, 10)]
    results = sample_check(specs, records, "<think>\nadd\n</think>\n4", base_dir=folder)
    assert [r.name for r in results] == ["think_format_reward", "length", "missing", "exact"]
    assert results[0].ok and results[0].values == [1.0, 1.0]
    assert results[1].ok and results[1].values == [22.0, 22.0]  # chat completions: [{"role": "assistant", ...}]
    assert not results[2].ok and "has no `missing`" in results[2].error and "FAILED" in results[2].line()
    # `exact` compares the completion with `answer`, but a chat completion is a list of messages: 0.0, no error
    assert results[3].ok and results[3].values == [0.0, 0.0]
