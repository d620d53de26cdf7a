"""Fine-tune from a recipe: load, build, train, save.

    finetune train recipe.yml [--set key=value ...] [--num-processes N]
    python -m finetune.train recipe.yml
    accelerate launch -m finetune.train recipe.yml
"""

from __future__ import annotations

import argparse
import os

from finetune.commands.args import add_recipe_arguments
from finetune.log import get_logger, rank
from finetune.recipe import load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from finetune.train.launch import add_launch_arguments

    add_recipe_arguments(parser)
    add_launch_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from finetune.train.imports import restore_libraries, skip_unused_libraries
    from finetune.train.launch import check_deepspeed_installed, inside_launch, launch, single_process_env

    launching = args.num_processes is not None and not inside_launch()
    # validated here, before any process starts, for the process count it will run with
    recipe = load_recipe(args.recipe, args.overrides, world_size=args.num_processes if launching else None)
    offline_before = _check_the_machine(recipe, str(args.recipe)) if checks_the_machine() else None
    try:
        if launching and (args.num_processes > 1 or args.num_machines > 1):
            return launch(args, recipe)
        check_deepspeed_installed(recipe)
        if (recipe.deepspeed is not None or recipe.fsdp is not None) and not inside_launch():
            os.environ.update(single_process_env())  # DeepSpeed's / FSDP's process group, with one member
        skipped = skip_unused_libraries(recipe)  # start-up: no bitsandbytes / DeepSpeed imports it does not use
        if skipped:
            get_logger(__name__).info(f"start-up: not importing {', '.join(skipped)} (this recipe does not use "
                f"{'them' if len(skipped) > 1 else 'it'}; FINETUNE_IMPORT_ALL=1 imports every library)")
        try:
            return _train(recipe)
        finally:  # the marks are for this command's recipe: a later command in the same Python (a notebook) has
            restore_libraries(skipped)  # its own
    finally:
        if offline_before is not None:
            from finetune.compat import set_hub_offline

            set_hub_offline(offline_before)


def checks_the_machine() -> bool:
    """Whether this process asks what the machine lacks (finetune/train/preflight.py): the process the user started
    (alone, or the launcher), or rank 0 under a launcher that is not finetune's; never a worker finetune started."""
    from finetune.train.launch import MACHINE_CHECKED, inside_launch

    if not inside_launch():
        return True
    return rank() == 0 and os.environ.get(MACHINE_CHECKED) != "1"


def _check_the_machine(recipe, source: str) -> bool | None:
    """Every problem this machine has with the recipe, as one message (exit 2). When the hub cannot be reached and
    everything the run needs from it is in the local HF cache, the run reads the cache without asking the hub
    (its downloads would retry for ~50 s first): returns the offline switch to restore then, else None."""
    from finetune.train.preflight import check_machine

    hub = check_machine(recipe, source)
    if hub is None or hub.reachable or not hub.probed:
        return None
    from finetune.compat import set_hub_offline

    get_logger(__name__).info(f"{hub.why}: the run reads its model from the local HF cache (HF_HUB_OFFLINE=1 "
                              "for this command and the processes it starts)")
    return set_hub_offline(True)


def _train(recipe) -> int:
    from finetune.train.checkpoints import NothingToTrain
    from finetune.train.run import run_training

    try:
        run_training(recipe)
    except NothingToTrain as done:  # not a mistake: the run is already finished, and nothing was written
        get_logger(__name__).info(str(done))  # the main process says so
        return 0
    if recipe.eval is not None and rank() == 0:
        evaluate_trained(recipe)
    if rank() == 0:
        write_run_page(recipe.output_dir)
    return 0


def write_run_page(output_dir) -> None:
    """The run's own page (output_dir/run.html, `finetune runs` for one run), once training and its evaluation
    are written. A page that cannot be written is a warning: the run itself is done and saved."""
    from finetune.runs.page import write_run_page as write

    try:
        path = write(output_dir)
    except OSError as err:
        get_logger(__name__).warning(f"the run's page was not written ({err}); `finetune runs {output_dir}` "
                                     "writes it later")
        return
    get_logger(__name__).info(f"run page: {path} (`finetune runs FOLDER` compares several runs)")


def evaluate_trained(recipe) -> None:
    """The recipe's `eval:` checks once training ends (main process only): report in output_dir/eval, a summary
    in run.json. Nothing runs without an `eval:` section."""
    from finetune.evaluation import evaluate_after_training

    log = get_logger(__name__)
    log.info("evaluating the trained run (the recipe's `eval:` section)")
    report = evaluate_after_training(recipe)
    log.info(f"evaluation: {report['verdict']}; report in {report['report_dir']}")
