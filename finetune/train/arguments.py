"""TrainingArguments, built once from the recipe and the Resolved settings: the one place recipe keys become
Trainer arguments (and the trackers' folders are pinned inside output_dir)."""

from __future__ import annotations

import os
import sys

from finetune.train.settings import Resolved


def _reporters(recipe) -> list[str]:
    """The recipe's `report_to`, with the folders those trackers write to pinned inside output_dir."""
    reporters = [r for r in recipe.report_to if r != "none"]
    if "tensorboard" in reporters:
        # transformers 5 may open its SummaryWriter before it knows output_dir, which then writes to
        # ./runs in the current directory; its documented env var pins the folder inside output_dir.
        os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(recipe.output_dir, "tensorboard")
    if "wandb" in reporters and recipe.wandb_project:
        os.environ.setdefault("WANDB_PROJECT", recipe.wandb_project)
    if "wandb" in reporters:
        os.environ.setdefault("WANDB_DIR", recipe.output_dir)  # wandb's files stay in output_dir, not ./wandb
    return reporters


def training_arguments(recipe, settings: Resolved):
    """TrainingArguments from the recipe and its resolved settings: the one place recipe keys become Trainer
    settings. Built once; a DeepSpeed JSON's "auto" values are filled from these arguments as they are built.
    Adopts the process group start_process_group formed (use_configured_state)."""
    from transformers import TrainingArguments

    warmup = recipe.warmup_steps if recipe.warmup_steps is not None else (recipe.warmup_ratio or 0)
    scheduler, scheduler_kwargs = recipe.lr_scheduler, None
    if recipe.lr_scheduler == "cosine" and recipe.cosine_min_lr_ratio is not None:
        scheduler, scheduler_kwargs = "cosine_with_min_lr", {"min_lr_rate": recipe.cosine_min_lr_ratio}
    # under `fsdp`, `full` is FSDP's own activation checkpointing (in settings.fsdp)
    full_checkpointing = recipe.gradient_checkpointing == "full" and settings.fsdp is None
    reporters = _reporters(recipe)
    return TrainingArguments(
        output_dir=recipe.output_dir,
        per_device_train_batch_size=recipe.micro_batch_size,
        per_device_eval_batch_size=recipe.micro_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        num_train_epochs=recipe.num_epochs,
        max_steps=recipe.max_steps or -1,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=scheduler,
        lr_scheduler_kwargs=scheduler_kwargs,
        warmup_steps=warmup,  # an int is steps, a float < 1 a ratio of all steps
        weight_decay=recipe.weight_decay,
        adam_beta1=recipe.adam_beta1,
        adam_beta2=recipe.adam_beta2,
        adam_epsilon=recipe.adam_epsilon,
        max_grad_norm=recipe.max_grad_norm,
        optim=settings.optimizer,
        seed=recipe.seed,
        data_seed=recipe.seed,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        # non-reentrant checkpointing: works with frozen inputs (LoRA) and without use_cache tricks
        # (`gradient_checkpointing: mlp` is applied to the model by build_model instead)
        activation_checkpointing=full_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if full_checkpointing else None,
        dataloader_pin_memory=settings.cuda,
        logging_steps=recipe.logging_steps,
        logging_first_step=True,
        eval_strategy="no" if not settings.has_eval else ("steps" if recipe.eval_steps else "epoch"),
        eval_steps=recipe.eval_steps,
        # Saving is scheduled, staged, completed and rotated by finetune/train/callbacks/checkpoint.CheckpointCallback
        # (checkpoint_interval, export_interval, max_checkpoints): the Trainer only writes when asked.
        save_strategy="no",
        save_total_limit=None,
        # `stop` must see a NaN loss in the logs; `skip` leaves it out of the logged average like HF does
        logging_nan_inf_filter=recipe.on_nonfinite == "skip",
        report_to=reporters or "none",
        remove_unused_columns=False,  # our columns are exactly what the model takes
        train_sampling_strategy="group_by_length" if recipe.group_by_length else "random",
        disable_tqdm=not sys.stderr.isatty(),
        deepspeed=settings.deepspeed,  # its "auto" values are filled from the arguments above
        fsdp=settings.fsdp is not None,  # FSDP2: accelerate's plugin from fsdp_config (train/fsdp_config.py)
        fsdp_config=dict(settings.fsdp) if settings.fsdp is not None else None,  # a copy: transformers edits it
        # several CPU processes without DeepSpeed: a gloo group (see start_process_group); bf16 on a CPU: transformers
        # refuses bf16 without a GPU unless told the run is on the CPU, where torch autocasts to bf16
        use_cpu=not settings.cuda and (settings.world_size > 1 or settings.precision == "bf16")
        and settings.deepspeed is None,
        accelerator_config={"use_configured_state": True},
        ddp_timeout=recipe.ddp_timeout,
    )
