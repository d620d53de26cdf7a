"""axolotl's GRPO recipes (`rl: grpo` and its `trl:` block) -> finetune's `method: grpo` and its keys, each as axolotl
passes it to TRL's GRPOConfig; `trl.reward_funcs` -> `rewards:`; a dataset transform -> `type: prompt` and the
command that runs it first. Pure data and small functions, like axolotl.py beside it; convert.py applies them.

Checked against axolotl at commit 067b021 (2026-07): core/trainers/grpo/__init__.py (GRPOStrategy: which `trl.*` key
reaches which GRPOConfig argument, how reward functions and transforms are imported), core/builders/rl.py (TRL's
beta: trl.beta, else rl_beta, else orpo_alpha), prompt_strategies/base.py and utils/data/rl.py (a dataset `type:`
`module.func` is called with the config and mapped over the records), utils/schemas/{trl,vllm}.py (the keys and their
defaults), docs/grpo.qmd and docs/rlhf.qmd (the examples); with TRL 1.16's GRPOConfig defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from finetune.recipe.axolotl.keys import GRPO_HINTS, IN_PROCESS

# TRL's loss aggregations finetune trains (finetune/recipe/grpo.py); TRL 1.16 also has cispo, sapo, luspo...
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
# `trl.*` keys with the same name and meaning in finetune
SAME = ("num_generations", "max_completion_length", "temperature", "top_p", "top_k", "epsilon", "epsilon_high",
        "num_iterations", "mask_truncated_completions")


@dataclass(frozen=True)
class KeyPort:
    """What one axolotl key (or one `trl.KEY`) becomes: finetune `settings` (with a `note` when the meaning moved),
    or a `drop` reason, or a `block`: it changes what is trained and finetune cannot honour it, so it stays in the
    recipe as written and the recipe does not load until the user decides."""

    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    drop: str = ""
    block: str = ""


_DELETE = "delete the line to train without it, or keep training this recipe with axolotl"

# `trl.*` keys finetune has no setting for: why each is dropped (the vLLM ones: IN_PROCESS)
TRL_DROPPED: dict[str, str] = {
    **dict.fromkeys(("use_data_producer", "async_prefetch", "prefetch_depth", "streaming_partial_batch",
                     "streaming_min_groups"),
                    "not needed: finetune generates a step's completions, then trains on them, in one process; "
                    "there is no background producer to configure"),
    "generation_batch_size": "not in finetune: each optimizer step generates its own completions (micro_batch_size x "
                             "gradient_accumulation_steps per process); TRL's larger generation batch, spread over "
                             "several steps, is not available",
    "log_completions": "not needed: finetune writes every logged step's prompts, completions and rewards to "
                       "output_dir/completions.jsonl",
    "num_completions_to_print": "not needed: finetune writes the completions to output_dir/completions.jsonl",
    "ref_model_mixup_alpha": "not in finetune: read only with `sync_ref_model`",
    "ref_model_sync_steps": "not in finetune: read only with `sync_ref_model`",
    "min_p": "not in finetune: it samples with temperature, top_p and top_k only",
    "repetition_penalty": "not in finetune: it samples with temperature, top_p and top_k only",
    "generation_kwargs": "not in finetune: it samples with temperature, top_p and top_k only, and stops at EOS or "
                         "the end of the assistant's turn",
    "chat_template_kwargs": "not in finetune: prompts are rendered with the chat template's defaults; to change them "
                            "(e.g. Qwen3's `enable_thinking`), give the template as `chat_template: jinja`",
    "use_liger_loss": "not needed: a fused-kernel speed option with the same loss",
    "reward_num_workers": "not needed: finetune runs each reward function in its own worker process with a timeout "
                          "(`rewards[].timeout_s`)",
    "reward_processing_classes": "not needed: finetune scores a reward model with its own tokenizer and template, "
                                 "saved with it",
    "off_policy_mask_threshold": "not in finetune: its completions come from the policy being trained, so none are "
                                 "off-policy",
    "use_bias_correction_kl": "not in finetune: its KL term (`rl_beta`) is TRL's k3 estimator",
    "replay_buffer_size": "not in finetune: each step trains on the completions it generated, with no replay",
    "replay_recompute_logps": "not in finetune: there is no replay buffer",
    "reroll_start_fraction": "not in finetune: prompts are not re-rolled; a group with one reward for all its "
                             "completions has zero advantage and moves nothing",
    "reroll_max_groups": "not in finetune: prompts are not re-rolled",
    "skip_zero_advantage_batches": "not needed: a micro batch whose advantages are all zero adds nothing to the loss "
                                   "but its KL term",
}

# top-level axolotl keys of a GRPO recipe (the GRPO-only ones: `finetune validate` names them too)
TOP_DROPPED: dict[str, str] = {
    **GRPO_HINTS,
    "sample_packing": "not needed: GRPO packs the completions it generates itself (a prompt held once, its "
                      "completions after it); finetune refuses `sample_packing` with `method: grpo`",
    "train_on_inputs": "not needed: GRPO's loss is on the completions only (finetune refuses `train_on_inputs` with "
                       "`method: grpo`)",
}


def trl_key(key: str, value: Any) -> KeyPort:
    """One `trl.KEY` of a GRPO recipe (beta and the rewards: port_trl)."""
    if key in SAME:
        return KeyPort({key: value})
    if key == "loss_type":
        if value in LOSS_TYPES:
            return KeyPort({key: value})
        return KeyPort(block=f"TRL's `{value}` loss is not in finetune (it has {', '.join(LOSS_TYPES)}); {_DELETE} "
                             "(finetune's default is TRL's, dapo)")
    if key == "scale_rewards":
        scaling = {True: "group", False: "none"}.get(value, value)
        note = f"TRL reads `{value}` as `{scaling}`" if scaling != value else ""
        if scaling in ("group", "batch", "none"):
            return KeyPort({key: scaling}, note)
        return KeyPort(drop=f"dropped: `{value}` is not a reward scaling finetune has (group, batch, none)")
    if key.startswith("vllm") or key == "use_vllm":
        return KeyPort(drop=IN_PROCESS)
    return _not_ours(key, value)


def _not_ours(key: str, value: Any) -> KeyPort:
    """A `trl.KEY` with no finetune setting: blocked where it changes what is trained, else dropped with why."""
    if key == "sync_ref_model" and value:
        return KeyPort(block=f"finetune's reference is the starting model throughout (TD-GRPO's synced reference is "
                             f"not in finetune); {_DELETE}")
    if key == "importance_sampling_level" and value == "sequence":
        return KeyPort(block=f"sequence-level importance ratios (GSPO) are not in finetune, whose ratio is per token; "
                             f"{_DELETE}")
    if key == "multi_objective_aggregation" and value == "normalize_then_sum":
        return KeyPort(block=f"finetune sums the weighted rewards, then normalizes (TRL's sum_then_normalize); "
                             f"normalizing each reward first (GDPO) is not in finetune; {_DELETE}")
    if key == "rollout_func" and value:
        return KeyPort(block=f"finetune generates with the model itself; a custom rollout function is not in "
                             f"finetune; {_DELETE}")
    defaults = {"sync_ref_model": False, "importance_sampling_level": "token",
                "multi_objective_aggregation": "sum_then_normalize"}
    if key in defaults:
        return KeyPort(drop="not needed: finetune's behaviour already")
    return KeyPort(drop=TRL_DROPPED.get(key, f"not in finetune: `trl.{key}` configures axolotl's GRPO trainer; "
                                             "finetune's GRPO settings are docs/recipe.md's"))


def rewards(funcs: Any, weights: Any, source_dir) -> KeyPort:
    """`trl.reward_funcs` + `trl.reward_weights` -> `rewards: [{function, weight}]`."""
    funcs = [funcs] if isinstance(funcs, str) else list(funcs or [])
    if weights is not None and (not isinstance(weights, list) or len(weights) != len(funcs)):
        return KeyPort(block=f"{len(funcs)} reward functions and reward_weights {weights!r}: TRL refuses a recipe "
                             "where the counts differ; give one weight per function")
    models = [name for name in funcs if not _is_function(name, source_dir) and not _reward_folder(name, source_dir)]
    if models:
        return KeyPort(block=f"{', '.join(models)}: a reward model finetune cannot find as a folder beside the recipe "
                             "(a hub id, or not a reward model); finetune scores with a local folder: download it "
                             "(`huggingface-cli download ID --local-dir DIR`) and write `rewards: [{model: DIR}]` "
                             f"(docs/reward-models.md), or {_DELETE}")
    specs, said = [], []
    for name, weight in zip(funcs, weights or [1.0] * len(funcs)):
        if _reward_folder(name, source_dir):
            specs.append({"model": name, "weight": float(weight)})
            said.append(f"`{name}` is a reward model, scored in the training process (TRL sums its raw score with "
                        "the functions'; `normalize: true` z-scores it within each group first)")
            continue
        function, how = reward_function(name, source_dir)
        specs.append({"function": function, "weight": float(weight)})
        said.append(how)
    weighed = f", weighed by `trl.reward_weights: {weights}`" if weights is not None else ""
    note = (f"axolotl's reward functions{weighed}, called with TRL's arguments as axolotl calls them; "
            + "; ".join(said) + ". A `FILE.py` path is relative to this recipe: keep the file beside it")
    return KeyPort({"rewards": specs}, note)


def _reward_folder(name: Any, source_dir) -> bool:
    """A reward model's folder beside the recipe (TRL loads a reward_funcs entry that is not a function as one)."""
    from finetune.reward_models import reward_model_problem

    return isinstance(name, str) and (source_dir / name).is_dir() and reward_model_problem(source_dir / name) is None


