"""TrainerCallbacks, one concern a module, used through the Trainer's public callback hooks only:

    guard.py       NaN/inf loss or gradient norm: stop or skip; loss-spike warnings
    interrupt.py   Ctrl-C: finish the step, save, exit 130
    checkpoint.py  save on schedule, complete each save, rotate
    throughput.py  tokens/s, supervised tokens/s, TFLOP/s, MFU
    stages.py      run a function at train begin (ZeRO-3 probes); stop when eval loss rises

Order matters and build_callbacks keeps it: guard, interrupt, checkpoints. The guard raises before a bad step
can be saved; the interrupt asks for a save; the checkpoint callback stages and finalizes every save.
"""

from __future__ import annotations

from finetune.train import checkpoints


def build_callbacks(recipe, layout: checkpoints.Layout, fingerprint: dict, precision: str) -> list:
    """[guard, interrupt, checkpoints]: the order their on_step_end must run in."""
    from finetune.train.callbacks.checkpoint import CheckpointCallback
    from finetune.train.callbacks.guard import NonFiniteGuard
    from finetune.train.callbacks.interrupt import InterruptGuard

    interrupt = InterruptGuard(recipe.save_on_interrupt)
    # GRPO's loss is a surrogate (0 at each generation's first step): its spikes say nothing, so none are looked for
    spikes = recipe.loss_spike_factor if recipe.method != "grpo" else None
    guard = NonFiniteGuard(layout, recipe.on_nonfinite, recipe.max_skipped_steps, spikes,
                           check_grads=precision != "fp16")
    return [
        guard,
        interrupt,
        CheckpointCallback(layout, fingerprint, recipe.checkpoint_interval, recipe.export_interval,
                           recipe.max_checkpoints, interrupt, before_save=guard.verify),
    ]
