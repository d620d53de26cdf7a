"""The training method: supervised fine-tuning, preference tuning (DPO, IPO, ORPO, SimPO, KTO), a reward model
trained on the same pairs (Bradley-Terry), or online RL with rewards a program or a reward model gives (GRPO), and the
settings each method reads.

Every method setting is a flat recipe key named as axolotl names it (`rl_beta`, `dpo_label_smoothing`,
`simpo_gamma`, `orpo_alpha`, `rpo_alpha`, `kto_desirable_weight`, `kto_undesirable_weight`; the reward model's
`center_rewards_coefficient` and GRPO's in finetune/recipe/grpo.py, named as TRL names them). A key is
`None` in the schema; METHOD_SETTINGS below is where each one's default for each method lives (the recipe
is the only place a default lives: this module is part of it), and `method_setting(recipe, key)` reads
the value a run trains with. A key the recipe's method does not read is an error, never silently ignored.

The keys themselves are MethodKeys, at the end. Pure Python: the recipe imports nothing heavy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from finetune.recipe.tags import TOKENS, TRAIN, Strict, affects

METHODS = ("sft", "dpo", "ipo", "orpo", "simpo", "kto", "reward", "grpo")
PREFERENCE_METHODS = ("dpo", "ipo", "orpo", "simpo", "kto")  # tune the policy on preferences
PAIRED_METHODS = ("dpo", "ipo", "orpo", "simpo", "reward")  # need {prompt, chosen, rejected}
REFERENCE_METHODS = ("dpo", "ipo", "kto")  # compare the policy with a reference (the model before step 1)

# key -> {method: default}. Sources: DPO (Rafailov et al. 2023) and TRL's DPOConfig beta 0.1; IPO (Azar et
# al. 2023) tau 0.1; SimPO (Meng et al. 2024) beta 2.0 with gamma/beta 0.5, no SFT term; ORPO (Hong et al.
# 2024) lambda 0.1; KTO (Ethayarajh et al. 2024) beta 0.1, both weights 1.0.
# GRPO (Shao et al. 2024; TRL 1.16's GRPOConfig): beta 0 (no reference pass: TRL's default since DAPO / Dr. GRPO
# found the KL term unneeded for verifiable rewards), G 8, clip 0.2, loss dapo, group scaling; completions of at most
# 256 tokens instead of TRL's 512 so that a CPU run stays short.
# Reward model (TRL 1.16's RewardConfig): no centering term unless asked (TRL: None; 0 is the same loss).
METHOD_SETTINGS: dict[str, dict[str, object]] = {
    "rl_beta": {"dpo": 0.1, "ipo": 0.1, "simpo": 2.0, "kto": 0.1, "grpo": 0.0},
    "dpo_label_smoothing": {"dpo": 0.0},
    "rpo_alpha": {"dpo": 0.0, "ipo": 0.0, "simpo": 0.0},
    "simpo_gamma": {"simpo": 1.0},
    "orpo_alpha": {"orpo": 0.1},
    "kto_desirable_weight": {"kto": 1.0},
    "kto_undesirable_weight": {"kto": 1.0},
    "center_rewards_coefficient": {"reward": 0.0},
    "num_generations": {"grpo": 8},
    "max_completion_length": {"grpo": 256},
    "temperature": {"grpo": 1.0},
    "top_p": {"grpo": 1.0},
    "top_k": {"grpo": 0},
    "loss_type": {"grpo": "dapo"},
    "epsilon": {"grpo": 0.2},
    "epsilon_high": {"grpo": None},  # None: the same as epsilon (method_setting answers epsilon's value)
    "num_iterations": {"grpo": 1},
    "scale_rewards": {"grpo": "group"},
    "mask_truncated_completions": {"grpo": False},
}

# the record shapes each kind of method trains on (finetune/ingest/records.py)
SFT_SHAPES = ("completion", "instruction", "chat")
PAIR_SHAPES = ("preference",)
UNPAIRED_SHAPES = ("unpaired", "preference")  # KTO also reads pairs: chosen is desirable, rejected is not
PROMPT_SHAPES = ("prompt",)  # GRPO: {prompt, ...columns the rewards read}


def is_grpo(recipe) -> bool:
    return recipe.method == "grpo"


def is_preference(recipe) -> bool:
    return recipe.method in PREFERENCE_METHODS


def is_reward(recipe) -> bool:
    """`method: reward`: a sequence-classification head trained on preference pairs (finetune/train/reward/)."""
    return recipe.method == "reward"


def reads_pairs(recipe) -> bool:
    """The method trains on preference records through the pair store (finetune/data/preference/)."""
    return is_preference(recipe) or is_reward(recipe)


def uses_reference(recipe) -> bool:
    return recipe.method in REFERENCE_METHODS


def shapes_for(method: str) -> tuple[str, ...]:
    """The record shapes `method` trains on."""
    if method == "sft":
        return SFT_SHAPES
    if method == "grpo":
        return PROMPT_SHAPES
    return UNPAIRED_SHAPES if method == "kto" else PAIR_SHAPES


def method_setting(recipe, key: str) -> float:
    """The value `key` has in this run: the recipe's, else the method's default."""
    defaults = METHOD_SETTINGS[key]
    if recipe.method not in defaults:
        raise KeyError(f"`{key}` is not a setting of method {recipe.method}")
    value = getattr(recipe, key)
    if value is None and key == "epsilon_high":
        return method_setting(recipe, "epsilon")
    return defaults[recipe.method] if value is None else value


def method_settings(recipe) -> dict[str, float]:
    """Every setting the recipe's method reads, resolved (what run.json records)."""
    return {key: method_setting(recipe, key) for key, per_method in METHOD_SETTINGS.items()
            if recipe.method in per_method}


