"""Train a recipe and SIGKILL this process in the middle of optimizer step STEP (after its first micro-batch):
no handler runs, nothing is flushed, exactly like a node dying. Used by tests/test_resume.py.

    python tests/kill_during_training.py RECIPE STEP
"""

from __future__ import annotations

import os
import signal
import sys

from transformers import TrainerCallback

from finetune.recipe import load_recipe
from finetune.train import run_training


class KillMidStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step  # the optimizer step being accumulated when the kill comes

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    run_training(load_recipe(sys.argv[1]), extra_callbacks=[KillMidStep(int(sys.argv[2]))])
    sys.exit("the run finished: the kill never came")
