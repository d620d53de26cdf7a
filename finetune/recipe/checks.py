"""Checks load_recipe makes of what the recipe points at outside itself, before anything starts: where it
may write (output_dir and the caches), the checkpoint `resume:` names, and the DeepSpeed JSON `deepspeed:`
names, read and compared with the recipe.

The shipped DeepSpeed configs (finetune/deepspeed_configs/*.json) say `"auto"` wherever the HF Trainer knows
the value (batch sizes, accumulation, clipping, learning rate, precision), so the recipe stays the one place
those live. A user's own JSON may hard-code them; a hard-coded value that disagrees with the recipe is
refused here, because DeepSpeed would otherwise silently train with a different batch or learning rate.

Pure: json, os and pathlib only (the recipe imports nothing heavy). It sits beside recipe_load, below every
stage; finetune.train.checkpoints and finetune.train.deepspeed_config import from here.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from finetune.recipe.adapter import mutates_base, uses_eva
from finetune.run_folder import MARKER, foreign_entries, read_marker


# --- where a recipe may write, and what it resumes from ------------------------------------------------


def resume_problem(resume, base: Path | None = None) -> str | None:
    """A recipe-time check of an explicit `resume: PATH` (auto and false need nothing)."""
    if resume in ("auto", False) or not isinstance(resume, str):
        return None
    folder = Path(resume)
    if not folder.is_dir():
        return f"`resume`: no checkpoint folder at `{resume}`; use `auto`, `false` or an existing checkpoint"
    if read_marker(folder) is None:
        return (f"`resume`: `{resume}` is not a complete checkpoint (no {MARKER} marker, or a file is missing or "
                "truncated); pick another one from output_dir/checkpoints or output_dir/exports")
    return None


def output_dir_problem(folder: Path, overwrite: bool) -> str | None:
    """Refuse an output_dir holding someone else's files (finetune/run_folder.py says whose): a run would replace
    README.md (peft's model card), run.json, tokenizer and model files. None when the folder may be used."""
    if folder.exists() and not folder.is_dir():
        return f"`output_dir` `{folder}` is a file, not a folder; point it at a new folder, e.g. outputs/run1"
    foreign = [] if overwrite else foreign_entries(folder)
    if not foreign:
        return None
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return (f"`output_dir` `{folder}` already holds files finetune did not write ({shown}); a run would replace "
            "some of them (README.md, run.json, tokenizer and model files). Use a new folder (e.g. "
            "`--set output_dir=outputs/run2`), or set `overwrite_output_dir: true` to write there anyway")


def _is_ancestor_or_same(a: Path, b: Path) -> bool:
    return a == b or a in b.parents


def location_problems(recipe, recipe_dir: Path) -> list[str]:
    """Refuse write locations whose contents the toolkit could clobber or mix with a run's files.

    output_dir may not be the filesystem root, the home folder or one of its ancestors, the recipe's own
    folder or one of its ancestors (checkpoints and the final model would land beside the user's files), nor
    hold or equal the cache, nor hold files finetune did not write (output_dir_problem). cache_dir /
    dataset_prepared_path may not be the root or the home folder.
    """
    home = Path(os.path.expanduser("~")).resolve()
    out = Path(recipe.output_dir).resolve()
    problems = []
    if out == Path(out.anchor):
        problems.append(f"`output_dir` is the filesystem root `{out}`; use a folder of its own, e.g. outputs/run1")
    elif _is_ancestor_or_same(out, home):
        problems.append(f"`output_dir` `{out}` is the home folder (or above it); use a folder of its own")
    elif _is_ancestor_or_same(out, recipe_dir.resolve()):
        problems.append(
            f"`output_dir` `{out}` is the recipe's own folder (or above it): the run's files would mix with yours; "
            "use a subfolder such as outputs/"
        )
    elif _is_ancestor_or_same(out, Path(recipe.cache_dir).resolve()):
        problems.append(f"`output_dir` `{out}` holds the cache `{recipe.cache_dir}`; keep them apart")
    else:
        problem = output_dir_problem(out, recipe.overwrite_output_dir)
        if problem:
            problems.append(problem)
    for key in ("cache_dir", "dataset_prepared_path"):
        value = getattr(recipe, key)
        if value and Path(value).resolve() in (Path(Path(value).resolve().anchor), home):
            problems.append(f"`{key}` `{value}` is the filesystem root or the home folder; use a folder of its own")
    problem = resume_problem(recipe.resume)
    if problem:
        problems.append(problem)
    return problems


# --- eval: (finetune/evaluation) ----------------------------------------------------------------------

LM_EVAL_INSTALL = "pip install 'finetune[eval]'  (or: pip install 'lm-eval>=0.4.8,<0.5')"


def lm_eval_missing() -> bool:
    """lm-evaluation-harness is an optional extra; asked without importing it (it pulls in torch)."""
    import importlib.util

    return importlib.util.find_spec("lm_eval") is None


def eval_problems(recipe) -> list[str]:
    """The `eval:` section: files that must exist, and lm-eval installed when tasks are asked (their names:
    finetune/train/preflight.py)."""
    spec = recipe.eval
    if spec is None:
        return []
    problems = []
    if spec.data and not Path(spec.data).is_file():
        problems.append(f"`eval.data`: no records file at `{spec.data}`; check the path, or remove the key to use "
                        "the eval split")
    if spec.tasks_dir and not Path(spec.tasks_dir).is_dir():
        problems.append(f"`eval.tasks_dir`: no folder at `{spec.tasks_dir}`; point it at a folder of lm-eval task "
                        "YAML files (docs/evaluation.md)")
    if spec.gguf and not Path(spec.gguf).is_file():
        problems.append(f"`eval.gguf`: no file at `{spec.gguf}`; export one first (`finetune export RECIPE --gguf`)")
    if (spec.tasks or spec.tasks_dir) and lm_eval_missing():
        problems.append(f"`eval.tasks` asks for lm-eval benchmarks, but lm-evaluation-harness is not installed: "
                        f"{LM_EVAL_INSTALL}; or remove `eval.tasks` / `eval.tasks_dir`")
    # the task names are looked up once, where validate and the training's main process check the machine
    # (finetune/train/preflight.py): lm-eval's loader imports lm_eval and datasets, ~0.9 s of every process
    return problems


# --- the DeepSpeed JSON ---------------------------------------------------------------------------


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


def _lora_variant_problems(config: dict, recipe, stage: int) -> list[str]:
    """LoRA+ needs the Trainer to build the optimizer; PiSSA / OLoRA need each whole weight at init."""
    problems = []
    optimizer = config.get("optimizer")
    if recipe.adapter != "none" and recipe.loraplus_lr_ratio is not None and isinstance(optimizer, dict):
        problems.append(f"`loraplus_lr_ratio` gives the B matrices their own learning rate, but the `deepspeed` config "
                        f"brings its own optimizer ({optimizer.get('type')}), which DeepSpeed builds with one learning "
                        "rate for every weight; use a config without an `optimizer` block (zero2, zero3), or drop "
                        "LoRA+")
    if stage == 3 and (mutates_base(recipe) or uses_eva(recipe)):
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` initialises the adapters from "
                        "whole weights or a forward pass before training, but ZeRO-3 holds weights in shards across "
                        "processes until the engine starts; use `deepspeed: zero2`, or the default init")
    return problems


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
    problems += _lora_variant_problems(config, recipe, stage)
    if stage == 3 and (recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit):
        problems.append(
            "ZeRO-3 shards every weight across processes, but a bitsandbytes 4/8-bit base keeps its weights "
            "packed in uint8 with per-block scales that ZeRO-3 cannot partition and gather back (it needs a "
            "matching quant_storage dtype that finetune does not set). With QLoRA the frozen base is already "
            "~4x smaller and only the adapter trains: use `deepspeed: zero2` (or zero2_offload), or `adapter: "
            "lora` with zero3"
        )
    return problems
