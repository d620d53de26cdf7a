"""What this machine lacks to train a recipe: every problem at once, before any process starts or model loads.

A recipe can be valid and still not train here: `fsdp` on a machine without CUDA, `flash_attention_2` without a GPU
or the flash-attn package, a base model that is a hub id while the hub cannot be reached and the local HF cache has
no copy, an lm-eval task name found nowhere. Each of these stops a run when it gets there (after 53 s of the hub's
retries, for the hub); asked here, they are one message.

Asked once per run: by `finetune validate` (`--recipe-only` skips it) and by `finetune train` in the process the
user started (alone, or the launcher before its workers start; under a bare `accelerate launch`, rank 0). A worker
finetune's launcher started does not ask again (launch.MACHINE_CHECKED is set for it), and load_recipe never asks: lm-eval's
task lookup imports lm_eval and datasets (~0.9 s), and the hub probe is a network round trip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import FinetuneError, MachineError

PROBE_TIMEOUT_S = 5.0  # one request to the hub's endpoint, no retries: an answer (any status) means reachable


@dataclass(frozen=True)
class Hub:
    """Whether the Hugging Face hub can be asked now, and if not, why (HF_HUB_OFFLINE, or the probe's error)."""

    reachable: bool
    why: str = ""
    probed: bool = False  # False: HF_HUB_OFFLINE said so and nothing was sent


def _refusal(check, *args) -> list[str]:
    """The refusal a check would raise, as a problem line (none when it passes)."""
    try:
        check(*args)
    except FinetuneError as exc:
        return [str(exc)]
    return []


def _offline_set() -> bool:
    truthy = ("1", "true", "yes", "on")
    return any(os.environ.get(name, "").lower() in truthy
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_state() -> Hub:
    """HF_HUB_OFFLINE, else one request to the hub's endpoint (through the proxies huggingface_hub uses)."""
    if _offline_set():
        return Hub(False, "HF_HUB_OFFLINE is set")
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # DNS, refused, timed out, a proxy's error: the run's downloads would meet the same
        first = " ".join(str(exc).split()) or type(exc).__name__
        return Hub(False, f"the hub ({constants.ENDPOINT}) cannot be reached from this machine ({first})", True)
    return Hub(True, probed=True)


def hub_ids(recipe) -> list[tuple[str, str, str]]:
    """(recipe key, hub id, "model" | "dataset") for each thing the run would fetch from the hub."""
    from finetune.model.loader import adapter_base, adapter_folder, package_resource
    from finetune.recipe.data import RECORD_TYPES, looks_like_hub_id

    found = []
    for key in ("base_model", "tokenizer_config"):
        name = getattr(recipe, key)
        adapter = adapter_folder(name) if name else None
        name = adapter_base(adapter) if adapter is not None else name
        if name and not Path(name).expanduser().exists() and package_resource(name) is None \
                and looks_like_hub_id(name) and not name.endswith(".gguf"):
            found.append((key, name, "model"))
    for i, spec in enumerate(recipe.datasets):
        if spec.type in RECORD_TYPES and looks_like_hub_id(spec.path) and not Path(spec.path).exists():
            found.append((f"datasets[{i}].path", spec.path, "dataset"))
    return found


def _cached(repo_id: str, key: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    filename = "tokenizer_config.json" if key == "tokenizer_config" else "config.json"
    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def hub_problems(recipe, hub: Hub) -> list[str]:
    """A hub id the run cannot get: a dataset (its revision is asked of the hub on every run), or a model with no
    copy in the local HF cache."""
    if hub.reachable:
        return []
    from finetune.ingest.from_dataset import offline_message

    problems = []
    for key, name, kind in hub_ids(recipe):
        if kind == "dataset":
            spec = recipe.datasets[int(key.split("[")[1].split("]")[0])]
            problems.append(f"`{key}`: {offline_message(spec, hub.why)}")
        elif not _cached(name, key):
            problems.append(f"`{key}`: `{name}` is a hub id, the local HF cache has no copy, and {hub.why}: download "
                            f"it where the hub is reachable (`hf download {name}`, which fills the cache this machine "
                            f"reads, or `--local-dir` and point `{key}` at the folder)")
    return problems


def _device_problems(recipe, device) -> list[str]:
    """The refusals the run makes on its device (settings.resolve), found before any process starts."""
    from finetune.model.attention import attention_problems
    from finetune.train.fsdp_config import check_fsdp_device

    needs = recipe.fsdp is not None or recipe.attn_implementation in ("flash_attention_2", "flex_attention")
    if not needs:
        return []
    if device is None:  # torch is imported only for a recipe whose refusals depend on the device
        from finetune.model.device import training_device

        device = training_device()
    return _refusal(check_fsdp_device, recipe, device.cuda) + attention_problems(recipe, device)


def eval_task_problems(recipe) -> list[str]:
    """Each `eval.tasks` name among finetune's tasks or `eval.tasks_dir`'s (lm-eval installed: load_recipe says so
    when it is not)."""
    from finetune.recipe.checks import lm_eval_missing

    spec = recipe.eval
    if spec is None or not (spec.tasks or spec.tasks_dir) or lm_eval_missing():
        return []
    if spec.tasks_dir and not Path(spec.tasks_dir).is_dir():
        return []  # load_recipe names the missing folder
    from finetune.lm_eval_tasks import task_problem

    problem = task_problem(spec.tasks, spec.tasks_dir)
    return [f"`eval.tasks`: {problem}"] if problem else []


def machine_problems(recipe, device=None, hub: Hub | None = None) -> tuple[list[str], Hub | None]:
    """(every problem this machine has with the recipe, the hub's state when the recipe needs the hub)."""
    from finetune.train.launch import check_deepspeed_installed

    problems = _refusal(check_deepspeed_installed, recipe) + _device_problems(recipe, device)
    if hub is None and hub_ids(recipe):
        hub = hub_state()
    problems += hub_problems(recipe, hub) if hub is not None else []
    return problems + eval_task_problems(recipe), hub


def check_machine(recipe, source: str, hint: str = "") -> Hub | None:
    """Raise MachineError with every problem; else the hub's state (None: the recipe needs no hub)."""
    problems, hub = machine_problems(recipe)
    if problems:
        raise MachineError(problems, source, hint)
    return hub
