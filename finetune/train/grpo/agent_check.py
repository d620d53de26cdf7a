"""A GRPO recipe's environment and tools checked before a run: `finetune validate` prints what they offer, and a run
refuses to start on what would fail later (docs/grpo.md, "Agents").

Checked: the environment class and each tool load (in a spawned process: finetune/agent_tools.py) and give a JSON
schema (type hints, a docstring with `Args:`); a recipe without reward functions has an environment with
get_reward(); the prompts are conversations (the tools are offered by the chat template); the chat template renders
tool calls, tool results and the tools offered, and is prefix-preserving (finetune/data/tool_chat.py); the model's
tool calls can be read (tool_calls.py). Each problem is one message naming the fix, exit 2.
"""

from __future__ import annotations

from pathlib import Path

from finetune.agent_tools import ToolError


def uses_agents(recipe) -> bool:
    return recipe.method == "grpo" and bool(recipe.environment or recipe.tools)


def described(recipe, base_dir) -> dict:
    """The environment's and tools' schemas and names, from a worker; ToolError when they cannot be had."""
    from finetune.agent_tools import schemas_in_worker

    info = schemas_in_worker(recipe.environment, recipe.tools, base_dir)
    problem = reward_problem(recipe, info)
    if problem:
        raise ToolError(problem)
    return info


def reward_problem(recipe, info: dict) -> str | None:
    """What is wrong with the rewards of a recipe whose environment and tools `info` describes, or None."""
    if not recipe.rewards and not info["environment_reward"]:
        return (f"the recipe has no `rewards` and environment `{recipe.environment}` has no get_reward(): nothing "
                "scores an episode; add `rewards: [{function: rewards.py:NAME}]` or a `def get_reward(self) -> "
                "float` to the class")
    if info["environment"] and info["environment"] in [r.function.rpartition(":")[2] for r in recipe.rewards]:
        return f"a reward function is named {info['environment']}, the name of the environment's reward; rename one"
    return None


def check_tokenizer(tokenizer, info: dict):
    """The parser of the template's tool calls; ToolError when the template cannot carry an episode."""
    from finetune.data.tool_chat import TEMPLATE_FIX, template_problem
    from finetune.train.grpo.tool_calls import call_parser

    problem = template_problem(tokenizer, "the chat template")
    if problem:
        raise ToolError(f"`tools` / `environment`: {problem}")
    parser = call_parser(tokenizer)
    if parser is None:
        raise ToolError("`tools` / `environment`: finetune cannot read this chat template's tool calls (no "
                        "response_template on the tokenizer, and neither the Hermes <tool_call> format nor Llama 3's "
                        f"JSON calls); {TEMPLATE_FIX}")
    return parser


def check_prompts(records: list[dict], plain: int | None = None) -> None:
    """ToolError when prompts are plain text: `plain` their count among all of them (the data stage's `formats`),
    else counted among `records`."""
    total = "all the" if plain is not None else f"the first {len(records)}"
    plain = sum(isinstance(r.get("prompt"), str) for r in records) if plain is None else plain
    if plain:
        raise ToolError(f"`tools` / `environment` need conversation prompts ({plain} of {total} prompts are plain "
                        "text): the chat template offers the tools and writes the calls; give `prompt` as "
                        "[{\"role\": \"user\", \"content\": ...}]")


def validate_agents(recipe, records: list[dict], say=print) -> int:
    """`finetune validate`: the tools offered and the template's fitness, 0; or the problem, 2."""
    from finetune.model.loader import load_tokenizer

    try:
        check_prompts(records)
        info = described(recipe, Path.cwd())
        check_tokenizer(load_tokenizer(recipe), info)
    except ToolError as err:
        say(f"agents: FAILED: {err}")
        return 2
    env = f"environment {info['environment']}" + (" (get_reward: an extra reward, weight 1)"
                                                 if info["environment_reward"] else "") if info["environment"] else ""
    say(f"agents: {len(info['schemas'])} tools offered ({', '.join(info['tools'])}){'; ' + env if env else ''}; the "
        "chat template renders tool calls and results and is prefix-preserving")
    return 0