def _users(key: str) -> str:
    methods = list(METHOD_SETTINGS[key])
    return ", ".join(f"`{m}`" for m in methods[:-1]) + (" or " if len(methods) > 1 else "") + f"`{methods[-1]}`"


def method_problems(recipe) -> list[str]:
    """Keys the method does not read, records it cannot train on, and settings that mean nothing to it."""
    problems = []
    for key in METHOD_SETTINGS:
        if getattr(recipe, key) is not None and recipe.method not in METHOD_SETTINGS[key]:
            problems.append(f"`{key}` is a setting of method {_users(key)}, not of `method: {recipe.method}`; "
                            f"remove it, or set the method it belongs to")
    label_smoothing = recipe.dpo_label_smoothing
    if label_smoothing is not None and not 0.0 <= label_smoothing < 0.5:
        problems.append(f"`dpo_label_smoothing` {label_smoothing} must be in [0, 0.5): the probability that a "
                        "pair's labels are flipped")
    allowed = shapes_for(recipe.method)
    for i, spec in enumerate(recipe.datasets):
        shape = spec.type
        if shape in ("completion", "instruction", "chat", "preference", "unpaired", "prompt") and shape not in allowed:
            problems.append(_shape_problem(i, shape, recipe.method, allowed))
        elif shape in ("html", "csv", "sql", "sqlite", "database") and recipe.method != "sft":
            wanted = ("prompt records ({prompt, ...the columns your rewards read}: docs/grpo.md)" if is_grpo(recipe)
                      else "preference records ({prompt, chosen, rejected}: docs/preference.md)")
            problems.append(f"`datasets.{i}.type: {shape}` ingests supervised records (text, instruction or chat), "
                            f"which `method: {recipe.method}` cannot train on; give it a file of {wanted}")
    if recipe.method != "sft" and recipe.train_on_inputs:
        problems.append(f"`train_on_inputs` does not apply to `method: {recipe.method}`: its loss is on responses, "
                        "never on prompts; remove it")
    if recipe.rl_beta == 0 and recipe.method not in ("grpo", "sft", "reward"):
        problems.append(f"`rl_beta` 0 leaves `method: {recipe.method}` without its scale: it must be above 0 "
                        "(the default is 0.1; SimPO 2.0)")
    return problems


