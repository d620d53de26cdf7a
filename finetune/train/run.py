"""The training run: count the data, build the model, train, save, record what ran.

The command line (`finetune train`, `python -m finetune.train`, `accelerate launch -m finetune.train`)
lives in finetune/commands/train.py; this module is the library it calls.

Everything that can fail because of the user (recipe, data, base model) is checked before output_dir
is created, so a bad run leaves nothing half-written behind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path

from finetune.model.bnb import resolve_optimizer
from finetune.recipe_load import dump_recipe
from finetune.redact import redact, redact_text


def log(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[finetune] {message}", file=sys.stderr, flush=True)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def training_arguments(recipe, precision: str, has_eval: bool):
    """TrainingArguments from the recipe: the one place recipe keys become Trainer settings."""
    from transformers import TrainingArguments

    from finetune.train.deepspeed_config import trainer_deepspeed_config

    cpu_deepspeed = recipe.deepspeed is not None and not _cuda_available()
    if cpu_deepspeed:
        from finetune.train.launch import configure_cpu_deepspeed

        configure_cpu_deepspeed(recipe.ddp_timeout)

    warmup = recipe.warmup_steps if recipe.warmup_steps is not None else (recipe.warmup_ratio or 0)
    scheduler, scheduler_kwargs = recipe.lr_scheduler, None
    if recipe.lr_scheduler == "cosine" and recipe.cosine_min_lr_ratio is not None:
        scheduler, scheduler_kwargs = "cosine_with_min_lr", {"min_lr_rate": recipe.cosine_min_lr_ratio}
    eval_strategy = "no" if not has_eval else ("steps" if recipe.eval_steps else "epoch")
    reporters = [r for r in recipe.report_to if r != "none"]
    if "tensorboard" in reporters:
        # transformers 5 may open its SummaryWriter before it knows output_dir, which then writes to
        # ./runs in the current directory; its documented env var pins the folder inside output_dir.
        os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(recipe.output_dir, "tensorboard")
    if "wandb" in reporters and recipe.wandb_project:
        os.environ.setdefault("WANDB_PROJECT", recipe.wandb_project)
    if "wandb" in reporters:
        os.environ.setdefault("WANDB_DIR", recipe.output_dir)  # wandb's files stay in output_dir, not ./wandb
    return TrainingArguments(
        output_dir=recipe.output_dir,
        per_device_train_batch_size=recipe.micro_batch_size,
        per_device_eval_batch_size=recipe.micro_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        num_train_epochs=recipe.num_epochs,
        max_steps=recipe.max_steps or -1,
        # `learning_rate: auto` needs the data counted first: run_training sets the derived value on
        # these arguments before the Trainer (and a DeepSpeed "auto" lr) ever reads it.
        learning_rate=recipe.learning_rate if recipe.learning_rate != "auto" else 0.0,
        lr_scheduler_type=scheduler,
        lr_scheduler_kwargs=scheduler_kwargs,
        warmup_steps=warmup,  # an int is steps, a float < 1 a ratio of all steps
        weight_decay=recipe.weight_decay,
        adam_beta1=recipe.adam_beta1,
        adam_beta2=recipe.adam_beta2,
        adam_epsilon=recipe.adam_epsilon,
        max_grad_norm=recipe.max_grad_norm,
        optim=resolve_optimizer(recipe.optimizer, _cuda_available())[0],  # paged needs CUDA
        seed=recipe.seed,
        data_seed=recipe.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        # non-reentrant checkpointing: works with frozen inputs (LoRA) and without use_cache tricks
        # (`gradient_checkpointing: mlp` is applied to the model by build_model instead)
        activation_checkpointing=recipe.gradient_checkpointing == "full",
        activation_checkpointing_kwargs={"use_reentrant": False} if recipe.gradient_checkpointing == "full" else None,
        dataloader_pin_memory=_cuda_available(),
        logging_steps=recipe.logging_steps,
        logging_first_step=True,
        eval_strategy=eval_strategy,
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
        # the JSON's "auto" values are filled from the arguments above
        deepspeed=trainer_deepspeed_config(recipe.deepspeed) if recipe.deepspeed else None,
        # several CPU processes: accelerate makes them a gloo group only when told it runs on CPU (DeepSpeed
        # brings its own CPU backend, and must not be told)
        use_cpu=not _cuda_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not recipe.deepspeed,
        accelerator_config={"use_configured_state": True} if cpu_deepspeed else None,
        ddp_timeout=recipe.ddp_timeout,  # ranks wait at a barrier while the main process tokenizes
    )


def plan_numbers(recipe, prepared, world_size: int) -> dict:
    """The numbers printed before the first step and recorded in run.json."""
    from finetune.plan.steps import optimizer_steps

    train = prepared.stats["train"]
    rows = len(prepared.train)  # what the Trainer iterates: examples, or packed rows with sample_packing
    examples_per_step = recipe.micro_batch_size * recipe.gradient_accumulation_steps * world_size
    steps_per_epoch = optimizer_steps(rows, recipe.micro_batch_size,
                                      recipe.gradient_accumulation_steps, world_size, 1, None)
    return {
        "world_size": world_size,
        "examples_per_step": examples_per_step,
        "steps_per_epoch": steps_per_epoch,
        "train_rows": rows,
        "total_steps": optimizer_steps(rows, recipe.micro_batch_size,
                                       recipe.gradient_accumulation_steps, world_size,
                                       recipe.num_epochs, recipe.max_steps),
        # e.g. 1,200 tokens an epoch / 12 steps an epoch = 100 tokens per optimizer step, on average
        "tokens_per_step": train["tokens"] / steps_per_epoch,
        "supervised_tokens_per_step": train["supervised_tokens"] / steps_per_epoch,
    }


def losses(log_history: list[dict]) -> dict:
    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    return {
        "first_train_loss": train[0][1] if train else None,
        "final_train_loss": train[-1][1] if train else None,
        "first_eval_loss": evals[0][1] if evals else None,
        "final_eval_loss": evals[-1][1] if evals else None,
    }


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("finetune", "torch", "transformers", "peft", "accelerate", "datasets", "tokenizers",
                 "bitsandbytes", "deepspeed"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def probe_model(model, collator, attn: str, packed: bool, seed: int) -> None:
    """What needs a forward pass of the real model: proving packed examples isolated (refusing to train
    otherwise), and the supervised-only logits, enabled only where a probe shows the loss unchanged."""
    from finetune.model.supervised_logits import attach

    if packed:
        from finetune.model.isolation import guard_packing

        leak = guard_packing(model, collator, attn)
        log(f"packed examples are isolated: logits of a packed example match it alone (leak {leak:.1e} of "
            "full cross-attention)")
    if attach(model, seed) is not None:
        log("loss on supervised positions only: the LM head skips prompt, padding and boundary positions")
    else:
        log("LM head on every position: this model's forward does not allow gathering supervised positions")


def compile_model(model, recipe) -> list:
    """Compile the decoder layers when the recipe says so (`auto`: on CUDA); [the callback that reports the
    compile time once] or []."""
    from finetune.model.regional_compile import compile_decoder_layers, resolve_compile
    from finetune.train.callbacks.compile_time import CompileTimeCallback

    wanted, reason = resolve_compile(recipe, _cuda_available())
    if not wanted:
        log(f"compile: off ({reason})")
        return []
    layers = compile_decoder_layers(model)
    log(f"compile: {layers} decoder layers with torch.compile ({reason}); the first step includes compiling")
    return [CompileTimeCallback(layers, log)]


def run_training(recipe, extra_callbacks: list = ()) -> dict:
    """Train as the recipe says; returns what run.json records. `extra_callbacks`: more TrainerCallbacks
    (run after finetune's own), for tools and tests."""
    from transformers import Trainer, set_seed

    from finetune.data.collate import Collator

    from finetune.train.callbacks import build_callbacks
    from finetune.train.callbacks.checkpoint import clear_write_errors
    from finetune.train.callbacks.interrupt import Interrupted, interrupted_message
    from finetune.train.checkpoints import Layout, find_resume, remove_stale_staging, run_fingerprint
    from finetune.train.checkpoints import claim_output_dir
    from finetune.atomic import honour_umask
    from finetune.data import build_dataset
    from finetune.model import (
        base_causal_lm,
        build_model,
        count_parameters,
        resolve_precision,
    )
    from finetune.model.attention import check_trainable, choose_attention
    from finetune.model.varlen_attention import restore_sdpa, use_varlen_attention
    from finetune.model.loader import load_tokenizer, resolve_model_path
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.plan.run_memory import planned_memory
    from finetune.train.callbacks.stages import AtTrainBegin
    from finetune.train.callbacks.step_loss import StepLossCallback
    from finetune.train.callbacks.throughput import ThroughputCallback, throughput_line
    from finetune.train.deepspeed_config import weights_partitioned
    from finetune.train.curves import write_curves

    started = time.time()
    precision = resolve_precision(recipe)
    args = training_arguments(recipe, precision, has_eval=recipe.val_set_size > 0)
    world_size = args.world_size
    # Only the main process converts the model and tokenizes; the others wait, then read the cache.
    with args.main_process_first(desc="preparing data"):
        tokenizer = load_tokenizer(recipe)
        prepared = build_dataset(recipe, tokenizer)
    stats = prepared.stats
    log(f"data: {stats['records']} records -> {stats['train']['examples']} train / {stats['eval']['examples']} eval "
        f"examples; dropped {stats['dropped_too_long']} too long, {stats['dropped_no_supervised_tokens']} with no "
        f"supervised tokens; truncated {stats['truncated']}"
        f"{' (cached)' if prepared.reused else ''}")
    numbers = plan_numbers(recipe, prepared, world_size)
    args.learning_rate, lr_plan = resolve_learning_rate(recipe, prepared.train_counts(), world_size)
    if recipe.deepspeed:  # a DeepSpeed optimizer block's "auto" lr was filled before the lr was known
        from finetune.train.deepspeed_config import fill_resolved_learning_rate

        fill_resolved_learning_rate(args, recipe.deepspeed)
    if lr_plan is not None:
        log(f"learning_rate auto: {lr_plan.describe()}")
    log(f"tokens: {stats['train']['tokens']:,} train, {stats['train']['supervised_tokens']:,} supervised; "
        f"{numbers['examples_per_step']} examples = ~{numbers['tokens_per_step']:.0f} tokens "
        f"(~{numbers['supervised_tokens_per_step']:.0f} supervised) per optimizer step; "
        f"{numbers['total_steps']} optimizer steps")
    for split_name, packed in stats.get("packing", {}).items():
        log(f"packing ({split_name}): {packed['examples']:,} examples -> {packed['rows']:,} rows of "
            f"{packed['sequence_len']} tokens; efficiency {packed['efficiency']:.3f} (real tokens / token slots)")
    attn, attn_reason = choose_attention(recipe)
    check_trainable(attn, _cuda_available())
    log(f"precision {precision}, attention {attn} ({attn_reason}), adapter {recipe.adapter}")
    optimizer_notice = resolve_optimizer(recipe.optimizer, _cuda_available())[1]
    if optimizer_notice:
        log(optimizer_notice)
    layout = Layout(Path(recipe.output_dir))
    fingerprint = run_fingerprint(recipe, prepared.key, world_size)
    # before the model loads: a refusal (changed setting, nothing left to train) costs nothing
    resume_from = find_resume(recipe, fingerprint, numbers["total_steps"])
    if resume_from:
        log(f"resuming from {resume_from}")
    set_seed(recipe.seed)  # LoRA / new-embedding init draws from the global RNG: seed it like the Trainer does
    model, tokenizer = build_model(recipe, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # flash-attn reads example boundaries from position_ids only in a batch of one row: flatten for it
    collator = Collator(pad_id, flatten=attn == "flash_attention_2")
    causal_lm = base_causal_lm(model)
    packed = bool(stats.get("packing"))
    if packed:
        # a KV cache makes transformers skip the packed-row mask (see guard_packing); under ZeRO-3 the guard,
        # which also turns it off, runs only at train begin: after the "eval loss before" pass
        model.config.use_cache = False
    if packed and attn == "sdpa" and args.device.type == "cpu" and use_varlen_attention(causal_lm):
        log("packed rows on CPU: attention runs example by example (no masked-out work)")
    probe = functools.partial(probe_model, collator=collator, attn=attn, packed=packed, seed=recipe.seed)
    at_train_begin = [AtTrainBegin(probe)] if weights_partitioned() else []  # ZeRO-3: after the engine
    if not at_train_begin:
        probe(model)  # before anything is written: a refusal costs nothing
    trainable, total = count_parameters(model)
    compiled = compile_model(model, recipe)  # after the probes: they run eager, in eval mode or with no grad

    output_dir = Path(recipe.output_dir)
    claim_output_dir(output_dir)  # marks it finetune's first: a crashed run's folder is still recognised
    for stale in remove_stale_staging(layout):
        log(f"removed {stale}: an incomplete checkpoint left by an interrupted run")
    guard, interrupt, saver = callbacks = build_callbacks(recipe, layout, fingerprint, precision)
    # tokens/s, supervised tokens/s, TFLOP/s (MFU where the GPU is known), peak memory beside the plan's
    planned = planned_memory(recipe, causal_lm.config, precision, attn,
                             resolve_optimizer(recipe.optimizer, _cuda_available())[0], world_size)
    throughput = ThroughputCallback(planned_memory=planned)
    step_losses = StepLossCallback()  # every optimizer step's loss, for the learning curve
    trainer = Trainer(
        callbacks=[*callbacks, throughput, step_losses, *at_train_begin, *compiled, *extra_callbacks],
        model=model,
        args=args,
        train_dataset=prepared.train,
        eval_dataset=prepared.eval,
        data_collator=throughput.wrap(collator),
        processing_class=tokenizer,
    )
    eval_before = trainer.evaluate()["eval_loss"] if prepared.eval is not None else None
    if eval_before is not None:
        log(f"eval loss before training: {eval_before:.4f}")
    with interrupt.catching_sigint(), clear_write_errors(layout, "a checkpoint"):
        result = trainer.train(resume_from_checkpoint=resume_from)
    if interrupt.fired:
        raise Interrupted(interrupted_message(interrupt, layout))
    eval_after = trainer.evaluate()["eval_loss"] if prepared.eval is not None else None
    restore_sdpa(causal_lm)  # the saved config must name an attention implementation every loader has
    with clear_write_errors(layout, "the trained model"):
        trainer.save_model(str(output_dir))
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(str(output_dir))
            honour_umask(output_dir)  # safetensors writes 0600 files (finetune/atomic.py)
    summary = {
        "recipe": recipe.model_dump(mode="json"),
        "versions": package_versions(),
        "base_model_path": resolve_model_path(recipe.base_model, recipe.cache_dir),
        "data_hash": prepared.data_hash,
        "dataset_cache": prepared.cache_path,
        "data": stats,
        "plan": numbers,
        "steps": trainer.state.global_step,
        "precision": precision,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "eval_loss_before": eval_before,
        **losses(trainer.state.log_history),
        "final_eval_loss": eval_after,
        "learning_rate": args.learning_rate,
        "learning_rate_plan": dataclasses.asdict(lr_plan) if lr_plan is not None else None,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "wall_time_s": time.time() - started,
        "log_history": trainer.state.log_history,
        "resumed_from": resume_from,
        "checkpoints_written": saver.saved,
        "nonfinite_skipped_steps": guard.skipped_steps,
        "loss_spikes": guard.spikes,
        "throughput": throughput.summary(),  # since start and steady state; peak memory vs the plan's
    }
    if trainer.is_world_process_zero():
        summary["curves"] = write_curves(output_dir, trainer.state.log_history)  # loss_curve.png + verdict
        log(f"learning curve: {summary['curves'].get('verdict')}: {summary['curves'].get('reason', '')}")
    summary = redact(summary)  # no password, token or API key reaches run.json
    if trainer.is_world_process_zero():
        with clear_write_errors(layout, "run.json"):
            (output_dir / "recipe.resolved.yml").write_text(redact_text(dump_recipe(recipe)))
            write_json_atomic(output_dir / "run.json", summary)
        log(throughput_line(summary["throughput"]))
        log(f"done: {summary['steps']} steps, train loss {summary['first_train_loss']} -> "
            f"{summary['final_train_loss']}, eval loss {eval_before} -> {eval_after}; saved to {output_dir}")
    return summary
