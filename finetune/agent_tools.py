"""Agents' tools and environments from their recipe specs, in TRL 1.16's contract (GRPOTrainer's `tools=` and
`environment_factory=`), so that what was written for TRL works unchanged:

    environment: envs.py:Counter          # a class: one instance per rollout, reset(**record) before each episode,
                                          # its public methods (type hints + docstring) the tools, get_reward() optional
    tools: [tools.py:add, tools.py:lookup]  # plain functions (type hints + docstring), stateless

A spec is `FILE.py:NAME` (relative to the recipe) or `package.module:NAME`, found as reward functions are
(finetune/reward_functions.py). A tool's JSON schema is transformers' `get_json_schema` of it (what
`apply_chat_template(tools=...)` renders): the model is offered exactly that.

A base module: pure Python, nothing heavy at import time (transformers is imported by `tool_schemas` only).
The user's code is imported in worker processes only (finetune/train/grpo/tool_worker.py), never in the
training process: `schemas_in_worker` gets the schemas from a spawned process.
"""

from __future__ import annotations

import inspect
import numbers
from pathlib import Path

from finetune.errors import RewardError
from finetune.reward_functions import load_reward, split_spec, where

RESERVED_METHODS = ("reset", "get_reward")  # an environment's methods that are never tools (TRL's)
SCHEMA_TIMEOUT_S = 180.0  # importing a tools file and transformers in a fresh process: seconds on a busy machine


class ToolError(RewardError):
    """An environment or tool cannot be loaded or described, or a chat template cannot carry tool calls."""


def load_environment(spec: str, base_dir):
    """The environment class (any factory: called with no arguments, one instance per rollout) a spec names."""
    factory = _load(spec, base_dir, "environment")
    if not inspect.isclass(factory) and not callable(factory):
        raise ToolError(f"environment `{spec}`: names a {type(factory).__name__}, not a class")
    cls = factory if inspect.isclass(factory) else None
    if cls is not None and not callable(getattr(cls, "reset", None)):
        raise ToolError(f"environment `{spec}` ({where(cls.__init__)}): the class has no `reset` method; TRL's "
                        "contract: `def reset(self, **kwargs) -> str | None`, called before each episode with the "
                        "record's columns (return a string to append it to the prompt's last message)")
    return factory


def load_tool(spec: str, base_dir):
    func = _load(spec, base_dir, "tool")
    if inspect.isclass(func):
        raise ToolError(f"tool `{spec}` is a class; a tool is a function (an environment class goes in `environment:`)")
    return func


def _load(spec: str, base_dir, what: str):
    try:
        split_spec(spec)
        return load_reward(spec, base_dir)
    except RewardError as err:
        raise ToolError(str(err).replace("reward `", f"{what} `", 1)) from None


def environment_methods(cls) -> list[str]:
    """The names of an environment class's tools: its public functions but reset and get_reward (TRL lists them on
    the class, so properties are not evaluated)."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in RESERVED_METHODS and not name.startswith("_")]


def has_reward(cls) -> bool:
    return callable(getattr(cls, "get_reward", None))


def tool_schemas(functions: list, labels: list[str]) -> list[dict]:
    """Each tool's JSON schema (transformers' get_json_schema, as apply_chat_template builds it); ToolError naming the
    tool, its file and line, and what its docstring or hints lack."""
    from transformers.utils import get_json_schema

    schemas, problems = [], []
    for func, label in zip(functions, labels):
        try:
            schemas.append(get_json_schema(func))
        except Exception as err:  # DocstringParsingException, TypeHintParsingException: both say what is missing
            problems.append(f"tool `{label}` ({where(func)}): {err}. A tool needs type hints on every argument and a "
                            "docstring with a line per argument under `Args:` (TRL's and transformers' contract)")
    names = [s["function"]["name"] for s in schemas]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"two tools are named {', '.join(twice)}: the model calls a tool by its name; rename one")
    if problems:
        raise ToolError("; ".join(problems))
    return schemas


def describe(environment: str | None, tools: list[str], base_dir) -> dict:
    """What the recipe's environment and tools offer: {"schemas": [...], "environment": class name or None,
    "environment_reward": whether it has get_reward, "tools": tool names}. Imports the user's code: call it in a
    worker (schemas_in_worker) from the training process."""
    functions, labels, name, rewarded = [], [], None, False
    for spec in tools:
        functions.append(load_tool(spec, base_dir))
        labels.append(spec)
    if environment:
        cls = load_environment(environment, base_dir)
        name = getattr(cls, "__name__", type(cls).__name__)
        methods = environment_methods(cls) if inspect.isclass(cls) else []
        if inspect.isclass(cls) and not methods:
            raise ToolError(f"environment `{environment}` ({where(cls.reset)}): the class has no public method besides "
                            "reset and get_reward, so the model has no tool to call; add a method with type hints "
                            "and a docstring (it becomes a tool)")
        functions += [getattr(cls, m) for m in methods]
        labels += [f"{environment}.{m}" for m in methods]
        rewarded = has_reward(cls)
    schemas = tool_schemas(functions, labels)  # a method read from the class: get_json_schema leaves `self` out
    return {"schemas": schemas, "environment": name, "environment_reward": rewarded,
            "tools": [s["function"]["name"] for s in schemas]}


def schemas_in_worker(environment: str | None, tools: list[str], base_dir) -> dict:
    """describe() in a spawned process: the training process gets the schemas without importing the user's code.
    Raises ToolError as describe() does, or when the process dies or hangs."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(_describe_or_error, environment, list(tools), str(base_dir))
        try:
            outcome = future.result(timeout=SCHEMA_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            raise ToolError(f"importing the environment / tools did not finish in {SCHEMA_TIMEOUT_S:.0f} s; an import "
                            "in the file hangs (try `python -c 'import ...'` on it)") from None
        except concurrent.futures.process.BrokenProcessPool:
            raise ToolError("the process importing the environment / tools died (a crash or os._exit() at import); "
                            "import the file in Python to see why") from None
    if isinstance(outcome, str):
        raise ToolError(outcome)
    return outcome


def _describe_or_error(environment, tools, base_dir):
    try:
        return describe(environment, tools, Path(base_dir))
    except RewardError as err:
        return str(err)
    except (Exception, SystemExit) as err:  # at import time of the user's file, anything can happen
        return f"loading the environment / tools failed: {type(err).__name__}: {err}"


# --- what a tool returned, as the message the model reads ----------------------------------------------------------
PLAIN_VALUES = (str, numbers.Real, bool, dict, list, tuple)


def tool_content(result) -> tuple[str | None, str | None]:
    """(the tool message's content, None) or (None, why it cannot be one). A string as it is; a number, bool, dict
    or list as str() writes it (TRL 1.16 sends str(result)); None or another object is a failure (a missing
    `return`, a handle that means nothing to the model)."""
    if isinstance(result, str):
        return result, None
    if isinstance(result, PLAIN_VALUES) and not isinstance(result, (bytes, bytearray)):
        return str(result), None
    if result is None:
        return None, "returned None (a missing `return`?); a tool returns the text the model reads"
    return None, f"returned a {type(result).__name__}, not a string (or a number, dict or list)"


def error_content(message: str) -> str:
    """The content of a failed call, as TRL 1.16 writes it: str({"error": message})."""
    return str({"error": message})