def _is_function(name: Any, source_dir) -> bool:
    """axolotl imports `module.func`; a name it cannot import is a reward model's hub id or folder."""
    if not isinstance(name, str) or "." not in name or "/" in name:
        return False
    return not (source_dir / name).is_dir()


def reward_function(name: str, source_dir) -> tuple[str, str]:
    """axolotl's dotted `package.module.func` (imported from its working directory) -> finetune's `FILE.py:func`
    when that file is beside the recipe, else the module `package.module:func`; with a word on which."""
    module, func = name.rsplit(".", 1)
    path = module.replace(".", "/") + ".py"
    if (source_dir / path).is_file():
        return f"{path}:{func}", f"`{name}` is `{path}:{func}` ({path} beside the recipe)"
    return f"{module}:{func}", (f"`{name}` is the module `{module}:{func}`: no {path} beside the recipe, so it must be "
                                "importable when training (installed, or on PYTHONPATH; axolotl imported it from its "
                                f"working directory); or put {path} beside this recipe and write `{path}:{func}`")


def port_trl(config: dict, source_dir) -> dict[str, KeyPort]:
    """Each `trl.*` key of a GRPO recipe (as `trl.KEY`), and the beta that axolotl passes to TRL (as the axolotl key
    it came from: `trl.beta`, `rl_beta`, `dpo_beta` or `orpo_alpha`)."""
    trl = config.get("trl") if isinstance(config.get("trl"), dict) else {}
    ports: dict[str, KeyPort] = {}
    for key, value in trl.items():
        if key in ("beta", "reward_weights"):  # _beta's; the rewards' (below)
            continue
        if key == "reward_funcs":
            ports["trl.reward_funcs"] = rewards(value, trl.get("reward_weights"), source_dir)
            if ports["trl.reward_funcs"].block and "reward_weights" in trl:  # kept beside the functions they weigh
                ports["trl.reward_weights"] = KeyPort(block="decided with `trl.reward_funcs`")
        elif value is None:
            ports[f"trl.{key}"] = KeyPort(drop="dropped: empty, so unset (finetune's default applies)")
        else:
            ports[f"trl.{key}"] = trl_key(key, value)
    if "reward_weights" in trl and "reward_funcs" not in trl:
        ports["trl.reward_weights"] = KeyPort(drop="dropped: there are no reward_funcs to weigh")
    ports.update(_beta(config, trl))
    return ports


