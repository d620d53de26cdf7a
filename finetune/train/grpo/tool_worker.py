"""One tools worker process: it loads the recipe's environment class and tool functions itself from their specs
(finetune/agent_tools.py), then answers one request at a time over a pipe, holding the environment instances of
the rollouts it serves between their turns. The process is the reward workers' (finetune/train/grpo/reward_worker.py:
spawned, its own process group killed whole on a hang, its parent watched), so the training process never imports
the user's code, and a tool that hangs or ends its process takes only this worker down.

Requests (the reply to each is ("ok", value) or ("failed", kind, message, shown): `shown` what the model reads in
the tool's result, `{'error': shown}`, as TRL 1.16 writes it: an exception's str(), nothing of this process):

    ("reset", slot, row)                 the slot's instance (made once, reused: TRL's pool) reset with the record's
                                         columns; value: the observation (a string, or None)
    ("call", slot, name, arguments, cap)  the tool `name` (a function, or the slot's environment method) called with
                                         the arguments; value: its result as the text the model reads, at most `cap`
                                         characters (longer: "oversized", the text never crosses the pipe)
    ("reward", slot)                     the slot's environment's get_reward(); value: a float or None

Failure kinds: exception (raised, or sys.exit), not_a_string (returned None or an object), oversized, unknown_tool,
bad_arguments, no_environment (the slot's instance was lost with a replaced worker), non_numeric (get_reward); the
training process adds timeout, died and malformed (finetune/train/grpo/tools.py, episodes.py).
"""

from __future__ import annotations

import math
import numbers
import os
import threading


def tool_worker_main(conn, specs: list, base_dir: str, parent_pid: int) -> None:
    """The worker's life: load the environment and tools, say ready, answer requests until told to stop."""
    from finetune.agent_tools import environment_methods, load_environment, load_tool
    from finetune.errors import RewardError
    from finetune.train.grpo.reward_worker import _watch_parent

    if hasattr(os, "setsid"):
        os.setsid()  # its own process group: one killpg() ends it and whatever a tool started
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    environment, tools = specs[0], specs[1:]
    try:
        functions = {getattr(f, "__name__", spec): f for spec, f in ((s, load_tool(s, base_dir)) for s in tools)}
        factory = load_environment(environment, base_dir) if environment else None
    except RewardError as err:
        conn.send(("load_failed", str(err)))
        return
    methods = set(environment_methods(factory)) if isinstance(factory, type) else set()
    state = {"factory": factory, "functions": functions, "methods": methods, "instances": {}}
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        conn.send(answer(state, request))


def answer(state: dict, request: tuple) -> tuple:
    op, slot = request[0], request[1]
    try:
        if op == "reset":
            return _reset(state, slot, request[2])
        if op == "call":
            return _call(state, slot, *request[2:])
        if op == "reward":
            return _reward(state, slot)
    except (Exception, SystemExit) as err:  # the user's code: anything may come out, an exit included
        from finetune.reward_functions import describe_error

        return ("failed", "exception", describe_error(err), str(err))
    return _failed("exception", f"unknown request {op!r}")


def _failed(kind: str, message: str) -> tuple:
    return ("failed", kind, message, message)


def _quiet(func, **kwargs):
    """Call (an `async def` run to completion, as TRL runs async tools) with stdout / stderr caught: a tool that
    prints a page does not flood the run's log."""
    from finetune.reward_functions import call_reward
    from finetune.train.grpo.reward_worker import captured_output

    with captured_output():
        return call_reward(func, kwargs)


def _reset(state: dict, slot: int, row: dict) -> tuple:
    if state["factory"] is None:
        return ("ok", None)
    instance = state["instances"].get(slot)
    if instance is None:
        instance = state["instances"][slot] = _quiet(state["factory"])
    observation = _quiet(instance.reset, **row)
    if observation is not None and not isinstance(observation, str):
        return _failed("not_a_string", f"reset() returned a {type(observation).__name__}; it returns a string (added "
                       "to the prompt's last message) or None")
    return ("ok", observation)


def _call(state: dict, slot: int, name: str, arguments, cap: int) -> tuple:
    from finetune.agent_tools import tool_content

    if name in state["methods"]:
        instance = state["instances"].get(slot)
        if instance is None:
            return _failed("no_environment", "this rollout's environment was lost when its worker was replaced")
        func = getattr(instance, name)
    elif name in state["functions"]:
        func = state["functions"][name]
    else:
        known = sorted(state["methods"] | set(state["functions"]))
        return ("failed", "unknown_tool", f"Tool {name} not found (the tools: {', '.join(known)})",
                f"Tool {name} not found.")  # what TRL 1.16 answers
    if not isinstance(arguments, dict):
        return _failed("bad_arguments", f"the arguments of {name} are a {type(arguments).__name__}, not an object")
    content, problem = tool_content(_quiet(func, **arguments))
    if problem:
        return _failed("not_a_string", f"{name} {problem}")
    if len(content) > cap:
        return _failed("oversized", f"{name} returned {len(content):,} characters, over the {cap:,} a result may have")
    return ("ok", content)


def _reward(state: dict, slot: int) -> tuple:
    instance = state["instances"].get(slot)
    if instance is None:
        return _failed("no_environment", "this rollout's environment was lost when its worker was replaced")
    value = _quiet(instance.get_reward)
    if value is None:
        return ("ok", math.nan)
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        value = value.item()
    if not isinstance(value, numbers.Real) or math.isinf(float(value)):
        return _failed("non_numeric", f"get_reward() returned {value!r}, not a finite number")
    return ("ok", float(value))
