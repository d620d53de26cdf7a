"""The LR formula applied to a recipe and its tokenized data (no torch: counts in, LrPlan out).

train.py calls resolve_learning_rate() once the data is prepared; `finetune lr recipe.yml` prints
recipe_lr_report(): the formula's LR beside the recipe's, each input with where it came from. Preference
methods (`method: dpo`...) and GRPO do not use the formula: `learning_rate: auto` is the method's published
default (finetune/plan/lr_preference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import RecipeError
from finetune.plan.lr import LrPlan, family_by_name, find_family, format_lr, plan_learning_rate
from finetune.plan.grpo import grpo_steps
from finetune.plan.lr_preference import METHOD_LRS, preference_lr_plan, uses_adapter
from finetune.plan.steps import optimizer_steps
from finetune.recipe.methods import method_setting

# The formula scales a *full fine-tune's* LR. LoRA's optimal LR is about 10x FullFT's across ranks, models and
# datasets (Schulman & Thinking Machines Lab 2025, "LoRA Without Regret": "LoRA's optimal learning rate ~10x
# FullFT's", ~15x for very short runs). docs/planning.md has the evidence and what it does not say.
LORA_LR_FACTOR = 10


@dataclass(frozen=True)
class BaseInputs:
    """The formula's two pretraining inputs, each with where it came from (None when nothing gave it)."""

    base_lr: float | None
    base_lr_from: str
    batch_tokens: int | None
    batch_tokens_from: str

    @property
    def complete(self) -> bool:
        return self.base_lr is not None and self.batch_tokens is not None


def base_inputs(recipe, base_lr: float | None = None, batch_tokens: int | None = None,
                family_name: str | None = None) -> BaseInputs:
    """Each input from the first that gives it: command-line flags, the recipe (lr_base,
    lr_pretrained_batch_tokens), the family table (--family NAME, else the row matching base_model)."""
    family = family_by_name(family_name) if family_name else find_family(recipe.base_model)
    table = f"family table: {family.name} ({family.source})" if family else None
    via = "chosen with --family" if family_name else "matched by base_model"

    def pick(flag_value, flag, recipe_value, key, family_value):
        if flag_value is not None:
            return flag_value, f"flag {flag}"
        if recipe_value is not None:
            return recipe_value, f"recipe `{key}`"
        if family is not None:
            return family_value, f"{table}, {via}"
        return None, f"not given: `{recipe.base_model}` is not in the family table; set `{key}` or pass {flag}"

    lr, lr_from = pick(base_lr, "--base-lr", recipe.lr_base, "lr_base", family and family.base_lr)
    batch, batch_from = pick(batch_tokens, "--pretrained-batch-tokens", recipe.lr_pretrained_batch_tokens,
                             "lr_pretrained_batch_tokens", family and family.pretrained_batch_tokens)
    return BaseInputs(lr, lr_from, batch, batch_from)


def base_lr_for(recipe) -> tuple[float, int, str]:
    """(base LR, pretraining batch tokens, source) for `learning_rate: auto`: from the recipe's lr_base /
    lr_pretrained_batch_tokens, else the family table row matching base_model. RecipeError if neither."""
    inputs = base_inputs(recipe)
    if not inputs.complete:
        missing = [k for k, v in (("lr_base", inputs.base_lr), ("lr_pretrained_batch_tokens", inputs.batch_tokens))
                   if v is None]
        raise RecipeError([
            f"`learning_rate: auto` needs {' and '.join(f'`{k}`' for k in missing)}: `{recipe.base_model}` is not in "
            "the model family table (docs/planning.md). Set them from the base model's paper, e.g. "
            "lr_base: 3.0e-4 and lr_pretrained_batch_tokens: 4000000 for Llama 2 7B, or give a number for learning_rate"
        ])
    sources = dict.fromkeys((inputs.base_lr_from, inputs.batch_tokens_from))  # one entry when both agree
    return inputs.base_lr, inputs.batch_tokens, "; ".join(sources)


