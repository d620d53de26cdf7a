"""load_recipe(): YAML -> Recipe, reporting EVERY problem at once with the key's path, its line in the
file, the bad value and the fix. Also command-line overrides (`--set key.path=value`)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from finetune.errors import RecipeError
from finetune.recipe.axolotl import hints as axolotl
from finetune.recipe.adapter import adapter_problems
from finetune.recipe.schema import Recipe
from finetune.recipe.data import DatasetSpec
from finetune.recipe.evaluation import EvalSpec
from finetune.recipe.checks import deepspeed_problems, eval_problems, location_problems, resolve_deepspeed
from finetune.recipe.data import RECORD_TYPES, looks_like_hub_id
from finetune.recipe.distributed import fsdp_problems
from finetune.recipe.grpo import grpo_problems
from finetune.recipe.methods import method_problems

# Keys whose values are filesystem paths, resolved relative to the recipe file's folder.
PATH_KEYS = ("output_dir", "dataset_prepared_path", "cache_dir")


def _line_map(text: str) -> tuple[dict[tuple, int], list[str]]:
    """Map each key path in the YAML document to its 1-based line number; also a problem for each key that a
    mapping sets twice (YAML keeps the last value without a word)."""
    lines: dict[tuple, int] = {}
    twice: list[str] = []

    def walk(node: yaml.Node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = (*path, key_node.value)
                line = key_node.start_mark.line + 1
                if key in lines:
                    twice.append(f"`{format_path(key)}` is set twice (lines {lines[key]} and {line}); YAML keeps "
                                 "only the last value: delete one")
                lines[key] = line
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                walk(item, (*path, i))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines, twice
    if root is not None:
        walk(root, ())
    return lines, twice


def format_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at `loc` (for did-you-mean suggestions)."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        if model is Recipe and part == "datasets":
            model = DatasetSpec
        elif model is Recipe and part == "eval":
            model = EvalSpec
        else:
            return None
    return model


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-branch names (`list[str]`, `literal['all-linear']`) from an error location."""
    return tuple(p for p in loc if not (isinstance(p, str) and "[" in p))


def _describe(err: dict, lines: dict[tuple, int | str]) -> str:
    loc = _clean_loc(err["loc"])
    where = format_path(loc)
    line = _line_of(lines, loc)
    at = f" (line {line})" if isinstance(line, int) else f" ({line})" if line else ""
    kind = err["type"]
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        key = str(loc[-1])
        hint = ""
        ported = axolotl.key_hint(loc)  # an axolotl key gets its mapping, not a fuzzy did-you-mean
        if ported:
            return f"`{where}`{at}: {ported}"
        if owner is not None:
            for name, field in owner.model_fields.items():  # e.g. save_total_limit next to max_checkpoints
                if key in getattr(field.validation_alias, "choices", ()):
                    return f"`{where}`{at}: `{key}` is another name for `{name}`, which is also set; keep one"
            close = difflib.get_close_matches(key, list(owner.model_fields), n=1, cutoff=0.6)
            hint = f"; did you mean `{close[0]}`?" if close else "; run `finetune schema` for the valid keys"
        return f"`{where}`{at}: unknown key{hint}"
    if kind == "missing":
        return f"`{where}`: required key is missing"
    value = err.get("input")
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    ported = axolotl.value_hint(loc, value)
    return f"`{where}`{at}: got {shown}; {err['msg'].lower()}" + (f"; {ported}" if ported else "")


def _dedupe_union_errors(errors: list[dict]) -> list[dict]:
    """A Union field reports one error per branch: merge them into one error per location."""
    merged: dict[tuple, dict] = {}
    for err in errors:
        loc = _clean_loc(err["loc"])
        if loc in merged:
            first = merged[loc]
            first["msg"] = f"{first['msg']}, or {err['msg'][0].lower()}{err['msg'][1:]}"
        else:
            merged[loc] = dict(err)
    return list(merged.values())


def apply_override(data: dict, assignment: str) -> tuple:
    """Apply one `key.path=value` override; the value is parsed as YAML (`--set lora_r=16`). Returns the key's
    path."""
    if "=" not in assignment:
        raise RecipeError([f"override `{assignment}`: expected KEY=VALUE, e.g. learning_rate=1e-4"], "command line")
    key, raw = assignment.split("=", 1)
    value = yaml.safe_load(raw) if raw != "" else None
    parts: list[Any] = [int(p) if p.isdigit() else p for p in key.strip().split(".")]
    target: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        try:
            target = target[part]
        except (KeyError, IndexError, TypeError):
            if isinstance(target, dict):
                target[part] = [] if isinstance(nxt, int) else {}
                target = target[part]
            else:
                raise RecipeError([f"override `{key}`: `{format_path(tuple(parts[: i + 1]))}` does not exist"],
                                  "command line") from None
    last = parts[-1]
    if isinstance(target, list) and isinstance(last, int):
        if last >= len(target):
            raise RecipeError([f"override `{key}`: index {last} is past the end of the list"], "command line")
        target[last] = value
    elif isinstance(target, dict):
        target[last] = value
    else:
        raise RecipeError([f"override `{key}`: cannot set a key inside a {type(target).__name__}"], "command line")
    return tuple(parts)


