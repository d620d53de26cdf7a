"""An axolotl recipe (a dict) -> a finetune recipe (a dict) and the YAML text with a comment on every key
that changed or was dropped, saying why. Pure: no files, no torch; commands/port.py does the I/O. The tables are
finetune/recipe/axolotl/'s and axolotl.py's (every recipe), axolotl_vision.py's (vision-language keys), fsdp.py's,
preference/'s (`rl: dpo` and the other preference methods) and grpo.py's (`rl: grpo`).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import yaml

from finetune.errors import FinetuneError
from finetune.port import axolotl, axolotl_vision, fsdp, grpo, methods, reward
from finetune.port.ported import Ported, inline
from finetune.port.preference import method as preference, records as preference_records
from finetune.recipe import Recipe
from finetune.recipe.axolotl import chat_templates, keys as axolotl_keys
from finetune.recipe.data import DatasetSpec
from finetune.recipe.training import OPTIMIZERS

# Names finetune accepts for a field besides its own (save_steps -> checkpoint_interval...).
_ALIASES = {alias for f in Recipe.model_fields.values() for alias in getattr(f.validation_alias, "choices", ())}
_RECIPE_KEYS = set(Recipe.model_fields) | _ALIASES
_DATASET_KEYS = set(DatasetSpec.model_fields)
_EMPTY = "dropped: empty in the axolotl recipe, so unset (finetune's default applies)"
_LOCAL_SUFFIXES = re.compile(r"\.(jsonl|json|csv|tsv|sql|db|sqlite3?|html?|gz|bz2|zip|xz)$", re.I)


def _shared_value(key: str, value: Any, out: Ported, source_dir) -> None:
    """A key both tools have: the value as finetune spells it, with a comment when it changed or cannot port."""
    note, ported = "", value
    if key == "deepspeed" and not (source_dir / str(value)).is_file():  # your own JSON stays yours
        ported, note = axolotl.deepspeed(str(value))
    elif key == "gradient_checkpointing":
        ported, note = axolotl_keys.gradient_checkpointing(value)
    elif key == "optimizer" and value not in OPTIMIZERS:
        return out.drop(key, value, f"not in finetune; it has {', '.join(OPTIMIZERS)} (default adamw_torch)")
    elif key in ("lr_scheduler", "attn_implementation"):
        allowed = Recipe.model_fields[key].annotation.__args__
        if value not in allowed:
            return out.drop(key, value, f"not in finetune; it has {', '.join(allowed)}")
    out.settings[key] = ported
    if note or ported != value:
        out.note(key, note or f"axolotl `{key}: {inline(value)}` is written `{inline(ported)}` here")


def _dataset(i: int, spec: Any, source_dir, out: Ported, method: str = "sft") -> dict | None:
    where = f"datasets[{i}]"
    if not isinstance(spec, dict):
        out.note_dropped("datasets", where, f"{where}: not a mapping; left out")
        return None
    records = (grpo.dataset(spec, source_dir) if method == "grpo" else preference_records.dataset(spec, method)) \
        if method != "sft" else None
    result: dict = {}
    for key, value in spec.items():
        if key == "type" and records is not None:
            _preference_type(where, spec, records, result, out)
        elif key == "path" and getattr(records, "path", None):
            result["path"] = records.path
            out.note("datasets", f"{where}.path: `{value}` -> `{records.path}`: the records once converted (see "
                     "BEFORE TRAINING)")
        elif key == "type":
            ported, note = axolotl_keys.dataset_type(value)
            if ported:
                result["type"] = ported
                if ported != value:
                    out.note("datasets", f"{where}.type: axolotl `{value}` -> `{ported}`: {note}")
            else:
                result["type"] = "auto"
                out.note("datasets", f"{where}.type: {note}; set to `auto` until then")
        elif key == "path":
            result["path"] = value
            if isinstance(value, str) and not _LOCAL_SUFFIXES.search(value) and not (source_dir / value).exists():
                out.hub_paths.append(value)
                out.note("datasets", f"{where}.path: `{value}` looks like a Hugging Face dataset id: finetune loads it "
                         "from the hub with `datasets` when training; where the hub cannot be reached, download it "
                         f"(hf download --repo-type dataset {value} --local-dir data/) and point `path` "
                         "at the folder")
        elif records is None and key in _MAPPED_KEYS and value is not None:
            _mapped_key(where, key, value, spec, result, out)
        elif records is not None and (key in preference_records.LAYOUT_KEYS or key in records.key_notes):
            out.note_dropped("datasets", f"{where}.{key}", f"{where}.{key}: {inline(value)}: dropped, "
                             f"{records.key_notes.get(key, 'finetune reads fixed field names (see the type note)')}")
        elif value is None or axolotl.DATASET_DEFAULTS.get(key) == value:
            out.note_dropped("datasets", f"{where}.{key}",
                             f"{where}.{key}: {inline(value)}: dropped, finetune's behaviour already")
        elif key in axolotl_keys.DATASET_KEYS:
            out.note_dropped("datasets", f"{where}.{key}",
                             f"{where}.{key}: {inline(value)}: dropped, {axolotl_keys.DATASET_KEYS[key].hint}")
        elif key in _DATASET_KEYS:
            result[key] = value
        else:
            out.note_dropped("datasets", f"{where}.{key}", f"{where}.{key}: {inline(value)}: dropped, not a "
                             "finetune key and not in the axolotl table (docs/recipe.md lists the dataset keys)")
    if records is not None and "type" not in spec:
        _preference_type(where, spec, records, result, out)
    return result


def _roles_to_train(specs: list, out: Ported) -> None:
    """axolotl sets `roles_to_train` per dataset; finetune's is one top-level key (recipe/data.py)."""
    values = [spec.get("roles_to_train") or ["assistant"] for spec in specs if isinstance(spec, dict)]
    if all(value == ["assistant"] for value in values):
        return  # axolotl's default and finetune's
    ported, why = axolotl.roles_to_train(values)
    if ported is None:
        out.block("roles_to_train", values, f"the datasets' roles_to_train {inline(values)}: {why}")
    else:
        out.settings["roles_to_train"] = ported
        out.note("roles_to_train", f"from the datasets' axolotl `roles_to_train` ({inline(values)})")