def _steps_and_epochs(recipe, train_examples: int, world_size: int) -> tuple[int, float]:
    total_steps = optimizer_steps(train_examples, recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                                  world_size, recipe.num_epochs, recipe.max_steps)
    # With max_steps the run covers total_steps / steps-per-epoch passes, not num_epochs.
    per_epoch = optimizer_steps(train_examples, recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                                world_size, 1, None)
    return total_steps, (recipe.num_epochs if recipe.max_steps is None else total_steps / per_epoch)


def lr_plan_for_recipe(recipe, train_examples: int, supervised_tokens: int, world_size: int = 1) -> LrPlan:
    """The formula over the recipe's exact optimizer steps and the training split's supervised tokens."""
    total_steps, epochs = _steps_and_epochs(recipe, train_examples, world_size)
    base_lr, batch, source = base_lr_for(recipe)
    return plan_learning_rate(supervised_tokens, total_steps, epochs, base_lr, batch, source)


def resolve_learning_rate(recipe, train_stats: dict, world_size: int = 1) -> tuple[float, LrPlan | None]:
    """(learning rate to train with, the plan when it was derived). `train_stats` is
    Prepared.stats["train"]: {"examples", "tokens", "supervised_tokens"}. A preference method's `auto` is its
    published default (an SFT formula over response tokens would mean nothing for a preference loss)."""
    if recipe.learning_rate != "auto":
        return float(recipe.learning_rate), None
    if recipe.method != "sft":
        plan = preference_lr_plan(recipe)
        return plan.learning_rate, plan
    plan = lr_plan_for_recipe(recipe, train_stats["examples"], train_stats["supervised_tokens"], world_size)
    return plan.learning_rate, plan


def _ratio(a: float, b: float) -> str:
    r = a / b
    if r < 1:
        return f"1/{1 / r:.2g} of"
    return f"{r:.2g}x" if r < 10 else f"{r:,.0f}x"


def _row(label: str, value: str, note: str = "") -> str:
    return f"{label:<27}{value}" + (f"   ({note})" if note else "")


def recipe_lr_report(recipe, train_examples: int, supervised_tokens: int, world_size: int,
                     inputs: BaseInputs) -> list[str]:
    """`finetune lr recipe.yml`: the data's counts, the formula's LR (when its inputs are known) and the
    recipe's own learning_rate side by side, every input with where it came from."""
    steps, epochs = _steps_and_epochs(recipe, train_examples, world_size)
    per_step = supervised_tokens / (steps / epochs) if steps else 0.0
    lines = [
        f"supervised tokens          {supervised_tokens:,}   (training split, tokenized)",
        f"optimizer steps            {steps:,} over {epochs:g} epoch(s)   (micro_batch_size {recipe.micro_batch_size} x "
        f"accumulation {recipe.gradient_accumulation_steps} x {world_size} process(es))",
        f"supervised tokens / step   {per_step:,.0f}",
        _row("base LR", "-" if inputs.base_lr is None else format_lr(inputs.base_lr), inputs.base_lr_from),
        _row("pretraining batch tokens", "-" if inputs.batch_tokens is None else f"{inputs.batch_tokens:,}",
             inputs.batch_tokens_from),
    ]
    adapter = recipe.adapter != "none" or recipe.load_in_4bit or recipe.load_in_8bit
    formula = None
    if inputs.complete:
        plan = plan_learning_rate(supervised_tokens, steps, epochs, inputs.base_lr, inputs.batch_tokens)
        formula = plan.learning_rate
        lines.append(_row("formula, full fine-tune", format_lr(formula), f"= {format_lr(inputs.base_lr)} x "
                          f"sqrt({plan.tokens_per_step:,.0f} / {inputs.batch_tokens:,})"))
        if adapter:
            lines.append(_row(f"formula x {LORA_LR_FACTOR} for LoRA", format_lr(formula * LORA_LR_FACTOR),
                              "LoRA's best LR is ~10x full fine-tuning's: \"LoRA Without Regret\", 2025; "
                              "docs/planning.md"))
    else:
        lines.append("formula                    needs both inputs above: pass --base-lr and --pretrained-batch-tokens "
                     "(or --family NAME, see --list-families), or set lr_base and lr_pretrained_batch_tokens")
    lines.append(_recipe_line(recipe, formula, adapter))
    return lines