def _shape_problem(index: int, shape: str, method: str, allowed: tuple[str, ...]) -> str:
    if shape == "prompt":
        return (f"`datasets.{index}.type: prompt` holds prompts without answers, which only `method: grpo` trains on "
                "(docs/grpo.md); set `method: grpo`, or point it at records with answers")
    if method == "grpo":
        return (f"`datasets.{index}.type: {shape}` holds {shape} records, but `method: grpo` trains on prompt records "
                "({prompt, ...the columns your rewards read}: docs/grpo.md); set `type: prompt` or `auto`")
    if shape == "unpaired" and method != "sft":
        return (f"`datasets.{index}.type: unpaired` holds unpaired records ({{prompt, completion, label}}), which only "
                f"`method: kto` trains on; `method: {method}` needs pairs ({{prompt, chosen, rejected}})")
    if method == "sft":
        return (f"`datasets.{index}.type: {shape}` holds preference records, but the recipe trains "
                f"`method: sft`; set `method: dpo` (or ipo, orpo, simpo, kto), or point it at SFT records")
    return (f"`datasets.{index}.type: {shape}` holds supervised records, but `method: {method}` trains on "
            f"{' or '.join(allowed)} records (docs/preference.md); set `method: sft`, or point it at preference data")


class MethodKeys(Strict):
    """The training method and its settings (METHOD_SETTINGS above holds each one's default per method)."""

    # tokens too: KTO reads a pair as two unpaired examples, so the method changes what is tokenized
    method: Literal[METHODS] = Field(  # type: ignore[valid-type]
        "sft",
        description=(
            "`sft`: supervised fine-tuning on completion / instruction / chat records. Preference tuning on "
            "{prompt, chosen, rejected} pairs: `dpo`, `ipo` (against the reference: the model as it is before the "
            "first step), `orpo`, `simpo` (no reference); `kto` on {prompt, completion, label} records or pairs "
            "(docs/preference.md). `reward`: a reward model (a one-output sequence-classification head, "
            "Bradley-Terry loss) on the same pairs (docs/reward-models.md). `grpo`: online RL on {prompt, ...} "
            "records with the `rewards` functions or reward models (docs/grpo.md)."
        ),
        json_schema_extra=affects(TRAIN, TOKENS),
    )

    rl_beta: float | None = Field(
        None, ge=0.0,
        description=("How far the policy may move from the reference (DPO, IPO's tau, KTO; GRPO's KL weight) or the "
                     "reward scale (SimPO). Default: 0.1; SimPO 2.0; GRPO 0 (no KL term and no reference pass)."),
        json_schema_extra=affects(TRAIN),
    )

    dpo_label_smoothing: float | None = Field(
        None, ge=0.0,
        description="DPO: the assumed probability that a pair's labels are flipped (conservative DPO), in [0, 0.5). Default 0.",
        json_schema_extra=affects(TRAIN),
    )

    rpo_alpha: float | None = Field(
        None, ge=0.0,
        description=("DPO, IPO, SimPO: weight of an SFT term, the mean negative log-likelihood of the chosen "
                     "responses' tokens, added to the loss (RPO; SimPO's `cpo_alpha`). Default 0: off."),
        json_schema_extra=affects(TRAIN),
    )

    simpo_gamma: float | None = Field(
        None, ge=0.0, description="SimPO: the target reward margin gamma. Default 1.0 (gamma / beta = 0.5).",
        json_schema_extra=affects(TRAIN),
    )

    orpo_alpha: float | None = Field(
        None, gt=0.0, description="ORPO: weight (lambda) of the odds-ratio term beside the chosen NLL. Default 0.1.",
        json_schema_extra=affects(TRAIN),
    )

    kto_desirable_weight: float | None = Field(
        None, gt=0.0, description="KTO: weight of desirable examples' loss. Default 1.0.",
        json_schema_extra=affects(TRAIN),
    )

    kto_undesirable_weight: float | None = Field(
        None, gt=0.0,
        description=("KTO: weight of undesirable examples' loss. Default 1.0; with unbalanced data, aim for "
                     "desirable_weight x desirable count / (undesirable_weight x undesirable count) in [1, 4/3]."),
        json_schema_extra=affects(TRAIN),
    )

    center_rewards_coefficient: float | None = Field(
        None, ge=0.0,
        description=("Reward model: weight of a term pulling scores toward 0, coefficient x mean((r_chosen + "
                     "r_rejected)^2) (TRL's name; Eisenstein et al. 2023 use 0.01). The Bradley-Terry loss sees only "
                     "differences, so scores may drift as a whole; centering keeps them near 0, which matters when "
                     "they are summed with other rewards. Default 0: off."),
        json_schema_extra=affects(TRAIN),
    )
