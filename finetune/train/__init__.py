"""The training run: one resolved plan, the HF Trainer, callbacks, checkpoints, DeepSpeed and launch.

    run.py              run_training(recipe): count data -> resolve settings -> TrainingArguments -> Trainer
    settings.py         Resolved: every setting the machine or the data decides, resolved once
    callbacks/          TrainerCallbacks, one concern a module: guard, interrupt, checkpoint, throughput, stages
    checkpoints.py      where checkpoints live, when one is complete, which one to resume
    deepspeed_config.py the DeepSpeed JSON as the Trainer gets it ("auto" values); finding it and checking it
                        against the recipe happen at load time, in finetune/recipe/checks.py
    fsdp_config.py      its sibling for FSDP2: the recipe's `fsdp:` as TrainingArguments' fsdp_config
    launch.py           starting N processes (accelerate / torchrun)
    curves.py           loss_curve.png and the underfit / overfit verdict
    preference_loss.py  DPO, IPO, SimPO, ORPO, KTO losses and metrics: per-pair pure functions of per-sequence
                        log-probs, held equal to TRL 1.16's (tests/test_preference_loss.py)
    __main__.py         `python -m finetune.train` (the same as `finetune train`)

Nothing heavy is imported here: `run_training` is reached through a lazy attribute.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("run_training", "training_arguments"):
        from finetune.train import run

        return getattr(run, name)
    raise AttributeError(f"module 'finetune.train' has no attribute {name!r}")