def _beta(config: dict, trl: dict) -> dict[str, KeyPort]:
    """TRL's beta, GRPO's KL weight (`rl_beta`): axolotl's trl.beta, else rl_beta, else orpo_alpha."""
    sources = {"trl.beta": trl.get("beta"), "rl_beta": config.get("rl_beta"),
               "dpo_beta": config.get("dpo_beta") if config.get("rl_beta") is None else None,
               "orpo_alpha": config.get("orpo_alpha")}
    winner = next((key for key, value in sources.items() if value is not None), None)
    notes = {"trl.beta": "axolotl's `trl.beta`: the KL term's weight against the starting model",
             "dpo_beta": "axolotl's old name for `rl_beta`",
             "orpo_alpha": "axolotl passes `orpo_alpha` as TRL's beta when trl.beta and rl_beta are unset, for "
                           "`rl: grpo` too"}
    ports = {}
    for key in sources:
        where, name = (trl, "beta") if key == "trl.beta" else (config, key)
        if name not in where:
            continue
        value = where[name]
        if value is None:
            ports[key] = KeyPort(drop="dropped: empty, so unset (finetune's default applies)")
        elif key == winner:
            ports[key] = KeyPort({"rl_beta": value}, notes.get(key, ""))
        else:
            ports[key] = KeyPort(drop=f"dropped: axolotl passes `{winner}` as TRL's beta instead")
    return ports


