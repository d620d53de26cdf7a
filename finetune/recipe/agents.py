"""The recipe's agent keys: tools and environments, named as TRL 1.16's GRPOTrainer names them (`tools=`,
`environment_factory=`, GRPOConfig's `max_tool_calling_iterations`), docs/grpo.md "Agents".

`tools` serves two methods: GRPO offers them to the model and runs its calls; SFT renders them into the chat
template of tool transcripts. The other keys are GRPO's, their defaults in finetune/recipe/methods.py's
METHOD_SETTINGS like every method setting.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from finetune.recipe.tags import TOKENS, TRAIN, Strict, affects


class AgentKeys(Strict):
    """Tools the model may call, and environments that keep state across an episode's turns."""

    environment: str | None = Field(
        None,
        description=("GRPO: `FILE.py:Class` or `package.module:Class`, a TRL environment_factory class. One instance "
                     "per rollout, `reset(**record)` before each episode (a string it returns is appended to the "
                     "prompt's last message), its public methods (type hints and docstrings) the tools, "
                     "`get_reward()` (optional) an extra reward of weight 1 named after the class. Runs in worker "
                     "processes, never in the training process."),
        json_schema_extra=affects(TRAIN),
    )
    tools: list[str] = Field(
        [],
        description=("Tool functions, `[FILE.py:NAME, ...]` (TRL's `tools=`: type hints and a docstring each). GRPO: "
                     "offered to the model beside the environment's methods, each call run in a worker with "
                     "`tool_timeout_s`. SFT: the tools rendered into the chat template of records without a `tools` "
                     "column."),
        json_schema_extra=affects(TRAIN, TOKENS),
    )
    max_tool_calling_iterations: int | None = Field(
        None, ge=1,
        description=("GRPO: tool-calling rounds per episode (TRL's name); an episode still calling tools then ends "
                     "(counted: `episodes/cut_by_cap`). Default: no cap (TRL's); max_completion_length bounds every "
                     "episode's tokens anyway."),
        json_schema_extra=affects(TRAIN),
    )
    tool_timeout_s: float | None = Field(
        None, gt=0.0,
        description=("GRPO: seconds one tool call (or one environment's reset / get_reward) may take; a call that "
                     "takes longer gets `{'error': ...}` as its result, is counted as a failure, and its worker is "
                     "replaced. Default 30."),
        json_schema_extra=affects(),
    )
    max_tool_response_tokens: int | None = Field(
        None, ge=1,
        description=("GRPO: the longest tool result the model is shown, in tokens; a longer one is an error result "
                     "(counted), never a flood of tokens. Default 512."),
        json_schema_extra=affects(TRAIN),
    )


def agent_problems(recipe) -> list[str]:
    """What the recipe's agent keys cannot mean; the specs themselves are imported and checked in a worker by
    `finetune validate` and before a run (finetune/train/grpo/agent_check.py)."""
    from finetune.reward_functions import is_file_spec

    problems = []
    if recipe.environment and recipe.method != "grpo":
        problems.append(f"`environment` runs episodes that `method: grpo` generates; `method: {recipe.method}` "
                        "trains on fixed records: remove it, or set `method: grpo`")
    if recipe.tools and recipe.method not in ("grpo", "sft"):
        problems.append(f"`tools` are offered to the model by `method: grpo` and rendered into tool transcripts by "
                        f"`method: sft`; `method: {recipe.method}` uses neither: remove `tools`")
    for key, specs in (("environment", [recipe.environment] if recipe.environment else []), ("tools", recipe.tools)):
        for i, spec in enumerate(specs):
            target, sep, name = str(spec).rpartition(":")
            label = key if key == "environment" else f"tools.{i}"
            if not sep or not target or not name:
                problems.append(f"`{label}`: `{spec}` is not `FILE.py:NAME` or `package.module:NAME`")
            elif is_file_spec(target) and not Path(target).is_file():
                problems.append(f"`{label}`: the file {target} does not exist (a FILE is relative to the recipe)")
    return problems
