"""One reward worker process: it loads the reward functions itself from their specs (nothing is pickled but
the specs and the batches), then answers one call at a time over a pipe.

Why `spawn` (a fresh interpreter) and not `fork`: the training process holds threads (torch's intra-op pool, the
tokenizers' pool, accelerate's) and, on a GPU, a CUDA context. A forked child copies the memory of a process whose
other threads hold locks that will never be released in the child (a deadlock waiting to happen), and CUDA cannot
be used again in a forked child at all; Python 3.12 warns on fork() with threads for this reason. `forkserver`
would do too (its server is spawned clean), but it leaves a server process running beside the run; spawn costs
~0.1 s a worker here (the worker imports only finetune.reward_functions and the user's file, never torch), paid
once at the start and once after each hang.

How a hung call ends: the parent waits for the answer with the function's timeout, then SIGKILLs the worker's
whole process group (the worker calls setsid() first, so whatever the reward function started, a sandboxed
`python` or a `sleep`, goes with it), reaps it, and starts a fresh worker. A worker whose parent disappears (the
training process was killed) kills its group within PARENT_CHECK_S.

What a call prints: the worker points its stdout and stderr (the file descriptors, so a subprocess's output too) at
a temporary file for the call, and sends back the first OUTPUT_CAP bytes and the count of all of them; the training
process logs that much per call and counts the rest (a reward that prints 1 MB a call does not flood the log).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import wait
from types import SimpleNamespace

from finetune.errors import RewardError

START_METHOD = "spawn"
# Importing a reward file may import sympy or math_verify (seconds on a busy machine); an import that takes
# two minutes is a hang, not a slow import.
LOAD_TIMEOUT_S = 120.0
PARENT_CHECK_S = 1.0  # how often a worker looks whether its parent still lives
STOP_WAIT_S = 2.0  # a worker asked to stop exits at once; after this long it is killed
JOIN_S = 5.0  # reaping a SIGKILLed process takes milliseconds; this only bounds a wait that should never be long
# What one call may print into the log: a traceback or a few debugging lines fit; a dump of every completion does not
OUTPUT_CAP = 4096  # bytes


# --- in the worker process ---------------------------------------------------------------------------------------
def worker_main(conn, functions: list[str], base_dir: str, parent_pid: int) -> None:
    """The worker's whole life: load every function, say ready, then answer (index, batch) until told to stop."""
    from finetune.reward_functions import check_reward, load_reward

    if hasattr(os, "setsid"):
        os.setsid()  # its own process group: one killpg() ends it and everything the reward functions started
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        loaded = [load_reward(spec, base_dir) for spec in functions]
        for func, spec in zip(loaded, functions):
            check_reward(func, spec)
    except RewardError as err:
        conn.send(("load_failed", str(err)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the parent closed its end: nothing more to do
            return
        if request is None:
            return
        index, batch = request
        conn.send(call_one(loaded[index], functions[index], batch))


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent_pid:  # re-parented: the training process is gone
            if hasattr(os, "killpg"):
                os.killpg(os.getpgrp(), signal.SIGKILL)
            os._exit(1)


def call_one(func, spec: str, batch: dict) -> tuple:
    """("ok", values, logs) or ("failed", kind, message, logs); logs: what log_metric / log_extra received, and
    "output": (the first OUTPUT_CAP bytes the call printed, how many it printed) when it printed anything."""
    from finetune.reward_functions import call_reward, check_reward, describe_error, reward_kwargs

    logs = {"metrics": {}, "extra": {}}
    state = batch["trainer_state"]
    extras = {
        # TRL passes its live TrainerState; a worker gets a snapshot of the fields the trainer sent, read the same
        # way (trainer_state.global_step), or None where none was sent
        "trainer_state": SimpleNamespace(**state) if state is not None else None,
        "log_extra": lambda column, values: logs["extra"].setdefault(str(column), []).extend(values),
        "log_metric": lambda name, value: logs["metrics"].setdefault(str(name), []).append(float(value)),
    }
    try:
        check_reward(func, spec, batch["columns"])
    except RewardError as err:  # the message names the function's own file and line, not this one
        return ("failed", "exception", str(err), logs)
    with captured_output() as printed:
        try:
            out = call_reward(func, reward_kwargs(func, batch["prompts"], batch["completions"],
                                                  batch["completion_ids"], batch["columns"], extras))
        except (Exception, SystemExit) as err:
            out, failure = None, describe_error(err)
        else:
            failure = None
    if printed["bytes"]:
        logs["output"] = (printed["text"], printed["bytes"])
    if failure is not None:
        return ("failed", "exception", failure, logs)
    values, kind, message = to_floats(out, len(batch["prompts"]))
    if kind is not None:
        return ("failed", kind, message, logs)
    return ("ok", values, logs)


@contextlib.contextmanager
def captured_output():
    """stdout and stderr (file descriptors 1 and 2) into a temporary file while the block runs; then the box holds
    "text" (its first OUTPUT_CAP bytes, decoded) and "bytes" (its size)."""
    box = {"text": "", "bytes": 0}
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # a process started without stdout or stderr: nothing to catch, nothing reaches a log
        yield box
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield box
        finally:
            for stream in (sys.stdout, sys.stderr):
                _flush(stream)
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            box["bytes"] = os.fstat(sink.fileno()).st_size
            sink.seek(0)
            box["text"] = sink.read(OUTPUT_CAP).decode("utf-8", errors="replace")


def _flush(stream) -> None:
    try:
        stream.flush()
    except (AttributeError, OSError, ValueError):  # closed or replaced by the reward function: nothing to flush
        pass


def to_floats(out, expected: int) -> tuple[list[float] | None, str | None, str | None]:
    """(values, None, None), None -> NaN; or (None, "not_a_list" | "wrong_length" | "non_numeric", message)."""
    if hasattr(out, "tolist"):  # a numpy array or a torch tensor
        out = out.tolist()
    if out is None:
        return None, "not_a_list", ("returned None, not a list of one value per completion (a missing `return`? "
                                    "None per completion, [None] * len(completions), means \"does not apply\")")
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
        return None, "not_a_list", f"returned a {type(out).__name__}, not a list of one value per completion"
    out = list(out)
    if len(out) != expected:
        return None, "wrong_length", f"returned {len(out)} values for {expected} completions"
    values = []
    for i, value in enumerate(out):
        if value is None:
            values.append(math.nan)  # "does not apply": left out of the rewards, as TRL does
            continue
        if hasattr(value, "item") and not isinstance(value, numbers.Real):
            value = value.item()  # a 0-d array or tensor
        if not isinstance(value, numbers.Real):
            return None, "non_numeric", f"value {i} is {_short(value)} ({type(value).__name__}), not a number"
        value = float(value)
        if math.isinf(value):
            return None, "non_numeric", f"value {i} is {value}, not a finite number"
        values.append(value)
    return values, None, None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- in the training process -------------------------------------------------------------------------------------
class WorkerProcess:
    """The training process's handle on one worker: start, wait until it has loaded, send a call, kill."""

    def __init__(self, context, functions: list, base_dir, target=None, name: str = "finetune-reward-worker"):
        """`target`: the worker's main (default worker_main, the reward functions'; the tools' worker passes its
        own, finetune/train/grpo/tool_worker.py), called as target(conn, functions, base_dir, parent pid)."""
        here, there = context.Pipe()
        self.process = context.Process(target=target or worker_main,
                                       args=(there, list(functions), str(base_dir), os.getpid()), name=name)
        self.process.start()
        there.close()  # the worker's end lives in the worker only: its death then reads as EOF here
        self.conn = here
        self.call: tuple[int, float] | None = None  # (function index, deadline) while a call runs
        self.killed = False

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S) -> None:
        """Raise RewardError when the worker cannot load the reward functions."""
        if not self.conn.poll(timeout_s):
            self.kill()
            raise RewardError(f"reward functions: a worker process did not finish importing them in {timeout_s:.0f} "
                              "s; an import in a reward file hangs (try `python -c 'import ...'` on it)")
        try:
            kind, detail = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise RewardError("reward functions: a worker process died while importing them (exit code "
                              f"{self.process.exitcode}); import the reward file in Python to see why. A script of "
                              "yours that calls run_training needs `if __name__ == \"__main__\":` around it: the "
                              "workers are spawned and re-import the main script") from None
        if kind == "load_failed":
            self.kill()
            raise RewardError(detail)

    def send(self, index: int, batch: dict, timeout_s: float) -> None:
        self.conn.send((index, batch))
        self.call = (index, time.monotonic() + timeout_s)

    def kill(self) -> None:
        """SIGKILL the worker's process group, then reap the worker. The group is killed before the worker is
        reaped: until then its pid (the group's id) cannot be reused by another process. Once only."""
        if self.killed:
            return
        self.killed = True
        pid = self.process.pid
        if pid is not None and hasattr(os, "killpg"):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # not yet its own group, or already gone
                pass
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join(JOIN_S)
        self.conn.close()

    def ask_to_stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):  # already gone, or the pipe is closed
            pass

    def stop(self, asked: bool = False) -> None:
        """Ask the worker to exit; kill it (and what it started) if it does not."""
        if not asked:
            self.ask_to_stop()
        wait([self.process.sentinel], STOP_WAIT_S)  # exited or not, it is not reaped yet: see kill()
        self.kill()