def _mark_overrides(lines: dict, overridden: list[tuple[tuple, str]]) -> None:
    """A key an override set, and every key under it, is no longer at its YAML line: its problems name the
    `--set` instead."""
    for path, assignment in overridden:
        for loc in [loc for loc in lines if loc[:len(path)] == path]:
            del lines[loc]
        lines[path] = f"--set {assignment}"


def _line_of(lines: dict, loc: tuple) -> int | str | None:
    """The key's YAML line, or the `--set` that gave it (or a mapping or list above it) its value."""
    if loc in lines:
        return lines[loc]
    return next((lines[loc[:n]] for n in range(len(loc) - 1, 0, -1) if isinstance(lines.get(loc[:n]), str)), None)


def _resolve(value: str, base: Path) -> str:
    if "://" in value:  # a database URL, not a path
        return value
    expanded = os.path.expanduser(value)
    return str(Path(expanded) if os.path.isabs(expanded) else (base / expanded).resolve())


def _resolve_paths(recipe: Recipe, base: Path) -> None:
    """Make every path absolute, defaults included, relative to the recipe's folder."""
    for key in PATH_KEYS:
        if isinstance(getattr(recipe, key), str):
            setattr(recipe, key, _resolve(getattr(recipe, key), base))
    for ds in recipe.datasets:
        resolved = _resolve(ds.path, base)
        # a hub dataset id (`tatsu-lab/alpaca`) stays one unless a file or folder of that name is there
        if os.path.exists(resolved) or not (ds.type in RECORD_TYPES and looks_like_hub_id(ds.path)):
            ds.path = resolved
        if getattr(ds, "slop_file", None):
            ds.slop_file = _resolve(ds.slop_file, base)
    if recipe.deepspeed is not None:
        recipe.deepspeed = resolve_deepspeed(recipe.deepspeed, base)
    if isinstance(recipe.resume, str) and recipe.resume != "auto":
        recipe.resume = _resolve(recipe.resume, base)
    for entry in recipe.rewards:  # FILE.py:NAME relative to the recipe; package.module:NAME stays as it is
        if entry.model is not None:  # a reward model's folder, relative to the recipe
            entry.model = _resolve(entry.model, base)
            continue
        target, sep, name = entry.function.rpartition(":")
        if sep and (target.endswith(".py") or "/" in target):
            entry.function = f"{_resolve(target, base)}:{name}"
    if recipe.eval is not None:
        for key in ("data", "tasks_dir", "gguf"):
            if getattr(recipe.eval, key):
                setattr(recipe.eval, key, _resolve(getattr(recipe.eval, key), base))


def _resolve_model_paths(data: dict, base: Path) -> None:
    # base_model / tokenizer_config: only when they name something that exists next to the recipe;
    # otherwise they are hub ids or package resources, resolved by the model builder.
    for key in ("base_model", "tokenizer_config"):
        value = data.get(key)
        if isinstance(value, str) and (value.startswith((".", "~", "/")) or (base / value).exists()):
            data[key] = _resolve(value, base)


