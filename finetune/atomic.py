"""Temporary files and folders for write-then-rename, with the permissions any other tool's output gets.

tempfile.mkstemp / mkdtemp create 0600 files and 0700 folders (private on purpose: they are meant for
secrets). Renamed into place as a model, an adapter or a records file, they would stay private while every
other file the user makes follows their umask (022: 0644 files, 0755 folders). These helpers give the
temporary file or folder the mode an ordinary `open()` / `mkdir()` would have given it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set-and-restore, the only portable way to read it before Python 3.13
    os.umask(mask)
    return mask


def temp_file(path: str | os.PathLike) -> tuple[int, str]:
    """(fd, temporary path) beside `path`, mode 0666 & ~umask: what `open(path, "w")` would create."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


@contextmanager
def replaced_whole(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path beside `path` (an empty file, the umask's mode) for the block to write; leaving the block
    renames it onto `path`, an error inside it removes it. A reader never sees a half-written file, and a crash
    leaves the previous version in place. A writer holding the file open closes it inside the block."""
    fd, tmp = temp_file(path)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` whole or not at all (replaced_whole)."""
    with replaced_whole(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def temp_dir(target: str | os.PathLike) -> Path:
    """A temporary folder beside `target`, mode 0777 & ~umask: what `mkdir(target)` would create."""
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


# safetensors 0.8.0 (checked: 0.8.0) writes every .safetensors file through a temporary file the Rust tempfile
# crate creates 0600, then renames it: models, adapters and checkpoints end up private whatever the umask
# (safetensors issue #782; the fix, PR #789, is not released). tests/test_settings.py fails once a release
# honours the umask again: then this function can go.
SAFETENSORS_PRIVATE_MODE = 0o600


def honour_umask(folder: str | os.PathLike) -> None:
    """Give the .safetensors files under `folder` that safetensors wrote 0600 the umask's mode (0644 under 022)."""
    mode = 0o666 & ~current_umask()
    if mode == SAFETENSORS_PRIVATE_MODE:
        return
    for path in Path(folder).rglob("*.safetensors"):
        if path.is_file() and (path.stat().st_mode & 0o777) == SAFETENSORS_PRIVATE_MODE:
            os.chmod(path, mode)
