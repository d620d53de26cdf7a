"""The recipe's `deepspeed:` key: find the JSON (a shipped config by name, or a path), read it, and check
it against the recipe before anything starts.

The shipped configs (finetune/deepspeed_configs/*.json) say `"auto"` wherever the HF Trainer knows the
value (batch sizes, accumulation, clipping, learning rate, precision), so the recipe stays the one place
those live. A user's own JSON may hard-code them; a hard-coded value that disagrees with the recipe is
refused here, because DeepSpeed would otherwise silently train with a different batch or learning rate.

Pure: json and pathlib only (the recipe imports nothing heavy).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

SHIPPED = ("zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")


def shipped_path(name: str) -> Path:
    return Path(str(resources.files("finetune") / "deepspeed_configs" / f"{name}.json"))


def resolve_deepspeed(value: str, base_dir: Path) -> str:
    """A shipped config's name (`zero2`, `zero3_offload`, ...) or a path relative to the recipe's folder."""
    if value in SHIPPED:
        return str(shipped_path(value))
    expanded = os.path.expanduser(value)
    return str(Path(expanded) if os.path.isabs(expanded) else (base_dir / expanded).resolve())


def read_deepspeed_config(path: str) -> tuple[dict | None, str | None]:
    """(config, None) or (None, the problem): a missing, unreadable or malformed JSON file."""
    names = ", ".join(SHIPPED)
    if not os.path.isfile(path):
        return None, f"`deepspeed`: no file at `{path}`; give a path to a DeepSpeed JSON or one of: {names}"
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"`deepspeed`: cannot read `{path}` ({exc.__class__.__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return None, f"`deepspeed`: `{path}` is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    if not isinstance(config, dict):
        return None, f"`deepspeed`: `{path}` must hold a JSON object, not a {type(config).__name__}"
    return config, None


def zero_stage(config: dict) -> int:
    section = config.get("zero_optimization") or {}
    return section.get("stage", 0) if isinstance(section, dict) else 0


def _fixed(value) -> bool:
    """A value the user wrote into the JSON (not "auto", not absent)."""
    return value is not None and value != "auto"


def _disagree(where: str, value, recipe_key: str, recipe_value) -> str:
    return (f"`deepspeed` config sets {where} = {value!r} but the recipe's `{recipe_key}` is {recipe_value!r}; "
            f'write "auto" in the JSON so the recipe decides, or make them agree')


def _batch_problems(config: dict, recipe, world_size: int) -> list[str]:
    problems = []
    # e.g. 4 examples per micro batch x 2 accumulation x 2 processes = 16 examples per optimizer step
    global_batch = recipe.micro_batch_size * recipe.gradient_accumulation_steps * world_size
    for key, recipe_key, expected in (
        ("train_micro_batch_size_per_gpu", "micro_batch_size", recipe.micro_batch_size),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", recipe.gradient_accumulation_steps),
        ("gradient_clipping", "max_grad_norm", recipe.max_grad_norm),
    ):
        if _fixed(config.get(key)) and config[key] != expected:
            problems.append(_disagree(key, config[key], recipe_key, expected))
    if _fixed(config.get("train_batch_size")) and config["train_batch_size"] != global_batch:
        problems.append(
            f"`deepspeed` config sets train_batch_size = {config['train_batch_size']!r} but the recipe makes "
            f"{global_batch} (micro_batch_size {recipe.micro_batch_size} x gradient_accumulation_steps "
            f"{recipe.gradient_accumulation_steps} x {world_size} process(es)); write \"auto\" in the JSON"
        )
    return problems


def _optimizer_problems(config: dict, recipe, explicit: set[str]) -> list[str]:
    problems = []
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict):
        params = optimizer.get("params") or {}
        recipe_values = {"lr": ("learning_rate", recipe.learning_rate),
                         "betas": ("adam_beta1/adam_beta2", [recipe.adam_beta1, recipe.adam_beta2]),
                         "eps": ("adam_epsilon", recipe.adam_epsilon),
                         "weight_decay": ("weight_decay", recipe.weight_decay)}
        for key, (recipe_key, expected) in recipe_values.items():
            value = params.get(key)
            if key == "lr" and _fixed(value):
                # refused even when equal: it would be a second place the learning rate lives
                problems.append(f"`deepspeed` config hard-codes optimizer.params.lr = {value!r}; the learning rate "
                                f"lives in the recipe (`learning_rate: {expected}`): write \"auto\" in the JSON")
            elif _fixed(value) and value != expected:
                problems.append(_disagree(f"optimizer.params.{key}", value, recipe_key, expected))
        if "optimizer" in explicit and not recipe.optimizer.startswith("adamw_torch"):
            problems.append(
                f"`deepspeed` config brings its own optimizer ({optimizer.get('type')}), which replaces the "
                f"recipe's `optimizer: {recipe.optimizer}`; drop one of them"
            )
    scheduler = config.get("scheduler")
    if isinstance(scheduler, dict):
        for key, value in (scheduler.get("params") or {}).items():
            if _fixed(value) and key in ("warmup_max_lr", "warmup_min_lr", "warmup_num_steps", "total_num_steps"):
                problems.append(
                    f"`deepspeed` config hard-codes scheduler.params.{key} = {value!r}; the recipe's "
                    f"learning_rate / warmup / max_steps decide it: write \"auto\""
                )
    return problems


def _precision_problems(config: dict, recipe) -> list[str]:
    enabled = {name: (config.get(name) or {}).get("enabled") for name in ("bf16", "fp16")
               if isinstance(config.get(name), dict)}
    on = [name for name, value in enabled.items() if value is True]
    if len(on) == 2:
        return ["`deepspeed` config enables both bf16 and fp16; set both to \"auto\" and choose `precision:`"]
    if on and recipe.precision != on[0]:
        return [f"`deepspeed` config sets {on[0]}.enabled = true but the recipe's `precision` is "
                f"`{recipe.precision}`; write \"auto\" in the JSON and set `precision: {on[0]}` in the recipe"]
    off = [name for name, value in enabled.items() if value is False and recipe.precision == name]
    if off:
        return [f"`deepspeed` config sets {off[0]}.enabled = false but the recipe asks for `precision: {off[0]}`; "
                f'write "auto" in the JSON']
    return []


def deepspeed_problems(recipe, explicit: set[str], world_size: int) -> list[str]:
    """Everything wrong with the recipe's DeepSpeed config, as messages; [] when it is usable."""
    if recipe.deepspeed is None:
        return []
    config, problem = read_deepspeed_config(recipe.deepspeed)
    if problem:
        return [problem]
    stage = zero_stage(config)
    if stage not in (0, 1, 2, 3):
        return [f"`deepspeed` config: zero_optimization.stage is {stage!r}; use 0, 1, 2 or 3"]
    problems = [*_batch_problems(config, recipe, world_size), *_optimizer_problems(config, recipe, explicit),
                *_precision_problems(config, recipe)]
    if stage == 3 and (recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit):
        problems.append(
            "ZeRO-3 shards every weight across processes, but a bitsandbytes 4/8-bit base keeps its weights "
            "packed in uint8 with per-block scales that ZeRO-3 cannot partition and gather back (it needs a "
            "matching quant_storage dtype that finetune does not set). With QLoRA the frozen base is already "
            "~4x smaller and only the adapter trains: use `deepspeed: zero2` (or zero2_offload), or `adapter: "
            "lora` with zero3"
        )
    return problems


