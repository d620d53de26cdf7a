"""One run per output folder: a run holds output_dir/.finetune-lock from its start to its end.

A second `finetune train` into the same folder (a forgotten terminal, a launcher that starts N independent copies
instead of one N-process run) would interleave its checkpoints and final model with the first one's. So:

- the run's main process (global rank 0) creates the lock file, takes an exclusive flock on it and writes who holds
  it: pid, host, start time, command. A second run finds the flock taken and stops (OutputDirBusy, exit 2) with
  one message naming the holder, before it has written anything;
- the operating system drops a flock when its process dies, however it dies (kill -9, OOM killer, a node crash on a
  network filesystem that honours locks), so a lock left by a dead run never blocks: the next run takes it over and
  says whose it was; the exact resume after a crash just works;
- the other processes of the same distributed run (one torchrun / accelerate launch: RANK > 0) do not take it;
  they learn rank 0's answer through the process group, so a refused launch stops on every process;
- where the filesystem has no flock, the holder's pid decides: a lock whose process is gone from this host does
  not block; one from another host blocks and the message says how to remove it.

The lock is removed when the run ends (also by an error or Ctrl-C), and so is output_dir if the run created it and
left nothing else in it: a run refused before training leaves no trace. Pure filesystem code.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.log import get_logger
from finetune.run_folder import LOCK_FILE

log = get_logger(__name__)
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a filesystem without flock support


class OutputDirBusy(FinetuneError):
    """output_dir cannot be held for this run: another run holds it (or it cannot be created)."""


def holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": " ".join(sys.argv)[:500]}


def read_holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def describe(holder: dict) -> str:
    """`process 4242 on host gpu-3, started 2025-11-24 21:07:31 (finetune train recipe.yml)`."""
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}{command}"


def holder_alive(holder: dict) -> bool:
    """Whether the lock's holder may still run: on this host, ask the kernel; on another, assume it does (a lock
    that names no host or no valid pid holds nothing). Also read by `finetune runs` (a run still training)."""
    if holder.get("host") != socket.gethostname():
        return bool(holder.get("host"))
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _busy(path: Path, holder: dict, how: str) -> OutputDirBusy:
    return OutputDirBusy(
        f"`output_dir` `{path.parent}` is in use by another run: {describe(holder)}. Two runs writing into one "
        f"folder would mix their checkpoints and models. Wait for it to finish (or stop it), or give this run its "
        f"own folder: `--set output_dir=...`.{how}"
    )


def acquire(output_dir: Path) -> tuple[int, bool]:
    """(the open, flocked lock file descriptor, whether output_dir was created here), or OutputDirBusy."""
    created = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        previous = read_holder(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(path, read_holder(path) or previous, "") from None
        except OSError as exc:
            if exc.errno not in NO_FLOCK:
                os.close(fd)
                raise
            if previous and previous.get("pid") != os.getpid() and holder_alive(previous):
                os.close(fd)
                raise _busy(path, previous, f" (This filesystem has no file locks; if that run is gone, delete "
                                            f"`{path}`.)") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder removed between our open and our lock: ours
            break
        os.close(fd)
    if previous:
        log.info(f"output_dir: took over the lock left by {describe(previous)}, which is no longer running")
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder_info()) + "\n").encode())
    os.fsync(fd)
    return fd, created


def release(output_dir: Path, fd: int, created: bool) -> None:
    """Remove the lock (before dropping the flock: a run waiting on this file finds it gone and retries), and
    output_dir itself when this run created it and wrote nothing else."""
    try:
        (output_dir / LOCK_FILE).unlink(missing_ok=True)
    finally:
        os.close(fd)
    if created:
        try:
            output_dir.rmdir()  # only succeeds when empty
        except OSError:
            pass


def _shared(main: bool, error: str | None) -> str | None:
    """Rank 0's refusal (or None), as every process of a distributed run sees it."""
    try:
        import torch.distributed as dist
    except ImportError:
        return error
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return error
    box = [error if main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextmanager
def hold_output_dir(output_dir, main: bool = True):
    """Hold output_dir for the block: the main process takes the lock, every process of the run gets its answer."""
    output_dir = Path(output_dir)
    fd = created = error = None
    if main:
        try:
            fd, created = acquire(output_dir)
        except OutputDirBusy as busy:
            error = str(busy)
        except OSError as exc:  # said on every process, not only here (the others wait for this answer)
            error = f"`output_dir` `{output_dir}` cannot be created or locked: {exc}"
    error = _shared(main, error)
    if error is not None:
        if fd is not None:
            release(output_dir, fd, created)
        raise OutputDirBusy(error)
    try:
        yield
    finally:
        if fd is not None:
            release(output_dir, fd, created)
