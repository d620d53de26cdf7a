"""finetune's messages: the standard `logging` logger "finetune", one `[finetune] message` line on stderr.

    from finetune.log import get_logger
    log = get_logger(__name__)        # "finetune.train.run": a child of "finetune"
    log.info("data: 12 records")      # [finetune] data: 12 records
    log.warning("loss spike")         # [finetune] WARNING: loss spike

Only the main process speaks (RANK 0, or LOCAL_RANK 0 where a launcher sets only that), so a message about
building the model is printed once, not once per process; FINETUNE_LOG_ALL_RANKS=1 or `--verbose` lets
every process speak, each line then tagged with its rank. `--quiet` keeps warnings and errors only.

What a verb prints as its result (tables, JSON, `validate`'s report) is not a log message: it stays print()
on stdout.
"""

from __future__ import annotations

import logging
import os
import sys

NAME = "finetune"
ALL_RANKS_ENV = "FINETUNE_LOG_ALL_RANKS"
_state = {"installed": False, "all_ranks": False}


def rank() -> int:
    """This process's global rank (0 outside a launcher)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever sys.stderr is at the moment of each message (a redirected or captured
    stderr, such as pytest's capsys, gets the line), flushed at once so lines from several processes do not
    wait in a buffer."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns one; the property always answers sys.stderr
        pass


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        several = _speaks_everywhere() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        prefix = f"[finetune rank {rank()}] " if several else "[finetune] "
        level = "" if record.levelno < logging.WARNING else f"{record.levelname}: "
        return prefix + level + record.getMessage()


def _speaks_everywhere() -> bool:
    return _state["all_ranks"] or os.environ.get(ALL_RANKS_ENV) == "1"


class _MainProcessOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return rank() == 0 or _speaks_everywhere()


def _install() -> logging.Logger:
    logger = logging.getLogger(NAME)
    if not _state["installed"]:
        handler = _Stderr()
        handler.setFormatter(_Format())
        handler.addFilter(_MainProcessOnly())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # an application's root handler would print every line a second time
        _state["installed"] = True
    return logger


def get_logger(name: str = NAME) -> logging.Logger:
    """The logger for a finetune module (pass __name__); installs the stderr handler once."""
    _install()
    return logging.getLogger(name)


def configure(quiet: bool = False, verbose: bool = False) -> None:
    """The CLI's --quiet / --verbose. Verbose: debug messages too, from every process."""
    logger = _install()
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    _state["all_ranks"] = verbose
