"""GRPO reward functions: find one from its recipe spec, check it can take TRL's keyword call, call it.

A spec is `FILE.py:NAME` (a path, relative to the recipe's folder) or `package.module:NAME` (imported like
`import package.module`: installed, or on PYTHONPATH). The function has TRL GRPOTrainer's contract, so one
written for TRL works unchanged: it is called with keyword arguments only,

    NAME(prompts=[...], completions=[...], completion_ids=[[int, ...], ...], trainer_state=..., log_extra=...,
         log_metric=..., **every other column of the records as a list)

and returns one float per completion (None: does not apply). A function with `**kwargs` gets all of them; one
without gets only the ones it names (TRL would pass all and fail), so `def f(completions, answer)` works too.

A base module: pure Python, nothing heavy imported, nothing from finetune but its errors. The recipe validator
loads and checks with it in its own process; the GRPO run loads in reward worker processes
(finetune/train/grpo/rewards.py), never in the training process.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path

from finetune.errors import RewardError

# What TRL 1.16's GRPOTrainer._calculate_rewards passes besides the records' columns. It also passes
# `environments` (only with an environment_factory, which recipes do not have).
BATCH_ARGUMENTS = ("prompts", "completions", "completion_ids")
TRL_EXTRAS = ("trainer_state", "log_extra", "log_metric")
RESERVED = BATCH_ARGUMENTS + TRL_EXTRAS


def split_spec(spec: str) -> tuple[str, str]:
    """`rewards.py:correct` -> ("rewards.py", "correct"); `pkg.mod:f` -> ("pkg.mod", "f")."""
    target, sep, name = str(spec).rpartition(":")
    if not sep or not target.strip() or not name.strip():
        raise RewardError(f"reward `{spec}`: write `FILE.py:NAME` (a file relative to the recipe's folder) or "
                          "`package.module:NAME` (an importable module), e.g. `rewards.py:correct_answer`")
    return target.strip(), name.strip()


def reward_name(spec: str) -> str:
    """The function's name, as metrics and run.json show it: `rewards.py:correct` -> `correct`."""
    return split_spec(spec)[1]


