"""What a run logs once its settings are resolved, before the model is built: the tokens and optimizer steps (or
GRPO's step: prompts, completions, generation), packing efficiency, the learning rate's plan, the LoRA variant's
scales, precision, attention and adapter."""

from __future__ import annotations

from finetune.log import get_logger
from finetune.train.fast_paths import say
from finetune.train.settings import Resolved

log = get_logger("finetune.train.run")  # the run's own log lines, under the name they always had


def report_settings(recipe, prepared, settings: Resolved) -> None:
    stats, numbers = prepared.stats, settings.numbers
    items = "examples" if prepared.store is None or prepared.store.unpaired else "pairs"
    if recipe.method == "grpo":
        from finetune.train.grpo.setup import report_grpo_step

        report_grpo_step(recipe, prepared, numbers)
        return _report_machine(recipe, settings)
    if settings.lr_plan is not None:
        log.info(f"learning_rate auto: {settings.lr_plan.describe()}")
    per_step = f"{numbers['examples_per_step']} {items}"
    if stats.get("packing", {}).get("train"):  # a micro batch counts packed rows, each holding several items
        per_step = (f"{numbers['examples_per_step']} packed row{'s' if numbers['examples_per_step'] != 1 else ''} "
                    f"(~{stats['train']['examples'] / numbers['steps_per_epoch']:.1f} {items})")
    train = stats["train"]
    images = image_step = ""
    if "image_tokens" in train:  # a vision-language model: its image tokens apart (never supervised)
        images = f", {train['image_tokens']:,} image tokens ({train['images']:,} images)"
        image_step = f", ~{numbers['tokens_per_step'] * train['image_tokens'] / max(train['tokens'], 1):.0f} image"
    log.info(f"tokens: {train['tokens']:,} train, {train['supervised_tokens']:,} supervised{images}; "
             f"{per_step} = ~{numbers['tokens_per_step']:.0f} tokens "
             f"(~{numbers['supervised_tokens_per_step']:.0f} supervised{image_step}) per optimizer step; "
             f"{numbers['total_steps']} optimizer steps")
    for split_name, packed in stats.get("packing", {}).items():
        log.info(f"packing ({split_name}): {packed['examples']:,} {items} -> {packed['rows']:,} rows of "
                 f"{packed['sequence_len']} tokens; efficiency {packed['efficiency']:.3f} (real tokens / token slots)")
    _report_machine(recipe, settings)


def _report_machine(recipe, settings: Resolved) -> None:
    from finetune.plan.lr_lora import as_sentence, lora_variant_lines

    for line in lora_variant_lines(recipe, settings.learning_rate):  # rsLoRA's scale, LoRA+'s B rate (plan/lr_lora.py)
        log.info(as_sentence(line))
    say(f"precision {settings.precision}, attention {settings.attn_implementation} ({settings.attn_reason}), "
        f"adapter {recipe.adapter}", settings.probes.get("flex_attention"))
    if settings.optimizer_notice:
        log.info(settings.optimizer_notice)
    if settings.precision == "bf16" and not settings.cuda:
        log.info("precision: bf16 on CPU: torch's CPU autocast, often slower than fp32 on CPUs without bf16 "
                 "instructions (`precision: auto` trains fp32 on a CPU and bf16 on a bf16 GPU)")
