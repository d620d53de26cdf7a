"""The recipe's environment and tools, run in worker processes for the training process, every call with its
timeout and every failure counted.

    with ToolRunner(recipe.environment, recipe.tools, base_dir, timeout_s=30) as tools:
        tools.reset([(slot, record), ...])              # one environment instance per rollout slot: observations
        tools.call([(slot, name, arguments), ...], cap)  # each call's ToolOutcome: the text the model reads
        tools.rewards([slot, ...])                      # each slot's environment's get_reward()

A slot's requests go to worker slot % workers, which keeps its environment instance between turns (TRL's one instance
per rollout, made once and reset before each episode). Workers run their requests in parallel, each worker one at a
time. A request that takes longer than `timeout_s` gets a timeout failure, and its worker is killed (its process
group: whatever the tool started goes too) and replaced; a worker that dies (os._exit, a crash) is replaced the same
way. The environments the lost worker held are rebuilt in the fresh one by replaying each slot's requests since its
reset (the runner keeps them): a slot whose replay answers differently than the first time (an environment that draws
random numbers, reads the clock) is lost, and its later calls in this step fail with `no_environment` (counted) until
the next reset. The call that hung or killed its worker is not replayed: its episode goes on from the state before it,
the model told it failed. Nothing of the user's code is imported here.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from finetune.train.grpo.reward_worker import START_METHOD, WorkerPool, WorkerProcess

LOST = ("this rollout's environment was lost with its worker (a tool hung or ended its process) and could not be "
        "rebuilt: replayed, it answered differently")
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
        self.replayed = Counter()  # slots rebuilt in a fresh worker: "rebuilt", or "lost" (answered differently)
        self._history: dict[int, list[tuple[tuple, tuple]]] = {}  # slot -> (request, reply) since its reset
        self._lost: set[int] = set()  # slots whose environment could not be rebuilt, until their next reset
        from finetune.train.grpo.tool_worker import tool_worker_main

        context = get_context(START_METHOD)
        self._pool = WorkerPool(lambda: WorkerProcess(context, self.specs, self.base_dir, target=tool_worker_main,
                                                      name="finetune-tool-worker"), max(1, workers))
        self._workers = self._pool.workers

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._pool.close()

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

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
                    while w not in running and queue:
                        index = queue.popleft()
                        request = requests[index]
                        if request[0] == "reset":
                            self._lost.discard(request[1])
                            self._history[request[1]] = []
                        elif request[1] in self._lost:
                            outcomes[index] = self._failed("no_environment", LOST)
                            continue
                        self._workers[w].conn.send(request)
                        started = time.monotonic()
                        running[w] = (index, started, started + self.timeout_s)
                self._collect(requests, running, outcomes)
        except BaseException:  # interrupted with calls in flight: the workers cannot be reused
            self.close()
            raise
        return outcomes  # type: ignore[return-value]

    def _collect(self, requests: list[tuple], running: dict, outcomes: list) -> None:
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
                    if requests[index][0] != "reward":  # what changed the environment: replayed if its worker goes
                        self._history.setdefault(requests[index][1], []).append((requests[index], reply))
                del running[w]
            elif time.monotonic() >= deadline:
                outcomes[index] = self._failed("timeout", f"took longer than tool_timeout_s {self.timeout_s:g} s; its "
                                               "worker was killed", self.timeout_s)
                self._replace(w)
                del running[w]

    def _replace(self, w: int) -> None:
        """A fresh worker in place of w, and the environments w held rebuilt in it (the module's docstring)."""
        self._pool.replace(w)
        self.replaced += 1
        slots = [s for s in self._history if s % len(self._workers) == w and s not in self._lost]
        for k, slot in enumerate(slots):
            replay = self._replay(w, slot)
            self.replayed["rebuilt" if replay == "same" else "lost"] += 1
            if replay == "same":
                continue
            self._lost.add(slot)
            if replay == "broken":  # the replay hung or killed the worker: start clean, the other slots lost too
                self._pool.replace(w)
                self._lost.update(slots[k + 1:])
                self.replayed["lost"] += len(slots) - k - 1
                return

    def _replay(self, w: int, slot: int) -> str:
        """Send the slot's requests since its reset again: "same" when each answers as it did, "differs", or
        "broken" (no answer in time, or the worker died)."""
        worker = self._workers[w]
        for request, reply in self._history[slot]:
            try:
                worker.conn.send(request)
                if not worker.conn.poll(self.timeout_s):
                    return "broken"
                if worker.conn.recv() != reply:
                    return "differs"
            except (EOFError, OSError):
                return "broken"
        return "same"

    def _failed(self, kind: str, message: str, seconds: float = 0.0, shown: str | None = None) -> ToolOutcome:
        self.failures[kind] += 1
        self.first_messages.setdefault(kind, message)
        return ToolOutcome(False, message, kind, seconds, message if shown is None else shown)