def is_file_spec(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_reward(spec: str, base_dir) -> object:
    """The callable a spec names. Raises RewardError (what, where, how to fix) when it cannot be had."""
    target, name = split_spec(spec)
    if is_file_spec(target):
        path = Path(target).expanduser()
        path = path if path.is_absolute() else Path(base_dir) / path
        module, where = _import_file(path, spec), str(path)
    else:
        module, where = _import_module(target, name, spec, base_dir), f"module `{target}`"
    found = module
    for part in name.split("."):  # `Class.method` reaches an attribute of an attribute
        if not hasattr(found, part):
            raise RewardError(f"reward `{spec}`: {where} has no `{name}`; {_defined_here(module)}")
        found = getattr(found, part)
    if not callable(found):
        raise RewardError(f"reward `{spec}`: `{name}` in {where} is a {type(found).__name__}, not a function; name a "
                          f"function that takes completions and returns a list of floats. {_defined_here(module)}")
    return found


def _module_name(path: Path) -> str:
    # A name unique to the file, so two `rewards.py` in different folders are two modules, not one.
    return "_finetune_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]


def _import_file(path: Path, spec: str):
    if not path.is_file():
        raise RewardError(f"reward `{spec}`: the file {path} does not exist; a FILE is relative to the recipe's "
                          "folder (or absolute)")
    try:
        source = path.read_text(encoding="utf-8")
        code = compile(source, str(path), "exec")
    except SyntaxError as err:
        raise RewardError(f"reward `{spec}`: {path} line {err.lineno}: {err.msg} (a syntax error); fix the file "
                          f"(`python -m py_compile {path}` shows it too)") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RewardError(f"reward `{spec}`: {path} cannot be read as Python source: {err}") from None
    name = _module_name(path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    sys.modules[name] = module  # dataclasses, pickling and typing look their module up here
    # The file's folder leads sys.path while it runs, as with `python rewards.py`: `import helpers` finds the
    # helpers.py beside it.
    sys.path.insert(0, str(path.parent))
    try:
        exec(code, module.__dict__)  # noqa: S102 - running the user's reward file is the point
    except (Exception, SystemExit) as err:
        sys.modules.pop(name, None)
        raise RewardError(f"reward `{spec}`: importing {path} failed{_line_in(err, str(path))}: "
                          f"{_describe(err)}; fix the file, or install what it imports") from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def _import_module(target: str, name: str, spec: str, base_dir):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if not err.name or not (target == err.name or target.startswith(err.name + ".")):
            raise RewardError(f"reward `{spec}`: importing module `{target}` failed: {_describe(err)}; install it "
                              "in this environment") from None
        top = target.split(".")[0]
        beside = Path(base_dir) / top if base_dir is not None else None
        hint = (f" ({beside} is beside the recipe: write `{target.replace('.', '/')}.py:{name}`, or add "
                f"{Path(base_dir)} to PYTHONPATH)" if beside is not None and
                (beside.is_dir() or beside.with_suffix(".py").is_file()) else "")
        raise RewardError(f"reward `{spec}`: no module named `{err.name}`{hint}; install the package or put its "
                          f"folder on PYTHONPATH, or name a file: `path/to/file.py:{name}` (relative to the recipe's "
                          "folder)") from None
    except (Exception, SystemExit) as err:
        raise RewardError(f"reward `{spec}`: importing module `{target}` failed{_line_in(err)}: {_describe(err)}; "
                          "fix the module, or install what it imports") from None


def _defined_here(module) -> str:
    public = {n: v for n, v in vars(module).items()
              if callable(v) and not n.startswith("_") and not inspect.ismodule(v)}
    own = sorted(n for n, v in public.items() if getattr(v, "__module__", None) == module.__name__)
    # a package's __init__ re-exports what its modules define: list those when it defines nothing itself
    names = own or sorted(n for n, v in public.items() if not inspect.isclass(v))
    return f"it has: {', '.join(names)}" if names else "it has no public functions"


def _describe(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def describe_error(err: BaseException) -> str:
    """`ZeroDivisionError: division by zero at /x/rewards.py line 12`: what a call raised, and where."""
    return _describe(err) + _line_in(err)


def _line_in(err: BaseException, filename: str | None = None) -> str:
    """` at FILE line N`: the deepest frame in `filename` (or the deepest frame at all)."""
    frames = traceback.extract_tb(err.__traceback__)
    if filename is not None:
        frames = [f for f in frames if f.filename == filename]
    return f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""


def where(func) -> str:
    """`FILE line N` of a function, for messages; its repr when it has no source."""
    code = getattr(func, "__code__", None) or getattr(getattr(func, "__call__", None), "__code__", None)
    return f"{code.co_filename} line {code.co_firstlineno}" if code is not None else repr(func)


def accepted_names(func) -> set[str] | None:
    """The keyword arguments the function takes by name; None: it takes any (`**kwargs`, or no signature)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read, the call will tell
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                 inspect.Parameter.KEYWORD_ONLY)}


def check_reward(func, spec: str, columns=None) -> None:
    """Raise RewardError when the function cannot take the keyword call. `columns`: the records' column names
    (without `prompt`) when known; a required parameter must then be one of the call's names or a column."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    known = set(RESERVED) | set(columns or ())
    problems = [f"the records have a column `{c}`, a name the call passes itself; rename the column"
                for c in sorted(set(columns or ()) & set(RESERVED))]
    for p in signature.parameters.values():
        required = p.default is inspect.Parameter.empty
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and required:
            problems.append(f"`{p.name}` is positional-only (before `/`), but every argument is passed by keyword; "
                            "remove the `/`")
        elif (p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) and required
              and columns is not None and p.name not in known):
            close = difflib.get_close_matches(p.name, sorted(known), n=1, cutoff=0.8)  # `completion` for completions
            meant = f" (did you mean `{close[0]}`?)" if close else ""
            problems.append(f"`{p.name}`{meant} is required but is neither one of {', '.join(BATCH_ARGUMENTS)}, "
                            f"{', '.join(TRL_EXTRAS)} nor a column of the records "
                            f"({', '.join(sorted(columns)) or 'they have none besides prompt'}); give it a default, "
                            "or add the column to the records")
    names = accepted_names(func)
    if names is not None and not names and not problems:
        problems.append("it takes no keyword arguments; name the ones it reads, e.g. `def f(completions, **kwargs)`")
    if names and columns is not None and not names & known and not problems:
        problems.append(f"it reads none of the call's arguments ({', '.join(BATCH_ARGUMENTS)} or a column); name "
                        "the ones it reads, or add `**kwargs`")
    if problems:
        raise RewardError(f"reward `{spec}` ({where(func)}): its signature {signature} cannot take the keyword "
                          f"call: {'; '.join(problems)}")


def reward_kwargs(func, prompts, completions, completion_ids, columns: dict, extras: dict) -> dict:
    """The keyword arguments of one call: all of them for `**kwargs`, else the ones the function names."""
    everything = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                  **columns, **extras}
    names = accepted_names(func)
    return everything if names is None else {k: v for k, v in everything.items() if k in names}


def call_reward(func, kwargs: dict):
    """Call it; an `async def` reward function (TRL runs those on an event loop) is run to completion."""
    out = func(**kwargs)
    if inspect.isawaitable(out):
        import asyncio

        async def wait():
            return await out

        out = asyncio.run(wait())
    return out