@dataclass
class DatasetPort:
    """A GRPO dataset entry in finetune: `type: prompt`, the note on it, why some keys are dropped (`key_notes`),
    `convert`: what to run before training (empty when the records read as they are), and `path`: where the records
    will be once converted (None: `path` as written)."""

    type: str
    note: str
    key_notes: dict[str, str] = field(default_factory=dict)
    convert: str = ""
    path: str | None = None


def dataset(spec: dict, source_dir) -> DatasetPort:
    """How finetune reads one axolotl GRPO dataset entry: TRL's {prompt, ...} as it is, or after the transform."""
    value = spec.get("type")
    if value is None:
        return DatasetPort("prompt", "no `type`: axolotl hands the records to TRL as they are, {prompt, ...the columns "
                                     "the rewards read}, which finetune reads as prompt records")
    if isinstance(value, str) and "." in value:
        return _transform(value, spec, source_dir)
    return DatasetPort("prompt", f"axolotl's `{value}` is not a GRPO dataset transform finetune knows",
                       convert='write each record as {"prompt": "text" or [messages], ...the columns your rewards '
                               "read} (docs/recipe.md, `type: prompt`)")


def _transform(value: str, spec: dict, source_dir) -> DatasetPort:
    """axolotl's `module.func` dataset type: a Python function, called with the config, that returns a function (and
    `datasets.map` arguments) turning each raw record into {prompt, ...}. finetune runs no dataset code, so the
    command to run it once is written out, and `path` points at what it writes."""
    module, func = value.rsplit(".", 1)
    source = module.replace(".", "/") + ".py"
    where = f"{source}, beside the recipe" if (source_dir / source).is_file() else f"the module `{module}`"
    written = f"{_stem(str(spec.get('path', 'records')))}.prompts.jsonl"
    command = (f'python -c "import datasets, {module}; made = {module}.{func}(None); fn, kw = made if isinstance(made, '
               f'tuple) else (made, {{}}); {_load_call(spec)}.map(fn, **kw).to_json(\'{written}\')"')
    read_by = "read by the command that runs the transform (see BEFORE TRAINING)"
    return DatasetPort(
        "prompt",
        f"axolotl's `{value}` is a Python function ({func} in {where}) that axolotl maps over the raw records to make "
        "TRL's {prompt, ...}; finetune reads such prompt records but runs no dataset code, so the transform runs once, "
        f"before training, and `path` is the file it writes",
        key_notes={key: read_by for key in ("name", "split", "revision", "data_files")},
        convert=(f"run axolotl's transform `{value}` over the records once, in the folder of {source} (this recipe's): "
                 f"`{command}`; it writes {written}, which `path` names (the transform is called with cfg None, "
                 "as the examples' transforms ignore it). A transform that only renames fields is the same as "
                 "renaming them in the records"),
        path=written)


def _load_call(spec: dict) -> str:
    """The `datasets.load_dataset(...)` that reads what axolotl read: a local file by its extension, else a hub id
    with its config name and split."""
    path = str(spec.get("path", "DATA"))
    builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}.get(
        PurePath(path).suffix.lower())
    if builder:
        return f"datasets.load_dataset('{builder}', data_files='{path}', split='train')"
    name = f", '{spec['name']}'" if spec.get("name") else ""
    return f"datasets.load_dataset('{path}'{name}, split='{spec.get('split') or 'train'}')"


def _stem(path: str) -> str:
    name = PurePath(path.rstrip("/")).name or "records"
    return name.removesuffix(".gz").rsplit(".", 1)[0] if "." in name else name
