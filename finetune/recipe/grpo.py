"""The recipe's GRPO keys: online RL with rewards a program checks (`method: grpo`, docs/grpo.md).

Names follow TRL's GRPOConfig (and axolotl's `trl:` block) where the concept is the same. Every key is `None`
in the schema; its default lives in finetune/recipe/methods.py's METHOD_SETTINGS, like every method setting,
so a GRPO key in a recipe of another method is an error there. Defaults are TRL 1.16's unless said otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from finetune.recipe.tags import TOKENS, TRAIN, Strict, affects

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
REWARD_SCALING = ("group", "batch", "none")


class RewardSpec(Strict):
    """One reward: a function (called with TRL's keyword arguments, returns a float or None per completion) or a
    reward model (a `method: reward` run's output_dir, or an HF sequence-classification folder with one output)."""

    function: str | None = Field(
        None,
        description=("`FILE.py:NAME` (relative to the recipe) or `package.module:NAME`. Called as TRL calls it: "
                     "`NAME(prompts=..., completions=..., completion_ids=..., **the record's other columns)`; returns "
                     "a list of floats, None where it does not apply. Set `function` or `model`."),
        json_schema_extra=affects(TRAIN),
    )
    model: str | None = Field(
        None,
        description=("A reward model: a `method: reward` run's output_dir (or an HF folder holding a "
                     "*ForSequenceClassification with one output), relative to the recipe. Scored in the training "
                     "process on the training device, batched, without gradients; each completion rendered with the "
                     "reward model's own template and EOS, as it trained (docs/reward-models.md). Named by its folder."),
        json_schema_extra=affects(TRAIN),
    )
    weight: float = Field(1.0, description="Weight of this reward in the total reward (a weighted sum).",
                          json_schema_extra=affects(TRAIN))
    normalize: bool = Field(
        False,
        description=("Z-score this reward within each group of G completions before the weighted sum (its group "
                     "mean 0, std 1), so a reward model's logits do not drown 0/1 rewards beside it. Logged values "
                     "stay raw."),
        json_schema_extra=affects(TRAIN),
    )
    timeout_s: float = Field(
        30.0, gt=0.0,
        description=("A function's seconds per call. A call that takes longer, raises, or returns the wrong length or a "
                     "non-number counts as missing for that batch (logged and in run.json); the run goes on."),
        json_schema_extra=affects(),
    )
    max_length: int | None = Field(
        None, gt=0,
        description=("A reward model's longest sequence (prompt + completion, its tokens); longer ones lose the "
                     "prompt's start, then the completion's. Default: the sequence_len it trained with."),
        json_schema_extra=affects(TRAIN),
    )
    batch_size: int = Field(8, gt=0, description="A reward model's sequences per forward pass.",
                            json_schema_extra=affects())

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.function is None) == (self.model is None):
            raise ValueError("give a reward either `function: FILE.py:NAME` or `model: FOLDER` (one of them)")
        wrong = ("timeout_s",) if self.model else ("max_length", "batch_size")
        # set to other than its default (a dumped recipe, run.json's, writes every key with its default)
        stray = [key for key in wrong if getattr(self, key) != type(self).model_fields[key].default]
        if stray:
            kind = "a reward model" if self.model else "a reward function"
            raise ValueError(f"`{'`, `'.join(stray)}` does not apply to {kind}; remove it")
        return self

    @property
    def label(self) -> str:
        return self.function or self.model


class GRPOKeys(Strict):
    """GRPO: G completions per prompt, rewarded by programs, the policy moved toward the better ones."""

    rewards: list[RewardSpec] = Field(
        [],
        description=("`method: grpo`: the reward functions and reward models, e.g. `[{function: rewards.py:correct}, "
                     "{model: runs/rm, weight: 0.5, normalize: true}]`. A function runs in a worker process with a "
                     "timeout; `finetune validate` imports each and checks its signature, and runs it on a few "
                     "records. A reward model is checked to be one (docs/reward-models.md)."),
        json_schema_extra=affects(TRAIN),
    )
    num_generations: int | None = Field(
        None, ge=2,
        description=("GRPO: completions per prompt (G), compared with each other. micro_batch_size counts "
                     "completions (as in TRL), so each process's micro_batch_size x gradient_accumulation_steps "
                     "must be a multiple of G. Default 8."),
        json_schema_extra=affects(TRAIN),
    )
    max_completion_length: int | None = Field(
        None, gt=0,
        description=("GRPO: the longest completion, in tokens; one still going is cut there (truncated). "
                     "Prompts get sequence_len minus this. Default 256 (TRL: 512; 256 keeps CPU runs short)."),
        json_schema_extra=affects(TRAIN, TOKENS),  # tokens: it decides which prompts fit
    )
    temperature: float | None = Field(
        None, gt=0.0, description="GRPO: sampling temperature. Default 1.0.", json_schema_extra=affects(TRAIN),
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="GRPO: nucleus sampling. Default 1.0 (off).", json_schema_extra=affects(TRAIN),
    )
    top_k: int | None = Field(
        None, ge=0, description="GRPO: sample from the k likeliest tokens. Default 0 (off).",
        json_schema_extra=affects(TRAIN),
    )
    loss_type: Literal[LOSS_TYPES] | None = Field(  # type: ignore[valid-type]
        None,
        description=("GRPO: how token losses are averaged. `grpo`: per completion, then over completions; "
                     "`dr_grpo`: a sum over tokens / (completions x max_completion_length) (no length bias); `dapo`, "
                     "`bnpo`: over every completion token of the optimizer step. Always over the whole optimizer "
                     "step, whatever its split into micro batches and processes. Default `dapo` (TRL's)."),
        json_schema_extra=affects(TRAIN),
    )
    epsilon: float | None = Field(
        None, gt=0.0, description="GRPO: the clip range's lower side (ratio >= 1 - epsilon). Default 0.2.",
        json_schema_extra=affects(TRAIN),
    )
    epsilon_high: float | None = Field(
        None, gt=0.0,
        description="GRPO: the clip range's upper side (ratio <= 1 + epsilon_high; DAPO uses 0.28). Default: epsilon.",
        json_schema_extra=affects(TRAIN),
    )
    num_iterations: int | None = Field(
        None, ge=1,
        description=("GRPO: policy updates per generation (mu): each generated batch trains this many optimizer "
                     "steps, the ratio taken against the log-probs at generation time. Default 1."),
        json_schema_extra=affects(TRAIN),
    )
    scale_rewards: Literal[REWARD_SCALING] | None = Field(  # type: ignore[valid-type]
        None,
        description=("GRPO: advantages are reward - group mean, divided by the `group`'s std, the `batch`'s std, or "
                     "`none` (Dr. GRPO). Default `group`."),
        json_schema_extra=affects(TRAIN),
    )
    mask_truncated_completions: bool | None = Field(
        None,
        description=("GRPO: leave completions cut at max_completion_length out of the loss (DAPO). Default false."),
        json_schema_extra=affects(TRAIN),
    )


# train refuses it (grpo_problems) and `finetune plan --zero-stage 3` says so, in these words
ZERO3_REFUSAL = ("`method: grpo` does not run under DeepSpeed ZeRO-3 yet: generation would gather every layer at every "
                 "token; use zero2 (or no deepspeed) for GRPO")


def grpo_problems(recipe, world_size: int) -> list[str]:
    """What makes a GRPO recipe impossible, with the numbers; [] for other methods (their stray GRPO keys are
    methods.py's to name)."""
    from finetune.recipe.checks import read_deepspeed_config, zero_stage
    from finetune.recipe.methods import method_setting

    if recipe.method != "grpo":
        return [f"`rewards` score completions that `method: grpo` generates; `method: {recipe.method}` trains on "
                "fixed responses: remove `rewards`, or set `method: grpo`"] if recipe.rewards else []
    problems = []
    if not recipe.rewards and not recipe.environment:
        problems.append("`method: grpo` needs at least one reward function: `rewards: [{function: rewards.py:NAME}]` "
                        "(docs/grpo.md), or an `environment` whose class scores itself with `get_reward()`")
    group = method_setting(recipe, "num_generations")
    per_process = recipe.micro_batch_size * recipe.gradient_accumulation_steps
    if per_process % group:
        # the smallest accumulation that fits whole groups: G / gcd(micro_batch_size, G)
        fits = group // math.gcd(recipe.micro_batch_size, group)
        problems.append(
            f"each optimizer step holds micro_batch_size {recipe.micro_batch_size} x gradient_accumulation_steps "
            f"{recipe.gradient_accumulation_steps} = {per_process} completions per process, not a multiple of "
            f"num_generations {group}: a prompt's {group} completions are scored in one step on one process; set "
            f"gradient_accumulation_steps to a multiple of {fits} (or change micro_batch_size or num_generations)")
    completion = method_setting(recipe, "max_completion_length")
    if completion >= recipe.sequence_len:
        problems.append(f"`max_completion_length` {completion} leaves no room for the prompt in sequence_len "
                        f"{recipe.sequence_len}; raise sequence_len or lower max_completion_length")
    epsilon_high = method_setting(recipe, "epsilon_high")
    if epsilon_high < method_setting(recipe, "epsilon") and recipe.epsilon_high is not None:
        problems.append(f"`epsilon_high` {epsilon_high} is below `epsilon` {method_setting(recipe, 'epsilon')}: the "
                        "clip range's upper side is usually the wider one (DAPO: 0.2 and 0.28)")
    if method_setting(recipe, "rl_beta") > 0 and recipe.adapter == "none":
        problems.append("`rl_beta` > 0 compares the policy with the starting model, which GRPO reads with the adapter "
                        "switched off: it needs `adapter: lora` or `qlora` (or `rl_beta: 0`, TRL's default)")
    iterations = method_setting(recipe, "num_iterations")
    for key in ("checkpoint_interval", "export_interval"):
        every = getattr(recipe, key)
        if iterations > 1 and every and every % iterations:
            problems.append(f"`{key}` {every} is not a multiple of num_iterations {iterations}: a checkpoint between "
                            "two updates of one generation could not resume exactly (the generation is not saved); "
                            f"make it a multiple of {iterations}")
    if recipe.deepspeed and zero_stage(read_deepspeed_config(recipe.deepspeed)[0] or {}) == 3:
        problems.append(ZERO3_REFUSAL)
    problems += reward_problems(recipe)
    if recipe.sample_packing:
        problems.append("`sample_packing` packs fixed examples; GRPO packs the completions it generates itself (a "
                        "prompt held once, its completions after it): remove `sample_packing`")
    return problems


def reward_problems(recipe) -> list[str]:
    """Each reward function imported and its signature checked, each reward model's folder checked to hold one, before
    any model loads (a FILE and a model folder are absolute by now; a `package.module:NAME` imports from sys.path and
    the current folder)."""
    from finetune.errors import RewardError
    from finetune.reward_functions import check_reward, load_reward

    from finetune.reward_models import reward_model_problem

    problems = []
    for i, entry in enumerate(recipe.rewards):
        if entry.model is not None:
            found = reward_model_problem(entry.model)
            problems += [f"`rewards.{i}.model`: {found}"] if found else []
            continue
        try:
            check_reward(load_reward(entry.function, Path.cwd()), entry.function)
        except RewardError as err:
            problems.append(f"`rewards.{i}`: {err}")
    return problems