_MAPPED_KEYS = (*axolotl.FIELD_MAP, "message_property_mappings", "field_system", "roles")


def _mapped_key(where: str, key: str, value: Any, spec: dict, result: dict, out: Ported) -> None:
    """axolotl's field keys become `map:` entries, its `roles:` (ours -> theirs) finetune's (theirs -> ours)."""
    if key == "roles":
        mapped, note = axolotl.dataset_roles(value)
        if mapped:
            result["roles"] = {**result.get("roles", {}), **mapped}
    else:
        mapped, note = axolotl.dataset_map(key, value)
        if mapped:
            result["map"] = {**result.get("map", {}), **mapped}
    said = "roles" if key == "roles" else "map"
    if mapped:
        out.note("datasets", f"{where}.{key}: {inline(value)} -> `{said}: {inline(mapped)}`"
                 + (f"; {note}" if note else ""))
    else:
        out.note_dropped("datasets", f"{where}.{key}",
                         f"{where}.{key}: {inline(value)}: dropped, " + (note or "finetune's behaviour already"))


def _preference_type(where: str, spec: dict, records: preference_records.DatasetPort, result: dict,
                     out: Ported) -> None:
    result["type"] = records.type
    result.update({key: getattr(records, key) for key in ("map", "roles") if getattr(records, key, None)})
    value = spec.get("type")
    said = f"axolotl `{inline(value)}` -> `{records.type}`" if value is not None else f"`{records.type}`"
    out.note("datasets", f"{where}.type: {said}: {records.note}")
    if records.convert:
        out.note("datasets", f"{where}: BEFORE TRAINING, {records.convert}")
        out.data_edits.append(f"{where} ({spec.get('path', 'no path')}): {records.convert}")


