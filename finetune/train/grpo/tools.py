"""The recipe's environment and tools, run in worker processes for the training process, every call with its
timeout and every failure counted.

    with ToolRunner(recipe.environment, recipe.tools, base_dir, timeout_s=30) as tools:
        tools.reset([(slot, record), ...])              # one environment instance per rollout slot: observations
        tools.call([(slot, name, arguments), ...], cap)  # each call's ToolOutcome: the text the model reads
        tools.rewards([slot, ...])                      # each slot's environment's get_reward()

A slot's requests go to worker slot % workers, which keeps its environment instance between turns (TRL's one instance
per rollout, made once and reset before each episode). Workers run their requests in parallel, each worker one at a
time. A request that takes longer than `timeout_s` gets a timeout failure, and its worker is killed (its process
group: whatever the tool started goes too) and replaced; the environments it held are lost, so the later calls of
those slots in this step fail with `no_environment` (counted) until the next step resets them. A worker that dies
(os._exit, a crash) is replaced the same way. Nothing of the user's code is imported here.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from finetune.train.grpo.reward_worker import START_METHOD, WorkerProcess, stop_all

WORKERS = 2  # tool calls of a turn run in parallel over this many processes (a step's rollouts split between them)


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    value: object  # the result (ok) or the failure's message (for the log and run.json)
    kind: str | None = None  # the failure's kind
    seconds: float = 0.0
    shown: str | None = None  # a failure: what the model reads, {'error': shown} (TRL's: an exception's str())


class ToolRunner:
    def __init__(self, environment: str | None, tools: list[str], base_dir, timeout_s: float, workers: int = WORKERS):
        self.specs = [environment or "", *tools]
        self.base_dir = Path(base_dir)
        self.timeout_s = float(timeout_s)
        self.failures: Counter = Counter()  # kind -> failed requests, the run's whole life
        self.first_messages: dict[str, str] = {}
        self.replaced = 0  # workers killed and started anew (a hang, a death)
        self._context = get_context(START_METHOD)
        self._workers: list[WorkerProcess] = []
        self._finalizer = weakref.finalize(self, stop_all, self._workers)
        try:
            for _ in range(max(1, workers)):
                self._workers.append(self._start())
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    def _start(self) -> WorkerProcess:
        from finetune.train.grpo.tool_worker import tool_worker_main

        return WorkerProcess(self._context, self.specs, self.base_dir, target=tool_worker_main,
                             name="finetune-tool-worker")

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._finalizer()

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # --- requests ------------------------------------------------------------------------------------------------
    def reset(self, rows: list[tuple[int, dict]]) -> list[ToolOutcome]:
        return self.run([("reset", slot, row) for slot, row in rows])

    def call(self, calls: list[tuple[int, str, object]], cap: int) -> list[ToolOutcome]:
        return self.run([("call", slot, name, arguments, cap) for slot, name, arguments in calls])

    def rewards(self, slots: list[int]) -> list[ToolOutcome]:
        return self.run([("reward", slot) for slot in slots])

    def run(self, requests: list[tuple]) -> list[ToolOutcome]:
        """Every request's outcome, in order. Each worker takes its slots' requests one at a time."""
        queues = [deque() for _ in self._workers]
        for index, request in enumerate(requests):
            queues[request[1] % len(self._workers)].append(index)
        outcomes: list[ToolOutcome | None] = [None] * len(requests)
        running: dict[int, tuple[int, float, float]] = {}  # worker -> (request index, started, deadline)
        try:
            while any(queues) or running:
                for w, queue in enumerate(queues):
                    if w not in running and queue:
                        index = queue.popleft()
                        self._workers[w].conn.send(requests[index])
                        started = time.monotonic()
                        running[w] = (index, started, started + self.timeout_s)
                self._collect(running, outcomes)
        except BaseException:  # interrupted with calls in flight: the workers cannot be reused
            self.close()
            raise
        return outcomes  # type: ignore[return-value]

    def _collect(self, running: dict, outcomes: list) -> None:
        if not running:
            return
        nearest = min(deadline for _, _, deadline in running.values())
        ready = wait([self._workers[w].conn for w in running], timeout=max(0.0, nearest - time.monotonic()))
        for w, (index, started, deadline) in list(running.items()):
            worker = self._workers[w]
            if worker.conn in ready or worker.conn.poll():
                try:
                    reply = worker.conn.recv()
                except (EOFError, OSError):  # the tool ended its worker: os._exit(), a crash, the OOM killer
                    worker.kill()
                    code = worker.process.exitcode
                    outcomes[index] = self._failed("died", f"its worker process died (exit code {code})")
                    self._replace(w)
                else:
                    seconds = time.monotonic() - started
                    outcomes[index] = (ToolOutcome(True, reply[1], None, seconds) if reply[0] == "ok"
                                       else self._failed(reply[1], reply[2], seconds, reply[3]))
                del running[w]
            elif time.monotonic() >= deadline:
                outcomes[index] = self._failed("timeout", f"took longer than tool_timeout_s {self.timeout_s:g} s; its "
                                               "worker was killed", self.timeout_s)
                self._replace(w)
                del running[w]

    def _replace(self, w: int) -> None:
        """A fresh worker in place of w; the environments w held are gone, so its slots' later calls in this step
        fail with `no_environment` (the fresh worker has no instance for them) until the next reset."""
        self._workers[w].kill()
        self._workers[w] = self._start()
        self._workers[w].wait_ready()
        self.replaced += 1

    def _failed(self, kind: str, message: str, seconds: float = 0.0, shown: str | None = None) -> ToolOutcome:
        self.failures[kind] += 1
        self.first_messages.setdefault(kind, message)
        return ToolOutcome(False, message, kind, seconds, message if shown is None else shown)