def trainer_deepspeed_config(path: str) -> dict:
    """The config handed to TrainingArguments(deepspeed=...).

    An "auto" train_batch_size is left out for DeepSpeed to derive (micro batch x accumulation x processes):
    transformers 5 fills "auto" values before its process group exists, so it would count one process and
    DeepSpeed would then refuse the batch sizes on any run with several.
    """
    config, problem = read_deepspeed_config(path)
    if problem:  # the recipe was checked when loaded; this is a file changed since
        from finetune.errors import RecipeError

        raise RecipeError([problem], path)
    if config.get("train_batch_size") == "auto":
        del config["train_batch_size"]
    return config


def fill_resolved_learning_rate(args, path: str) -> None:
    """Put the learning rate run_training resolved (`learning_rate: auto` needs the data counted) where the
    JSON says "auto": TrainingArguments filled those earlier, with the placeholder it was built with."""
    hf_config = getattr(args, "hf_deepspeed_config", None)
    original, _ = read_deepspeed_config(path)
    if hf_config is None or original is None:
        return
    for section, key in (("optimizer", "lr"), ("scheduler", "warmup_max_lr")):
        if ((original.get(section) or {}).get("params") or {}).get(key) == "auto":
            hf_config.config[section]["params"][key] = args.learning_rate


def weights_partitioned() -> bool:
    """True under ZeRO-3 (transformers loaded each rank's shard only): a forward pass must wait for the
    DeepSpeed engine, which gathers the weights layer by layer."""
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:
        return False
    return is_deepspeed_zero3_enabled()
