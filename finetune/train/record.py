"""What a finished run writes: the model or adapter and its tokenizer, recipe.resolved.yml, run.json (the resolved
recipe, package versions, data hash, steps, token counts, losses, throughput) and the learning curve."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from finetune.atomic import write_text_atomic
from finetune.log import get_logger
from finetune.recipe.load import dump_recipe
from finetune.redact import redact, redact_text
from finetune.train.settings import Resolved

log = get_logger(__name__)


def losses(log_history: list[dict]) -> dict:
    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    return {
        "first_train_loss": train[0][1] if train else None,
        "final_train_loss": train[-1][1] if train else None,
        "first_eval_loss": evals[0][1] if evals else None,
        "final_eval_loss": evals[-1][1] if evals else None,
    }


def write_resolved_recipe(recipe, output_dir: Path) -> None:
    """recipe.resolved.yml: written when the run starts (a run that stops early still says what it trained with;
    the runs page reads it) and again at its end."""
    from finetune.run_folder import RESOLVED_RECIPE

    write_text_atomic(Path(output_dir) / RESOLVED_RECIPE, redact_text(dump_recipe(recipe)))


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


def save_and_record(recipe, settings: Resolved, layout, prepared, run: dict, started: float) -> dict:
    """Save the model and tokenizer, then write recipe.resolved.yml, run.json and the loss curve."""
    from finetune.atomic import honour_umask
    from finetune.model import base_causal_lm
    from finetune.model.loader import resolve_model_path
    from finetune.model.varlen_attention import restore_sdpa
    from finetune.train.callbacks.checkpoint import clear_write_errors
    from finetune.train.callbacks.throughput import throughput_line
    from finetune.train.curves import write_curves

    trainer, output_dir = run["trainer"], Path(recipe.output_dir)
    restore_sdpa(base_causal_lm(trainer.model))  # the saved config must name an attention every loader has
    # FSDP2: the final save is the whole model or adapter, whatever layout the checkpoints use (fsdp.state_dict_type)
    if getattr(trainer, "is_fsdp_enabled", False):
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    with clear_write_errors(layout, "the trained model"):
        trainer.save_model(str(output_dir))
        if trainer.is_world_process_zero() and run.get("initial_adapter") is not None:
            from finetune.model.lora_variants import save_for_original_base

            # PiSSA / OLoRA: the adapter rewritten as plain LoRA on the original base (model/lora_variants.py)
            save_for_original_base(trainer.model, output_dir, run["initial_adapter"])
        if trainer.is_world_process_zero():
            run["tokenizer"].save_pretrained(str(output_dir))
            honour_umask(output_dir)  # safetensors writes 0600 files (finetune/atomic.py)
    history = trainer.state.log_history
    summary = {
        "recipe": recipe.model_dump(mode="json"),
        "versions": package_versions(),
        "base_model_path": resolve_model_path(recipe.base_model, recipe.cache_dir),
        "data_hash": prepared.data_hash,
        "dataset_cache": prepared.cache_path,
        "data": prepared.stats,
        "plan": settings.numbers,
        "steps": trainer.state.global_step,
        "trainable_parameters": run["trainable"],
        "total_parameters": run["total"],
        "eval_loss_before": run["eval_before"],
        **losses(history),
        "final_eval_loss": run["eval_after"],
        **settings.record(),  # precision, learning_rate, learning_rate_plan
        "train_runtime_s": run["result"].metrics.get("train_runtime"),
        "wall_time_s": time.time() - started,
        "log_history": history,
        "resumed_from": run["resumed_from"],
        "checkpoints_written": run["saver"].saved,
        "nonfinite_skipped_steps": run["guard"].skipped_steps,
        # GRPO's loss is a surrogate (0 at each generation's first step), whose spikes say nothing: not looked for
        "loss_spikes": run["guard"].spikes if recipe.method != "grpo" else None,
        "throughput": run["throughput"].summary(),  # since start and steady state; peak memory vs the plan's
        "method": recipe.method,
    }
    summary.update(method_record(recipe, trainer, prepared, run))
    if not trainer.is_world_process_zero():
        return redact(summary)
    # loss_curve.png + verdict (a GRPO run's names why a reward gave no value)
    summary["curves"] = write_curves(output_dir, history, summary.get("grpo", {}).get("reward_failures"))
    log.info(f"learning curve: {summary['curves'].get('verdict')}: {summary['curves'].get('reason', '')}")
    summary = redact(summary)  # no password, token or API key reaches run.json
    with clear_write_errors(layout, "run.json"):
        write_resolved_recipe(recipe, output_dir)
        write_text_atomic(output_dir / "run.json", json.dumps(summary, indent=2, default=str))
    run["recorded"] = True  # what is raised from here is in run.json: not a stopped run (train/stop_record.py)
    if recipe.method == "grpo":  # the reward, not the surrogate loss; no eval loss; a run that got none fails
        from finetune.train.grpo.setup import done_grpo

        return done_grpo(summary, output_dir)
    log.info(throughput_line(summary["throughput"]))
    log.info(f"done: {summary['steps']} steps, {_train_loss_line(summary)}, eval loss "
             f"{_number(run['eval_before'])} -> {_number(run['eval_after'])}; saved to {output_dir}")
    return summary


def method_record(recipe, trainer, prepared, run: dict) -> dict:
    """run.json's part for the method beyond SFT: `grpo`, `reward` or `preference` ({} for SFT)."""
    if recipe.method == "grpo":
        from finetune.train.grpo.setup import grpo_record

        return {"grpo": grpo_record(recipe, trainer)}
    if recipe.method == "reward":
        from finetune.train.reward.setup import reward_record

        formats = set(prepared.stats.get("formats") or ())  # conversations (chat) or plain text: how it scores
        conversational = None if len(formats) != 1 else formats == {"chat"}
        return {"reward": reward_record(recipe, trainer, run.get("collator"), run["tokenizer"], conversational)}
    if prepared.store is not None:
        from finetune.train.preference.setup import preference_record

        return {"preference": preference_record(recipe, trainer)}
    return {}


def _number(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _train_loss_line(summary: dict) -> str:
    """The training loss's first and last levels as the learning-curve verdict read them (means of the first and
    last steps: curves.loss_levels), so the closing line and the verdict give one set of numbers; the first and
    last logged losses when the curve was too short to judge."""
    levels = (summary.get("curves") or {}).get("train_loss_levels")
    if levels:
        k = levels["steps_each_end"]
        return f"train loss {levels['first']:.4f} -> {levels['last']:.4f} (means of the first and last {k} steps)"
    return f"train loss {_number(summary['first_train_loss'])} -> {_number(summary['final_train_loss'])}"
