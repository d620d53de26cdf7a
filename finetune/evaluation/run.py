"""evaluate(): the checks the spec asks for, in order, base and tuned (and a GGUF export) on the same tokens,
then the report. Every input problem (no trained model, a foreign data file, no task in a task folder, lm-eval
missing) is found before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.evaluation.report import REPORT_DIR, read_other, verdict, write_report
from finetune.log import get_logger

log = get_logger(__name__)


def resolve_spec(recipe, changes: dict | None):
    """The recipe's `eval:` section (the schema's defaults when it has none) with the command's changes."""
    from pydantic import ValidationError

    from finetune.recipe.evaluation import EvalSpec

    base = recipe.eval.model_dump() if recipe.eval is not None else {}
    try:
        return EvalSpec.model_validate({**base, **{k: v for k, v in (changes or {}).items() if v is not None}})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise FinetuneError(f"eval options: {problems}") from None


def evaluate(target: str, overrides: list[str] = (), changes: dict | None = None, compare: str | None = None,
             out_dir: str | None = None, recipe=None) -> dict:
    """Evaluate the run `target` (a recipe or its output folder; `recipe`: the Recipe already loaded); write
    OUT/report.{json,md,png} (default: the run's output folder / eval) and return the report."""
    from finetune.evaluation.subject import Models, find_gguf, locate_subject
    from finetune.recipe.methods import is_preference

    subject = locate_subject(target, overrides, recipe)
    spec = resolve_spec(subject.recipe, changes)
    reward = subject.recipe.method == "reward"  # a scorer: held-out pairs scored, nothing generated
    if reward:
        from finetune.evaluation.reward import refuse_generation

        refuse_generation(spec)
    configs = None
    if spec.tasks or spec.tasks_dir:
        from finetune.evaluation.harness import chosen_tasks

        configs = chosen_tasks(spec.tasks, spec.tasks_dir)
    other = read_other(compare) if compare else None
    gguf = None if reward else find_gguf(subject, spec.gguf)
    held = None
    from finetune.model.trained import saved_tokenizer

    tokenizer = saved_tokenizer(subject.folder)
    grpo = subject.recipe.method == "grpo"  # no loss to hold out: the run's rewards on held-out prompts instead
    source = None
    if grpo:
        from finetune.evaluation.grpo import heldout_prompts

        source = heldout_prompts(subject, tokenizer, spec.data)[1]  # before a model loads: none costs nothing
    elif spec.heldout_loss or spec.generations:  # before a model loads: a foreign data file costs nothing
        from finetune.evaluation.heldout import heldout_data

        held = heldout_data(subject, tokenizer, spec.data)
        log.info(f"evaluating on {len(held.examples)} held-out examples: {held.source}")
    models = None if reward else Models(subject, gguf, tokenizer)  # a reward run's models are the scorer's
    log.info(f"base: {subject.base_label}; tuned: {subject.folder}")
    report = {
        "run": str(subject.folder), "model": f"{'adapter on ' if subject.is_adapter else 'full model from '}"
        f"{subject.base_source}", "base": subject.base_label, "checkpoint_step": subject.checkpoint_step,
        "adapter": subject.is_adapter, "method": subject.recipe.method,
        "prompt_format": f"{subject.prompt_format} ({subject.format_reason})",
        "data_source": held.source if held else source, "gguf": str(gguf) if gguf else None,
    }
    sides = models.sides() if models is not None else ("base", "tuned")
    if spec.heldout_loss and grpo:
        from finetune.evaluation.grpo import heldout_rewards

        report["grpo"] = heldout_rewards(models, subject, spec.data)
    elif spec.heldout_loss and reward:
        from finetune.evaluation.reward import reward_report

        report["reward"], report["prompt_format"] = reward_report(subject, held)
    elif spec.heldout_loss and is_preference(subject.recipe):
        from finetune.evaluation.preference import preference_report

        report["preference"] = preference_report(models, held, subject.recipe)
    elif spec.heldout_loss:
        report["heldout"] = _heldout(models, held, sides, subject.recipe.seed)
    if spec.generations and held and held.records and not reward:  # the held-out items' records: their prompts
        from finetune.evaluation.generation import generation_checks

        report["generation"] = generation_checks(
            models, [(name, (lambda name=name: models.side(name))) for name in sides], held, subject.prompt_format,
            spec.generations, spec.max_new_tokens, subject.recipe.seed)
    if configs is not None:
        from finetune.evaluation.harness import run_tasks

        report["benchmarks"] = run_tasks(models, ["base", "tuned"], configs, spec.task_limit,
                                         spec.apply_chat_template)
    report["verdict"] = verdict(report)
    report["report_dir"] = str(write_report(report, Path(out_dir or subject.report_home / REPORT_DIR), other))
    return report


def _heldout(models, held, sides, seed: int) -> dict:
    from finetune.evaluation.heldout import heldout_loss, loss_difference

    out = {}
    for name in sides:
        with models.side(name) as model:
            out[name] = heldout_loss(model, held.examples, models.pad_id)
        log.info(f"held-out loss, {name}: {out[name]['loss']:.4f} (perplexity {out[name]['perplexity']:.2f})")
    difference = loss_difference(out, seed)  # base and tuned on the same examples, with its interval
    for side in out.values():
        side.pop("per_example", None)  # (a GGUF's): the report keeps the means
    return {"sides": out, "source": held.source, "difference": difference}


# what run.json's `evaluation` leaves out of the report: the answers and per-item lists stay in eval/report.json
BULKY = ("answers", "pairs", "scores")


def evaluate_after_training(recipe) -> dict:
    """The recipe's `eval:` checks on the run just trained; a summary added to run.json as `evaluation`."""
    from finetune.atomic import write_text_atomic

    report = evaluate(recipe.output_dir, recipe=recipe)
    summary = {key: report[key] for key in ("verdict", "report_dir") if key in report}
    for key in ("heldout", "preference", "reward", "grpo", "benchmarks"):
        if key in report:
            summary[key] = {k: v for k, v in report[key].items() if k not in BULKY}
    if "generation" in report:
        summary["generation"] = report["generation"]["summary"]
    run_json = Path(recipe.output_dir) / "run.json"
    try:
        run = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = None
    if isinstance(run, dict):
        run["evaluation"] = summary
        write_text_atomic(run_json, json.dumps(run, indent=2, default=str))
    return report
