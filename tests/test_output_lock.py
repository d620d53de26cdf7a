"""One run per output folder (finetune/train/output_lock.py): a second run into a folder another run holds is
refused with one message naming the holder; a lock left by a killed run does not block the next one.

The first test is what issue 23 tried as a user: a real `finetune train` in its own process, a second one into
the same folder, then the first killed with SIGKILL and a third started. (The exact resume after a SIGKILL, which
also finds the dead run's lock, is tests/test_resume.py; a distributed run sharing its folder between its processes
is tests/test_distributed.py.)
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune.run_folder import LOCK_FILE
from finetune.train import output_lock
from finetune.train.output_lock import OutputDirBusy, hold_output_dir


def wait_for_lock(lock: Path, proc: subprocess.Popen, log: Path, timeout: float = 240) -> dict:
    """The lock's holder once `proc` holds it (the imports of a fresh process take a while on a busy CPU)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the first run ended early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        holder = output_lock.read_holder(lock)
        if holder.get("pid") == proc.pid:
            return holder
        time.sleep(0.2)
    raise AssertionError(f"the first run never took the lock:\n{log.read_text()[-3000:]}")


def test_a_second_run_is_refused_naming_the_holder_and_a_killed_runs_lock_does_not_block(make_recipe, tmp_path,
                                                                                          capsys):
    from finetune.cli import main

    # a run long enough to still be training when the second one starts; no checkpoint before it is killed
    recipe = make_recipe("completion", n=24, adapter="lora", lora_r=2, max_steps=100_000,
                         checkpoint_interval=100_000)
    out, log = tmp_path / "out", tmp_path / "first.log"
    with open(log, "w") as sink:
        first = subprocess.Popen([sys.executable, "-m", "finetune.cli", "train", str(recipe)], stdout=sink,
                                 stderr=subprocess.STDOUT, cwd=tmp_path,
                                 env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        holder = wait_for_lock(out / LOCK_FILE, first, log)
        assert holder["host"] == socket.gethostname() and "train" in holder["command"]
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(holder["started"]))

        assert main(["train", str(recipe)]) == 2  # the same command, a second time
        err = capsys.readouterr().err
        assert f"is in use by another run: process {first.pid} on host {socket.gethostname()}, started {started}" in err
        assert "--set output_dir=" in err and "Traceback" not in err
        assert first.poll() is None and output_lock.read_holder(out / LOCK_FILE)["pid"] == first.pid  # untouched
    finally:
        first.send_signal(signal.SIGKILL)  # no handler runs, the lock file stays behind
        first.wait(timeout=60)
    assert output_lock.read_holder(out / LOCK_FILE)["pid"] == first.pid
    assert not (out / "checkpoints").exists()

    assert main(["train", str(recipe), "--set", "max_steps=2"]) == 0
    err = capsys.readouterr().err
    assert f"took over the lock left by process {first.pid} on host {socket.gethostname()}" in err
    assert json.loads((out / "run.json").read_text())["steps"] == 2
    assert not (out / LOCK_FILE).exists()  # released at the end


def test_the_lock_is_held_for_the_block_and_leaves_no_trace(tmp_path):
    fresh = tmp_path / "fresh"
    with hold_output_dir(fresh):
        assert (fresh / LOCK_FILE).is_file()
        # a second holder, even in the same process (another open of the file), is refused
        with pytest.raises(OutputDirBusy, match=rf"process {os.getpid()} on host {socket.gethostname()}"):
            with hold_output_dir(fresh):
                pass
        assert (fresh / LOCK_FILE).is_file()
    assert not fresh.exists()  # created for the lock and left empty: removed with it
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with hold_output_dir(kept):
        pass
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    with pytest.raises(RuntimeError):  # released when the run fails too
        with hold_output_dir(kept):
            raise RuntimeError("the run failed")
    assert not (kept / LOCK_FILE).exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_without_file_locks_the_holders_pid_decides(tmp_path, monkeypatch, capsys):
    """A filesystem without flock: a lock whose process is gone from this host is taken over; one whose process
    runs (here: this test's parent) or that comes from another host blocks, with how to remove it."""
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(output_lock.fcntl, "flock", no_flock)
    folder = tmp_path / "out"
    folder.mkdir()
    lock = folder / LOCK_FILE
    for holder, refused in (({"pid": dead_pid(), "host": socket.gethostname()}, False),
                            ({"pid": os.getppid(), "host": socket.gethostname()}, True),
                            ({"pid": 1234, "host": "another-host"}, True)):
        lock.write_text(json.dumps({**holder, "started": time.time(), "command": "finetune train recipe.yml"}))
        if refused:
            with pytest.raises(OutputDirBusy, match=rf"process {holder['pid']} on host {holder['host']}.*delete `"):
                with hold_output_dir(folder):
                    pass
            assert output_lock.read_holder(lock)["pid"] == holder["pid"]
        else:
            with hold_output_dir(folder):
                assert output_lock.read_holder(lock)["pid"] == os.getpid()
            assert f"took over the lock left by process {holder['pid']}" in capsys.readouterr().err