def port_axolotl(config: dict, source_dir) -> Ported:
    """Convert an axolotl config; FinetuneError for the kinds of training finetune does not do (rl: gdpo...)."""
    for key, why in axolotl_keys.UNPORTABLE.items():
        if config.get(key):
            raise FinetuneError(f"`{key}`: {why.format(value=config[key])}; nothing was written")
    rl, reward_model = config.get("rl"), bool(config.get("reward_model"))
    if rl and rl not in preference.RL_METHODS and rl != "grpo":
        raise FinetuneError(f"`rl: {rl}`: {axolotl.online_rl(rl)}; nothing was written")
    if rl and reward_model:
        raise FinetuneError(f"`reward_model: true` and `rl: {rl}`: a recipe trains a reward model or a policy, not "
                            "both; drop one (a reward model then serves a GRPO run: `rewards: [{model: DIR}]`); nothing "
                            "was written")
    if rl == "grpo":
        method, rl_ports = "grpo", grpo.port_trl(config, source_dir)
    elif reward_model:
        method, rl_ports = "reward", reward.port_keys(config)
    else:
        method, rl_ports = preference.port_keys(config) if rl else ("sft", {})
    out = Ported()
    for key, value in config.items():
        if key == "datasets" and isinstance(value, list):
            specs = [_dataset(i, spec, source_dir, out, method) for i, spec in enumerate(value)]
            out.settings["datasets"] = [s for s in specs if s is not None]
            if method == "sft":
                _roles_to_train(value, out)
        elif key in fsdp.TOP_KEYS:
            pass  # read together once the other keys are in (_fsdp_recipe)
        elif key in axolotl_vision.TOP_KEYS and value is not None and not rl:
            axolotl_vision.port_key(key, value, config, out)  # vision-language keys, where they stand
        elif method == "grpo" and value is not None and (key in preference.RL_KEYS or key in grpo.TOP_DROPPED):
            methods.grpo_key(key, value, rl_ports, out)
        elif method == "reward" and key in reward.KEYS and value is not None:
            methods.rl_key(key, value, rl_ports.get(key), out)
        elif key in preference.RL_KEYS and value is not None:
            methods.rl_key(key, value, rl_ports.get(key), out, method)
        elif (rl or reward_model) and key in axolotl.RL_DIFFERENT and value is not None:
            methods.under_rl(key, value, out)
        elif key in axolotl_keys.KEYS and axolotl_keys.KEYS[key].blocks and value not in (None, False, [], ""):
            out.block(key, value, axolotl_keys.KEYS[key].hint)
        elif key in axolotl_keys.KEYS:
            entry = axolotl_keys.KEYS[key]
            settings = entry.convert(value, config) if entry.convert and value is not None else {}
            if not settings:
                out.drop(key, value, _EMPTY if value is None else "dropped, " + entry.hint)
            for name, new in settings.items():
                out.settings[name] = new
                out.note(name, f"from axolotl `{key}: {inline(value)}`")
        elif value is None:
            out.drop(key, value, _EMPTY)
        elif key == "chat_template":  # which family's template axolotl names, beside this base model
            ported, note = chat_templates.chat_template(value, config.get("base_model"), source_dir)
            out.settings[key] = ported
            if note:
                out.note(key, note)
        elif key in _RECIPE_KEYS:
            _shared_value(key, value, out, source_dir)
        else:
            out.drop(key, value, "dropped: not a finetune key and not in the axolotl table; check docs/recipe.md")
    _fsdp_recipe(config, out)
    axolotl_vision.finish(config, out)  # regex LoRA targets; what trains in a vision-language model
    if config.get("lora_target_linear") is True and isinstance(config.get("lora_target_modules"), list):
        out.settings["lora_target_modules"] = "all-linear"  # axolotl adds every linear layer to the list
        out.note("lora_target_modules", "the axolotl list is replaced: `lora_target_linear: true` adds every "
                 "linear layer to it")
    if rl == "grpo":
        methods.grpo_recipe(config, out)
    elif rl or reward_model:
        methods.preference_recipe(config, rl_ports, out)
    return out


def _fsdp_recipe(config: dict, out: Ported) -> None:
    """axolotl's `fsdp` / `fsdp_config` / `fsdp_version` together -> finetune's `fsdp:` section (FSDP2)."""
    given = {key: config[key] for key in fsdp.TOP_KEYS if key in config}
    if not given:
        return
    if not fsdp.used(config):
        for key, value in given.items():
            out.drop(key, value, _EMPTY if value is None else "dropped: FSDP is off (no `fsdp_config`)")
        return
    if config.get("adapter") == "qlora" or config.get("load_in_4bit") or config.get("load_in_8bit"):
        for key, value in given.items():
            out.drop(key, value, fsdp.QUANTIZED)
        return
    ported = fsdp.port(config)
    for name, value in ported.settings.items():
        if name == "gradient_checkpointing":  # beside what axolotl's own gradient_checkpointing said, if it did
            out.note(name, "from axolotl `fsdp_config.activation_checkpointing: true` (FSDP2 checkpoints each "
                     "decoder layer itself under `fsdp`)")
        out.settings[name] = value
    if "fsdp" not in out.settings:  # NO_SHARD: plain data parallelism
        for key, value in given.items():
            out.drop(key, value, "dropped: " + "; ".join(ported.notes))
        return
    out.note("fsdp", f"from axolotl {', '.join(f'`{key}`' for key in given)}: FSDP2 (docs/distributed.md)")
    for text in ported.notes:
        out.note("fsdp", text)
    out.nested_dropped += ported.dropped


def _comment(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width=110, initial_indent=f"# {indent}", subsequent_indent=f"# {' ' * len(indent)}  ")


def render(ported: Ported, header: list[str]) -> str:
    """The recipe as YAML: each key set after the comments on where it came from, each dropped axolotl key as a
    comment (`# key: value` and why) where it stood in the source."""
    lines = [line for text in header for line in _comment(text)]
    keys = list(ported.settings)
    for k in range(len(keys) + 1):
        for _, written, why in (d for d in ported.dropped if d[0] == k):
            lines += [f"# {line}" for line in written.splitlines()] + _comment(why, " ^ ")
        if k == len(keys):
            break
        key = keys[k]
        lines += [line for text in ported.comments.get(key, []) for line in _comment(text)]
        lines.append(yaml.safe_dump({key: ported.settings[key]}, sort_keys=False, allow_unicode=True,
                                    width=110).rstrip())
    return "\n".join(lines) + "\n"