def _recipe_line(recipe, formula: float | None, adapter: bool) -> str:
    if recipe.learning_rate == "auto":
        if not base_inputs(recipe).complete:  # training reads the recipe and the table, never this command's flags
            return ("recipe learning_rate       auto   (training stops there: set lr_base and lr_pretrained_batch_tokens "
                    "in the recipe, or a number)")
        note = (f"; that is the full fine-tune figure: for LoRA consider learning_rate: "
                f"{format_lr(formula * LORA_LR_FACTOR)}" if adapter else "")
        return f"recipe learning_rate       auto   (training uses the formula from the recipe's inputs{note})"
    lr = float(recipe.learning_rate)
    line = f"recipe learning_rate       {format_lr(lr)}   (recipe `learning_rate`"
    if formula is not None:
        line += f"; {_ratio(lr, formula)} the full fine-tune formula"
        if adapter:
            line += f", {_ratio(lr, formula * LORA_LR_FACTOR)} the LoRA figure"
    return line + "; training uses this)"


def _grpo_steps_and_epochs(recipe, prompts: int, world_size: int) -> tuple[int, float]:
    """GRPO's optimizer steps over `prompts` training prompts (micro_batch_size counts completions: plan/grpo.py)."""
    steps = grpo_steps(prompts, recipe.micro_batch_size, recipe.gradient_accumulation_steps, world_size,
                       method_setting(recipe, "num_generations"), method_setting(recipe, "num_iterations"),
                       recipe.num_epochs, recipe.max_steps)
    return steps.total_steps, (recipe.num_epochs if recipe.max_steps is None
                               else steps.total_steps / steps.steps_per_epoch)


def preference_lr_report(recipe, train_examples: int, world_size: int) -> list[str]:
    """`finetune lr recipe.yml` for a preference method or GRPO: its published defaults with their sources, beside
    the recipe's learning_rate. `train_examples` is what the training split holds in the method's unit (pairs, KTO
    examples or packed rows, as the Trainer iterates them; GRPO's prompts)."""
    row = METHOD_LRS[recipe.method]
    grpo = recipe.method == "grpo"
    if grpo:
        steps, epochs = _grpo_steps_and_epochs(recipe, train_examples, world_size)
    else:
        steps, epochs = _steps_and_epochs(recipe, train_examples, world_size)
    unit = "KTO examples" if recipe.method == "kto" else "prompts" if grpo else "pairs"
    unit = "packed rows" if recipe.sample_packing else unit
    plan = preference_lr_plan(recipe)
    batch = (f"micro_batch_size {recipe.micro_batch_size} x accumulation {recipe.gradient_accumulation_steps} x "
             f"{world_size} process(es)")
    if grpo:  # micro_batch_size counts completions
        group = method_setting(recipe, "num_generations")
        per_step = recipe.micro_batch_size * recipe.gradient_accumulation_steps * world_size // group
        batch = f"{per_step:,} prompts per step: {batch} completions / num_generations {group}"
    lines = [
        f"{'training ' + unit:<27}{train_examples:,}   (training split, tokenized)",
        f"optimizer steps            {steps:,} over {epochs:g} epoch(s)   ({batch})",
        _row(f"{recipe.method} default, full FT", format_lr(row.full), row.full_source),
        _row(f"{recipe.method} default, LoRA", format_lr(row.lora), row.lora_source),
        f"usual range                {row.usual}",
    ]
    setup = "LoRA" if uses_adapter(recipe) else "full fine-tune"
    if recipe.learning_rate == "auto":
        lines.append(f"recipe learning_rate       auto   (training uses {format_lr(plan.learning_rate)}, the {setup} "
                     "default)")
    else:
        lr = float(recipe.learning_rate)
        lines.append(f"recipe learning_rate       {format_lr(lr)}   (recipe `learning_rate`; "
                     f"{_ratio(lr, plan.learning_rate)} the {setup} default; training uses this)")
    kind = "a policy-gradient" if grpo else "a reward model's" if recipe.method == "reward" else "a preference"
    lines.append("not used                   the SFT formula (lr_base x sqrt(supervised tokens per step / pretraining "
                 f"batch)): it sizes next-token updates, not {kind} loss's")
    return lines
