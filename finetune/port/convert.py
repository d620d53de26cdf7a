"""An axolotl recipe (a dict) -> a finetune recipe (a dict) and the YAML text with a comment on every key
that changed or was dropped, saying why. Pure: no files, no torch; commands/port.py does the I/O. The tables are
finetune/recipe/axolotl/'s and axolotl.py's (every recipe), axolotl_vision.py's (vision-language keys), fsdp.py's,
preference/'s (`rl: dpo` and the other preference methods) and grpo.py's (`rl: grpo`).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

import yaml

from finetune.errors import FinetuneError
from finetune.port import axolotl, axolotl_vision, fsdp, grpo, reward
from finetune.port.preference import method as preference, records as preference_records
from finetune.recipe import Recipe
from finetune.recipe.axolotl import chat_templates, keys as axolotl_keys
from finetune.recipe.data import DatasetSpec
from finetune.recipe.methods import METHOD_SETTINGS
from finetune.recipe.training import OPTIMIZERS

# Names finetune accepts for a field besides its own (save_steps -> checkpoint_interval...).
_ALIASES = {alias for f in Recipe.model_fields.values() for alias in getattr(f.validation_alias, "choices", ())}
_RECIPE_KEYS = set(Recipe.model_fields) | _ALIASES
_DATASET_KEYS = set(DatasetSpec.model_fields)
_EMPTY = "dropped: empty in the axolotl recipe, so unset (finetune's default applies)"
_LOCAL_SUFFIXES = re.compile(r"\.(jsonl|json|csv|tsv|sql|db|sqlite3?|html?|gz|bz2|zip|xz)$", re.I)


@dataclass
class Ported:
    """The converted recipe and, for the YAML, one comment per axolotl key that did not port as it was."""

    settings: dict = field(default_factory=dict)
    comments: dict[str, list[str]] = field(default_factory=dict)  # finetune key (or "" = dropped) -> comments
    # (how many keys were set before it, "key: value" as written, why): rendered as comments in the source's order
    dropped: list[tuple[int, str, str]] = field(default_factory=list)
    hub_paths: list[str] = field(default_factory=list)  # dataset paths that look like hub ids: download first
    # keys kept as written because finetune cannot honour what they change: the recipe does not load until edited
    blocked: dict[str, str] = field(default_factory=dict)  # key -> "`key: value`: why"
    data_edits: list[str] = field(default_factory=list)  # records finetune does not read as they are: convert first
    todo: list[str] = field(default_factory=list)  # what to do before training, said once the recipe is written
    # settings inside a key (`datasets[0].field_x`, `fsdp_config.KEY`) left out, each said in its key's comments
    nested_dropped: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)  # `dropped` entries that head a block (`trl:`), not keys

    @property
    def dropped_count(self) -> int:
        """How many axolotl settings the recipe leaves out, each with a comment: top-level keys and keys inside
        one (a dataset's, fsdp_config's)."""
        return sum(written not in self.headers for _, written, _ in self.dropped) + len(self.nested_dropped)

    def note_dropped(self, key: str, where: str, text: str) -> None:
        """`where` (a setting inside `key`) is left out: said on `key`, counted."""
        self.note(key, text)
        self.nested_dropped.append(where)

    def note(self, key: str, text: str) -> None:
        self.comments.setdefault(key, []).append(text)

    def block(self, key: str, value: Any, why: str) -> None:
        self.settings[key] = value
        self.note(key, f"NEEDS YOUR DECISION: {why}")
        self.blocked[key] = f"`{key}: {_inline(value)}`: {why}"

    def unblock(self, key: str, value: Any, why: str) -> None:
        """A key kept for a decision (`value` as written), decided away: out of the recipe, a dropped key's comment
        where it stood."""
        position = list(self.settings).index(key)
        del self.settings[key], self.blocked[key]
        self.comments.pop(key, None)
        self.dropped = [(n - (n > position), written, reason) for n, written, reason in self.dropped]
        self.drop(key, value, why)
        self.dropped[-1] = (position, *self.dropped[-1][1:])

    def drop(self, key: str, value: Any, why: str) -> None:
        written = yaml.safe_dump({key: value}, sort_keys=False, allow_unicode=True, width=100).rstrip()
        self.dropped.append((len(self.settings), written, why))


def _inline(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("...") else text  # safe_dump ends a bare scalar with "..."
    return text if len(text) <= 80 else text[:77] + "..."


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
        out.note(key, note or f"axolotl `{key}: {_inline(value)}` is written `{_inline(ported)}` here")


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
            out.note_dropped("datasets", f"{where}.{key}", f"{where}.{key}: {_inline(value)}: dropped, "
                             f"{records.key_notes.get(key, 'finetune reads fixed field names (see the type note)')}")
        elif value is None or axolotl.DATASET_DEFAULTS.get(key) == value:
            out.note_dropped("datasets", f"{where}.{key}",
                             f"{where}.{key}: {_inline(value)}: dropped, finetune's behaviour already")
        elif key in axolotl_keys.DATASET_KEYS:
            out.note_dropped("datasets", f"{where}.{key}",
                             f"{where}.{key}: {_inline(value)}: dropped, {axolotl_keys.DATASET_KEYS[key].hint}")
        elif key in _DATASET_KEYS:
            result[key] = value
        else:
            out.note_dropped("datasets", f"{where}.{key}", f"{where}.{key}: {_inline(value)}: dropped, not a "
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
        out.block("roles_to_train", values, f"the datasets' roles_to_train {_inline(values)}: {why}")
    else:
        out.settings["roles_to_train"] = ported
        out.note("roles_to_train", f"from the datasets' axolotl `roles_to_train` ({_inline(values)})")


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
        out.note("datasets", f"{where}.{key}: {_inline(value)} -> `{said}: {_inline(mapped)}`"
                 + (f"; {note}" if note else ""))
    else:
        out.note_dropped("datasets", f"{where}.{key}",
                         f"{where}.{key}: {_inline(value)}: dropped, " + (note or "finetune's behaviour already"))


def _preference_type(where: str, spec: dict, records: preference_records.DatasetPort, result: dict,
                     out: Ported) -> None:
    result["type"] = records.type
    result.update({key: getattr(records, key) for key in ("map", "roles") if getattr(records, key, None)})
    value = spec.get("type")
    said = f"axolotl `{_inline(value)}` -> `{records.type}`" if value is not None else f"`{records.type}`"
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
            _grpo_key(key, value, rl_ports, out)
        elif method == "reward" and key in reward.KEYS and value is not None:
            _rl_key(key, value, rl_ports.get(key), out)
        elif key in preference.RL_KEYS and value is not None:
            _rl_key(key, value, rl_ports.get(key), out, method)
        elif (rl or reward_model) and key in axolotl.RL_DIFFERENT and value is not None:
            _under_rl(key, value, out)
        elif key in axolotl_keys.KEYS and axolotl_keys.KEYS[key].blocks and value not in (None, False, [], ""):
            out.block(key, value, axolotl_keys.KEYS[key].hint)
        elif key in axolotl_keys.KEYS:
            entry = axolotl_keys.KEYS[key]
            settings = entry.convert(value, config) if entry.convert and value is not None else {}
            if not settings:
                out.drop(key, value, _EMPTY if value is None else "dropped, " + entry.hint)
            for name, new in settings.items():
                out.settings[name] = new
                out.note(name, f"from axolotl `{key}: {_inline(value)}`")
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
        _grpo_recipe(config, out)
    elif rl or reward_model:
        _preference_recipe(config, rl_ports, out)
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


def _grpo_key(key: str, value: Any, ports: dict, out: Ported) -> None:
    """A key of axolotl's GRPO recipe: `rl`, the `trl:` block key by key, TRL's beta, or what GRPO does not read."""
    if key == "rl":
        out.settings["method"] = "grpo"
        out.note("method", "from axolotl `rl: grpo`")
    elif key == "trl" and isinstance(value, dict):
        out.dropped.append((len(out.settings), "trl:", "axolotl's settings for TRL's GRPOConfig, key by key below: "
                            "each as the finetune key it became (`from axolotl trl.KEY`), or dropped with why"))
        out.headers.append("trl:")
        blocked = {}
        for name, setting in value.items():
            port = ports.get(f"trl.{name}")
            if port is not None and port.block:
                blocked[name] = (setting, port.block)
            elif port is not None:
                _apply(f"trl.{name}", setting, port, out)
        if blocked:  # kept as a `trl:` block of what needs deciding: the recipe does not load until it is edited
            out.block("trl", {name: setting for name, (setting, _) in blocked.items()},
                      "; ".join(f"`trl.{name}`: {why}" for name, (_, why) in blocked.items()))
    elif key in ports:
        _apply(key, value, ports[key], out)
    elif key in grpo.TOP_DROPPED:
        out.drop(key, value, "dropped, " + grpo.TOP_DROPPED[key])
    else:
        out.drop(key, value, "dropped: a preference-tuning key; axolotl's GRPO trainer does not read it")


def _apply(source: str, value: Any, port: grpo.KeyPort, out: Ported) -> None:
    """What one axolotl key (`trl.KEY` for the trl block's) becomes: finetune settings with where they came from,
    or a comment saying why it was dropped."""
    if port.block:
        return out.block(source, value, port.block)
    if not port.settings:
        return out.drop(source, value, port.drop if port.drop.startswith("dropped") else "dropped, " + port.drop)
    for name, new in port.settings.items():
        out.settings[name] = new
        out.note(name, f"from axolotl `{source}: {_inline(value)}`" + (f": {port.note}" if port.note else ""))


def _grpo_recipe(config: dict, out: Ported) -> None:
    """What a GRPO recipe needs once every key is read: room for the completions in sequence_len, and the adapter
    it continues as base_model."""
    completion = out.settings.get("max_completion_length", METHOD_SETTINGS["max_completion_length"]["grpo"])
    room = config.get("sequence_len")
    if isinstance(room, int) and isinstance(completion, int):
        out.settings["sequence_len"] = room + completion
        out.note("sequence_len", f"axolotl's `sequence_len: {room}` + max_completion_length {completion}: axolotl's "
                 "GRPO cuts neither prompts nor completions at sequence_len (TRL 1.16 has no max_prompt_length, and "
                 "axolotl leaves out max_length), where finetune's holds prompt + completion and gives a prompt "
                 f"sequence_len - max_completion_length tokens; so prompts keep {room} (a longer one: "
                 "`excess_length_strategy`)")
    _continued_adapter(config, out, "")


def _rl_key(key: str, value: Any, port: preference.KeyPort | None, out: Ported, method: str = "sft") -> None:
    """One key of axolotl's preference (or reward-model) training: what it becomes (preference.port_keys,
    reward.port_keys), or why it is dropped."""
    if port is None:  # no `rl:` in the recipe
        what = "a reward model" if method == "reward" else "supervised fine-tuning"
        return out.drop(key, value, "dropped: a preference-tuning key, which axolotl reads only with `rl:`; this "
                                    f"recipe trains {what}")
    if port.block:
        return out.block(key, value, port.block)
    if not port.settings:
        return out.drop(key, value, port.drop if port.drop.startswith("dropped") else "dropped, " + port.drop)
    for n, (name, new) in enumerate(port.settings.items()):
        out.settings[name] = new
        if n and key == "rl":
            out.note(name, f"from axolotl `rl: {_inline(value)}`: TRL's default there (see `method`)")
        elif port.note or name != key or new != value:
            out.note(name, f"from axolotl `{key}: {_inline(value)}`" + (f": {port.note}" if port.note else ""))


def _under_rl(key: str, value: Any, out: Ported) -> None:
    """A key both kinds of recipe have whose meaning differs in a preference recipe."""
    if key == "train_on_inputs":
        out.drop(key, value, "dropped, not needed: preference losses score the answers only (finetune refuses "
                             "`train_on_inputs` with a preference method; axolotl's rl trainers ignore it)")
    # lora_model_dir: _preference_recipe, once base_model is read too


def _preference_recipe(config: dict, rl_ports: dict, out: Ported) -> None:
    """What a preference (or reward-model) recipe needs once every key is read: the adapter it continues as base_model,
    packing, and the chat turns axolotl's chatml.* / llama3.* dataset types write whatever chat_template says."""
    if out.settings["method"] == "reward":
        _continued_adapter(config, out, "")
        reward.note_packing(out)
    else:
        _continued_adapter(config, out, " The reference is this model as it starts (base + adapter), where axolotl's "
                                        "is the base with the adapter switched off (docs/preference.md)")
        if rl_ports.get("dpo_padding_free", preference.KeyPort()).settings:
            out.settings["sample_packing"] = True
        elif out.settings.get("sample_packing") is False:
            whole = "examples" if out.settings["method"] == "kto" else "pairs (chosen and rejected as separate sequences)"
            out.note("sample_packing", f"finetune packs whole {whole}, which axolotl refuses with `rl:`: "
                                       "`sample_packing: true` is worth setting")
    template = out.settings.get("chat_template", "tokenizer_default")
    turns = {"template": template, "llama3": "Llama 3's", "chatml": "chatml", None: None}
    chats = {turns[preference_records.dataset(spec, out.settings["method"]).chat]
             for spec in config.get("datasets") or [] if isinstance(spec, dict)} - {None}
    if len(chats) > 1:
        out.note("datasets", f"axolotl writes these datasets in different chat turns ({', '.join(sorted(chats))}); "
                 "one chat_template renders every record here: split them into two runs, or convert one")
    elif chats == {"chatml"} and template != "chatml":
        out.settings["chat_template"] = "chatml"
        out.note("chat_template", "axolotl's chatml.* dataset types write ChatML turns whatever chat_template says")
    elif chats == {"Llama 3's"} and template != "jinja":
        out.note("datasets", "axolotl's llama3.* types write Llama 3's turns whatever chat_template says; finetune "
                 "renders with `chat_template` (tokenizer_default: a Llama 3 Instruct tokenizer's own template "
                 "writes those turns; for another base, give Llama 3's as `chat_template: jinja`)")


def _continued_adapter(config: dict, out: Ported, reference: str) -> None:
    """axolotl's `lora_model_dir` (an adapter to keep training) is finetune's base_model."""
    if config.get("lora_model_dir"):
        base, out.settings["base_model"] = config.get("base_model"), config["lora_model_dir"]
        out.note("base_model", f"from axolotl `lora_model_dir: {_inline(config['lora_model_dir'])}`: the adapter "
                 "this run continues; finetune loads its base (named in its adapter_config.json) and keeps training "
                 f"it.{reference}" + (f"; axolotl's base_model `{base}` is the base the adapter names" if base else ""))


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
