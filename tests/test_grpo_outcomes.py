"""How a GRPO run ends, on the tiny model: a short run whose only reward never gave a value says so and exits 2
(the stop after 5 failed batches never fires in 3 steps); rewards that failed on every call are named in the done
line and the verdict; the done line gives the reward, not the surrogate loss; completions.jsonl keeps each
function's value per answer; no loss spikes are looked for on the surrogate; the plot has a panel per function and
its whole verdict in the title."""

from __future__ import annotations

import json
import logging

import pytest

from grpo_helpers import grpo_recipe
from finetune.recipe import load_recipe

FAILING = "\n\n".join(f"def fail_{i}(completions, **kwargs):\n    raise ValueError('broken {i}')" for i in range(7))
FAILING += "\n\n\ndef nothing(completions, **kwargs):\n    return [None] * len(completions)\n"
WORKING = [{"function": "rewards.py:even_tokens"}, {"function": "rewards.py:short"}]
BROKEN = [{"function": f"failing.py:fail_{i}"} for i in range(7)] + [{"function": "failing.py:nothing"}]
FAST = {"adapter": "none", "learning_rate": 1e-2, "lr_scheduler": "constant"}


class Lines(logging.Handler):
    """The finetune logger's messages, as a list (a module-scoped fixture cannot use the function-scoped caplog)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run(tmp_path, base, lines: list[str], **overrides) -> dict:
    """The run's summary; `lines` receives the log's messages (also when the run raises)."""
    from finetune.log import get_logger
    from finetune.train.run import run_training

    (tmp_path / "failing.py").write_text(FAILING)
    handler, logger = Lines(), get_logger()
    handler.lines = lines
    logger.addHandler(handler)
    try:
        return run_training(load_recipe(grpo_recipe(tmp_path, base, **{**FAST, **overrides})))
    finally:
        logger.removeHandler(handler)


def done_line(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("done:"))


@pytest.fixture(scope="module")
def partly_failing(tmp_path_factory, tiny_model_dir):
    """Two steps with 10 reward functions, 8 of which never give a value (7 raise, 1 returns None)."""
    tmp_path = tmp_path_factory.mktemp("partly_failing")
    lines: list[str] = []
    summary = run(tmp_path, tiny_model_dir, lines, max_steps=2, rewards=WORKING + BROKEN)
    return tmp_path / "out", summary, done_line(lines)


def test_a_short_run_whose_only_reward_never_gave_a_value_fails_at_its_end(tmp_path, tiny_model_dir):
    from finetune.errors import RewardError

    lines: list[str] = []
    with pytest.raises(RewardError) as info:
        run(tmp_path, tiny_model_dir, lines, max_steps=3, rewards=[{"function": "failing.py:fail_0"}])
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "ended after 3 steps without a single reward" in message
    assert "`fail_0` (exception: ValueError: broken 0 at" in message and "failing.py line 2" in message
    record = json.loads((tmp_path / "out" / "run.json").read_text())  # the record is written first
    assert record["curves"]["verdict"] == "no reward" and record["grpo"]["reward_failures"]["fail_0"]["calls"] == 3
    assert json.loads((tmp_path / "out" / "diagnosis.json").read_text())["verdict"] == "no reward"
    assert any(line.startswith("learning curve: no reward") for line in lines)
    assert not any(line.startswith("done:") for line in lines)  # no "train loss 0.0000 -> 0.0000"
    assert not (tmp_path / "out" / "stopped.json").exists()  # it recorded itself: a finished run, not a stopped one


def test_rewards_that_never_gave_a_value_are_in_the_done_line_and_the_verdict(partly_failing):
    out, summary, line = partly_failing
    assert "8 of 10 reward functions never gave a value: `fail_0`, `fail_1`" in line and "`nothing`" in line
    assert line.startswith("done: 2 steps, reward ") and "means of the first and last third of 2 logged steps" in line
    assert "loss" not in line  # neither the surrogate loss nor "eval loss - -> -"
    curves = summary["curves"]
    assert curves["verdict"] == "rewards failing" and curves["reward_verdict"] not in ("rewards failing", "no reward")
    assert f"Their reward: {curves['reward_verdict']}: " in curves["reason"]  # the working ones' verdict, kept
    assert "8 of 10 reward functions gave no value in any call" in curves["reason"]
    assert "`fail_3` (exception: ValueError: broken 3 at" in curves["reason"]
    assert "`nothing` (returned None for every completion)" in curves["reason"]
    assert "learned from the other 2 only" in curves["reason"]


def test_completions_keep_each_functions_value_and_the_surrogate_has_no_spikes(partly_failing):
    out, summary, _ = partly_failing
    sample = json.loads((out / "completions.jsonl").read_text().splitlines()[0])
    by_function = sample["rewards_by_function"]
    assert list(by_function) == ["even_tokens", "short", *[f"fail_{i}" for i in range(7)], "nothing"]
    assert all(len(values) == 4 for values in by_function.values())
    assert by_function["fail_0"] == [None] * 4 and by_function["nothing"] == [None] * 4
    total = [e + s for e, s in zip(by_function["even_tokens"], by_function["short"])]
    assert sample["rewards"] == pytest.approx(total)  # weights 1: the total is their sum
    record = json.loads((out / "run.json").read_text())
    assert record["loss_spikes"] is None


def test_the_plot_has_a_panel_per_reward_function_and_its_whole_verdict(partly_failing):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401 - the figure draws with Agg

    from finetune.train.curves import grpo_figure

    out, summary, _ = partly_failing
    history = summary["log_history"]
    fig = grpo_figure(history, summary["curves"])
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert [t for t in titles if t.startswith("reward: ")] == sorted(  # in the log's order: by name
        ["reward: even_tokens", "reward: short", *[f"reward: fail_{i}" for i in range(7)], "reward: nothing"])
    assert "reward (weighted total)" in titles and "completion length" in titles
    fig.canvas.draw()
    title = next(t for t in fig.texts if t.get_text().startswith("rewards failing"))
    assert " ".join(title.get_text().split()) == " ".join(f"rewards failing: {summary['curves']['reason']}".split())
    box, page = title.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert (out / "loss_curve.png").is_file()
