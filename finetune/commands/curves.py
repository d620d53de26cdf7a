"""Re-render loss_curve.png and re-diagnose a finished run (underfit / overfit / well-fit / diverged; preference
runs also nothing learned / likelihood displacement) from its logs.

    finetune curves OUTPUT_DIR
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a run's output_dir (holds run.json or checkpoint-*/trainer_state.json)")


def run(args: argparse.Namespace) -> int:
    from finetune.train.curves import read_log_history, write_curves

    diagnosis = write_curves(args.output_dir, read_log_history(args.output_dir))
    print(f"{diagnosis['verdict']}: {diagnosis['reason']}")
    print(f"plot: {diagnosis['plot']}")
    return 0
