"""Every verb exits quietly when the reader of its output goes away (`finetune ... | head`)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv", [
    ["schema"],  # a verb's own output
    ["ingest", "--list-slop"],
    ["--help"],  # (a verb's --help is quiet already: argparse ignores errors writing its help)
])
def test_a_reader_that_closes_early_gets_no_traceback(argv):
    # The read end is closed before the child writes a byte, so every write meets a closed pipe:
    # the same as `| head -1` on a longer output, without depending on timing or the pipe's buffer size.
    proc = subprocess.Popen([sys.executable, "-m", "finetune.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141  # what a process killed by SIGPIPE reports, like `cat` or `git log`
    assert err == ""
