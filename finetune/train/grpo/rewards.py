"""GRPO rewards: the recipe's reward functions, run outside the training process with a timeout, failures counted.

    with RewardRunner(recipe.rewards, base_dir=recipe_folder, workers=2) as runner:
        batch = runner.score(prompts, completions, completion_ids, columns={"answer": [...]})
        batch.values[f][i]        # function f's reward for completion i; NaN where missing
        runner.failure_summary()  # for run.json
    (finetune/train/grpo/reward_check.py runs each function once on a few records, before a run: validate, preprocess)

Each function runs in a worker process (finetune/train/grpo/reward_worker.py: why spawn, how a hang is killed)
with its own `timeout_s`. A call that raises, takes longer than its timeout, returns the wrong number of values
or a value that is not a number (or not a list: None, a string) leaves THAT function's values of that batch missing
(NaN), is counted and logged once per kind, and the run goes on; a hung worker is killed and replaced. A None value
means "does not apply" (NaN, left out of the rewards, as TRL does). Only when every function gives no value at all
for `max_failed_steps` batches in a row does score() raise a RewardError, which stops the run with what failed; a
shorter run learns at its end which functions never gave a value (`never_valued()`, finetune/train/grpo/setup.py).
What a call prints is logged up to OUTPUT_CAP bytes a call, and counted (reward_worker.py).

The functions of one batch run concurrently when `workers` > 1 (they are independent); each worker loads every
function, so any worker can run any of them.
"""

from __future__ import annotations

import math
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from finetune.errors import RewardError
from finetune.log import get_logger
from finetune.reward_functions import RESERVED, reward_name
from finetune.train.grpo.reward_worker import OUTPUT_CAP, START_METHOD, WorkerProcess, stop_all

log = get_logger(__name__)

FAILURE_KINDS = ("exception", "timeout", "not_a_list", "wrong_length", "non_numeric")
# Five batches in a row with no reward at all is no accident of one batch (a flaky network judge, one odd
# prompt): every function is broken for this data, and every further step would train on nothing.
MAX_FAILED_STEPS = 5


@dataclass(frozen=True)
class RewardSpec:
    """One reward as the runners need it (the recipe's `rewards:` entries carry the same fields, and the recipe holds
    their defaults): a function, or a reward model (`model`: its folder; finetune/train/grpo/reward_models.py)."""

    function: str | None  # FILE.py:NAME (relative to base_dir) or package.module:NAME
    weight: float
    timeout_s: float
    model: str | None = None
    normalize: bool = False  # z-scored within each group before the weighted sum (finetune/train/grpo/advantages.py)
    max_length: int | None = None
    batch_size: int = 8

    @property
    def label(self) -> str:
        return self.function or self.model


def as_spec(item) -> RewardSpec:
    """A RewardSpec from the recipe's entry (any object with function / weight / timeout_s, and a reward model's keys
    when it has them) or a dict."""
    if isinstance(item, RewardSpec):
        return item
    get = item.get if isinstance(item, dict) else lambda key, default=None: getattr(item, key, default)
    function, model = get("function"), get("model")
    return RewardSpec(None if function is None else str(function), float(get("weight")),
                      float(get("timeout_s") if get("timeout_s") is not None else 30.0),
                      None if model is None else str(model), bool(get("normalize") or False), get("max_length"),
                      int(get("batch_size") or 8))


def unique_names(specs: list) -> list[str]:
    """Each reward's name: a function's NAME, a reward model's folder name; the whole spec (or path) where two share a
    name (two files' `correct`). `specs`: RewardSpecs, recipe entries, or function specs as strings."""
    from finetune.reward_models import reward_model_name

    labels = [s if isinstance(s, str) else as_spec(s).label for s in specs]
    short = [reward_name(label) if isinstance(s, str) or as_spec(s).function else reward_model_name(label)
             for s, label in zip(specs, labels)]
    return [name if short.count(name) == 1 else label for name, label in zip(short, labels)]


@dataclass
class RewardBatch:
    """One batch's rewards: values[f][i] is function f's reward for completion i (NaN: missing)."""

    names: list[str]
    values: list[list[float]]
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (kind, message), this batch
    printed: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (first OUTPUT_CAP bytes, bytes)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # what the functions passed to log_metric
    extra: dict[str, list] = field(default_factory=dict)  # what they passed to log_extra (column -> values)