class WorkerPool:
    """Workers started together, stopped together (close(), or at garbage collection or interpreter exit for a pool
    nobody closed), one replaced at a time. `start()` makes one WorkerProcess; every worker starts before any is
    waited for. What the reward runner and the tools runner (finetune/train/grpo/tools.py) share."""

    def __init__(self, start, count: int):
        self._start = start
        self.workers: list[WorkerProcess] = []
        # the same list object for the pool's whole life: replacing a worker mutates it, so the finalizer stops the
        # live ones
        self._finalizer = weakref.finalize(self, stop_all, self.workers)
        try:
            for _ in range(count):
                self.workers.append(start())
            for worker in self.workers:
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    def replace(self, index: int) -> WorkerProcess:
        """Kill worker `index` (its process group) and put a fresh, loaded one in its place."""
        self.workers[index].kill()
        self.workers[index] = self._start()
        self.workers[index].wait_ready()
        return self.workers[index]

    def close(self) -> None:
        """Stop every worker and whatever it started. Safe to call twice."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]


def stop_all(workers: list[WorkerProcess]) -> None:
    """Stop every worker (close(), the finalizer at exit): ask all first, so they exit together."""
    for worker in workers:
        worker.ask_to_stop()
    for worker in workers:
        worker.stop(asked=True)
    workers.clear()