def cross_checks(recipe: Recipe, explicit: set[str], world_size: int) -> list[str]:
    """Problems between fields. `explicit` is the set of keys the user wrote."""
    problems = []
    if recipe.warmup_steps is not None and recipe.warmup_ratio is not None:
        problems.append("`warmup_steps` and `warmup_ratio` are both set; keep one")
    if recipe.load_in_4bit and recipe.load_in_8bit:
        problems.append("`load_in_4bit` and `load_in_8bit` are both true; pick one")
    if (recipe.load_in_4bit or recipe.load_in_8bit) and recipe.adapter == "none":
        problems.append(
            "a quantized base (`load_in_4bit`/`load_in_8bit`) cannot be fully fine-tuned; "
            "set `adapter: lora` (or `adapter: qlora`)"
        )
    if recipe.adapter == "qlora" and recipe.load_in_8bit:
        problems.append("`adapter: qlora` uses a 4-bit base; drop `load_in_8bit` (or use `adapter: lora`)")
    if recipe.chat_template == "jinja" and not recipe.chat_template_jinja:
        problems.append("`chat_template: jinja` needs the template in `chat_template_jinja`")
    if recipe.chat_template_jinja and recipe.chat_template != "jinja":
        problems.append("`chat_template_jinja` is set but `chat_template` is not `jinja`; set `chat_template: jinja`")
    if recipe.cosine_min_lr_ratio is not None and recipe.lr_scheduler != "cosine":
        problems.append("`cosine_min_lr_ratio` only applies to `lr_scheduler: cosine`")
    if recipe.val_set_size >= 1 and recipe.val_set_size != int(recipe.val_set_size):
        problems.append(f"`val_set_size`: {recipe.val_set_size} is neither a fraction (< 1) nor a whole count")
    if recipe.global_batch_size is not None:
        per_step = recipe.micro_batch_size * world_size
        if "gradient_accumulation_steps" not in explicit:
            if recipe.global_batch_size % per_step:
                problems.append(
                    f"`global_batch_size` {recipe.global_batch_size} is not a multiple of micro_batch_size "
                    f"{recipe.micro_batch_size} x {world_size} process(es) = {per_step}"
                )
            else:
                recipe.gradient_accumulation_steps = recipe.global_batch_size // per_step
        elif per_step * recipe.gradient_accumulation_steps != recipe.global_batch_size:
            problems.append(
                f"`global_batch_size` {recipe.global_batch_size} != micro_batch_size {recipe.micro_batch_size} x "
                f"gradient_accumulation_steps {recipe.gradient_accumulation_steps} x {world_size} process(es) = "
                f"{per_step * recipe.gradient_accumulation_steps}; drop one of them or make them agree"
            )
    if recipe.group_by_length and recipe.sample_packing:
        problems.append("`group_by_length` has nothing to group once `sample_packing` fills every row; drop one")
    if recipe.method != "sft":
        for key in ("lr_base", "lr_pretrained_batch_tokens"):
            if getattr(recipe, key) is not None:
                problems.append(f"`{key}` feeds the SFT learning-rate formula, which `method: {recipe.method}` "
                                "does not use (its `learning_rate: auto` is the method's published default: `finetune lr "
                                "recipe.yml` shows it); remove it")
    problems += method_problems(recipe)
    problems += adapter_problems(recipe, explicit)
    problems += grpo_problems(recipe, world_size)
    problems += deepspeed_problems(recipe, explicit, world_size)  # after accumulation is derived above
    problems += fsdp_problems(recipe)
    return problems


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def load_recipe(path: str | os.PathLike, overrides: list[str] = (), world_size: int | None = None) -> Recipe:
    """Read, validate and resolve a recipe. Raises RecipeError listing every problem."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise RecipeError([f"no recipe file at `{path}`; check the path"], source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([f"cannot read the recipe as UTF-8 text ({exc.__class__.__name__}: {exc})"], source)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError([f"not valid YAML{where}: {problem}"], source) from None
    if data is None:
        raise RecipeError(["the recipe is empty; start from examples/quickstart/recipe.yml"], source)
    if not isinstance(data, dict):
        raise RecipeError([f"the recipe must be a mapping of keys to values, not a {type(data).__name__}"], source)
    lines, twice = _line_map(text)
    if twice:
        raise RecipeError(twice, source)
    _mark_overrides(lines, [(apply_override(data, assignment), assignment) for assignment in overrides])
    return recipe_from_dict(data, base_dir=path.parent.resolve(), source=source, lines=lines, world_size=world_size)


def _order(line: int | str | None) -> int:
    return 10**9 if line is None else line if isinstance(line, int) else 0


def recipe_from_dict(data: dict, base_dir: Path, source: str = "recipe", lines: dict | None = None,
                     world_size: int | None = None) -> Recipe:
    data = dict(data)
    _resolve_model_paths(data, base_dir)
    explicit = set(data)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        errors = _dedupe_union_errors(exc.errors())
        # in file order: the first problem listed is the first one the user meets reading the recipe
        # (an override's problem first: the command line is read before the file)
        errors.sort(key=lambda e: _order(_line_of(lines or {}, _clean_loc(e["loc"]))))
        messages = axolotl.with_port_tip([_describe(e, lines or {}) for e in errors], source)
        raise RecipeError(messages, source) from None
    _resolve_paths(recipe, base_dir)
    problems = cross_checks(recipe, explicit, world_size or world_size_from_env())
    problems += location_problems(recipe, base_dir)
    problems += eval_problems(recipe)
    if problems:
        raise RecipeError(problems, source)
    return recipe


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