class RewardRunner:
    """Reward functions in `workers` worker processes. Close it (or use `with`); at exit it closes itself.
    `counted_in`: where later failures are counted, for the first failure's warning (None: no warnings, no output
    logged: the caller reports each batch's failures and output itself); `names`: the functions' names among all of a
    recipe's rewards (default: among these)."""

    def __init__(self, specs, base_dir, workers: int = 1, max_failed_steps: int = MAX_FAILED_STEPS,
                 counted_in: str | None = "run.json", names: list[str] | None = None):
        self.specs = [as_spec(s) for s in specs]
        if not self.specs:
            raise RewardError("GRPO needs at least one reward function: `rewards: [{function: rewards.py:NAME}]`")
        if any(s.function is None for s in self.specs):
            raise ValueError("RewardRunner runs reward functions; reward models score in the training process "
                             "(finetune/train/grpo/reward_models.py)")
        self.names = list(names) if names is not None else unique_names([s.function for s in self.specs])
        self.weights = [s.weight for s in self.specs]
        self.base_dir = Path(base_dir)
        self.max_failed_steps = max_failed_steps
        self.counted_in = counted_in
        self.calls: Counter = Counter()  # name -> calls made
        self.valued: Counter = Counter()  # name -> calls that gave at least one value (not failed, not all None)
        self.printed: dict[str, Counter] = {name: Counter() for name in self.names}  # calls, bytes, cut (over the cap)
        self.failures = {name: Counter() for name in self.names}  # name -> kind -> batches it failed
        self.first_messages: dict[str, dict[str, str]] = {name: {} for name in self.names}
        self.failed_steps = 0  # consecutive batches in which no function gave any value
        self._context = get_context(START_METHOD)
        self._workers: list[WorkerProcess] = []
        # the same list object for the runner's whole life: replacing a worker mutates it, so the finalizer (at
        # garbage collection or interpreter exit, for a runner nobody closed) stops the live ones
        self._finalizer = weakref.finalize(self, stop_all, self._workers)
        try:
            for _ in range(max(1, min(workers, len(self.specs)))):
                self._workers.append(self._start())  # every worker starts before any is waited for
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    def _start(self) -> WorkerProcess:
        return WorkerProcess(self._context, [s.function for s in self.specs], self.base_dir)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker and whatever its reward functions started. Safe to call twice."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # --- one batch ---------------------------------------------------------------------------------------------
    def score(self, prompts: list, completions: list, completion_ids: list, columns: dict | None = None,
              trainer_state: dict | None = None) -> RewardBatch:
        """Every function's rewards for a batch. `columns`: the records' other columns, one value per completion;
        `trainer_state`: e.g. {"global_step": 10, "max_steps": 100}, read by the functions as
        `trainer_state.global_step` (TRL passes its TrainerState; None when not given)."""
        if self.closed:
            raise RuntimeError("this RewardRunner is closed")
        columns = dict(columns or {})
        n = len(prompts)
        for label, values in [("completions", completions), ("completion_ids", completion_ids), *columns.items()]:
            if len(values) != n:
                raise ValueError(f"score(): {label} has {len(values)} entries for {n} prompts (one per completion)")
        clash = sorted(set(columns) & set(RESERVED))
        if clash:
            raise RewardError(f"the records have the column(s) {', '.join(clash)}, names the reward call passes "
                              "itself (TRL's keyword arguments); rename them in the records")
        if n == 0:
            return RewardBatch(list(self.names), [[] for _ in self.names])
        batch = {"prompts": list(prompts), "completions": list(completions),
                 "completion_ids": [list(ids) for ids in completion_ids], "columns": columns,
                 "trainer_state": dict(trainer_state) if trainer_state is not None else None}
        try:
            outcomes = self._run_all(batch)
        except BaseException:  # interrupted mid-batch (Ctrl-C): calls are in flight, so the workers cannot be reused
            self.close()
            raise
        return self._record(outcomes, n)

    def _run_all(self, batch: dict) -> list[tuple]:
        """Each function's outcome: ("ok", values, logs) or ("failed", kind, message, logs). A function waits for
        an idle worker; its timeout runs from the moment a worker takes it."""
        pending = deque(range(len(self.specs)))
        outcomes: list[tuple | None] = [None] * len(self.specs)
        while pending or any(w.call for w in self._workers):
            for worker in self._workers:
                if worker.call is None and pending:
                    index = pending.popleft()
                    worker.send(index, batch, self.specs[index].timeout_s)
            busy = [w for w in self._workers if w.call is not None]
            nearest = min(w.call[1] for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, nearest - time.monotonic()))
            for slot, worker in enumerate(list(self._workers)):
                if worker.call is None:
                    continue
                index, deadline = worker.call
                if worker.conn in ready or worker.conn.poll():  # poll: it may have answered while another was replaced
                    outcomes[index] = self._answer(slot, worker)
                elif time.monotonic() >= deadline:
                    limit = self.specs[index].timeout_s
                    outcomes[index] = ("failed", "timeout", f"took longer than timeout_s {limit:g} s; its worker was "
                                       "killed", {})
                    self._replace(slot)
        return outcomes

    def _answer(self, slot: int, worker: WorkerProcess) -> tuple:
        try:
            outcome = worker.conn.recv()
            worker.call = None
            return outcome
        except (EOFError, OSError):  # the function ended its worker: os._exit(), a crash in C code, the OOM killer
            worker.kill()  # reaps it: its exit code is known from here on
            code = worker.process.exitcode
            self._replace(slot)
            return ("failed", "exception", f"its worker process died (exit code {code})", {})

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._start()
        self._workers[slot].wait_ready()

    def _record(self, outcomes: list[tuple], n: int) -> RewardBatch:
        result = RewardBatch(list(self.names), [])
        for name, outcome in zip(self.names, outcomes):
            self.calls[name] += 1
            logs = outcome[-1]
            for key, values in logs.get("metrics", {}).items():
                result.metrics.setdefault(key, []).extend(values)
            for key, values in logs.get("extra", {}).items():
                result.extra.setdefault(key, []).extend(values)
            if logs.get("output"):
                self._printed(name, *logs["output"], result)
            if outcome[0] == "ok":
                result.values.append(outcome[1])
                self.valued[name] += any(not math.isnan(v) for v in outcome[1])
                continue
            kind, message = outcome[1], outcome[2]
            result.values.append([math.nan] * n)
            result.failures[name] = (kind, message)
            self.failures[name][kind] += 1
            if kind not in self.first_messages[name]:
                self.first_messages[name][kind] = message
                if self.counted_in:
                    log.warning(f"reward `{name}` failed ({kind}): {message}. Its values of this batch are left out; "
                                f"later failures of this kind are counted in {self.counted_in}")
        self._count_failed_step(result)
        return result

    def _printed(self, name: str, text: str, size: int, result: RewardBatch) -> None:
        """What one call printed: counted, and logged up to OUTPUT_CAP bytes."""
        counts = self.printed[name]
        counts["calls"] += 1
        counts["bytes"] += size
        counts["cut"] += size > OUTPUT_CAP
        result.printed[name] = (text, size)
        if self.counted_in:
            cut = f", the first {OUTPUT_CAP:,} shown" if size > OUTPUT_CAP else ""
            log.info(f"reward `{name}` printed {size:,} bytes in call {self.calls[name]}{cut}:\n{text.rstrip()}")

    def never_valued(self) -> list[str]:
        """The functions called at least once that never gave a single value (every call failed or returned None)."""
        return [name for name in self.names if self.calls[name] and not self.valued[name]]

    def _count_failed_step(self, result: RewardBatch) -> None:
        if any(not math.isnan(v) for values in result.values for v in values):
            self.failed_steps = 0
            return
        self.failed_steps += 1
        if self.failed_steps < self.max_failed_steps:
            return
        causes = [f"`{name}`: {result.failures[name][0]}: {result.failures[name][1]}" if name in result.failures
                  else f"`{name}`: returned None for every completion" for name in self.names]
        raise RewardError(f"no reward function gave a single value for {self.failed_steps} batches in a row, so "
                          f"training learns nothing; last batch: {'; '.join(causes)}. Fix the functions "
                          "(`finetune validate` runs each on a few records)")

    def failure_summary(self) -> dict:
        """For run.json: per function, its spec, calls, the calls that gave a value, failures by kind and the first
        message of each kind, and what it printed (calls, bytes, calls over the cap)."""
        return {name: {"function": spec.function, "calls": self.calls[name], "calls_with_a_value": self.valued[name],
                       "failures": {k: self.failures[name][k] for k in FAILURE_KINDS if self.failures[name][k]},
                       "first_messages": dict(self.first_messages[name]),
                       **({"printed": dict(self.printed[name])} if self.printed[name] else {})}
                for name, spec in zip(self.names, self.specs)}
