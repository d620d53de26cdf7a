"""The method-specific half of porting an axolotl recipe (finetune/port/convert.py reads the rest): a GRPO
recipe's keys (`rl: grpo`, its `trl:` block: grpo.py's table), a preference or reward-model recipe's keys
(preference/, reward.py), and what each needs once every key is read (room for completions, the adapter it
continues, packing, the chat turns axolotl's dataset types write).
"""

from __future__ import annotations

from typing import Any

from finetune.port import grpo, reward
from finetune.port.preference import method as preference, records as preference_records
from finetune.port.ported import Ported, inline
from finetune.recipe.methods import METHOD_SETTINGS


def grpo_key(key: str, value: Any, ports: dict, out: Ported) -> None:
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
        out.note(name, f"from axolotl `{source}: {inline(value)}`" + (f": {port.note}" if port.note else ""))


def grpo_recipe(config: dict, out: Ported) -> None:
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


def rl_key(key: str, value: Any, port: preference.KeyPort | None, out: Ported, method: str = "sft") -> None:
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
            out.note(name, f"from axolotl `rl: {inline(value)}`: TRL's default there (see `method`)")
        elif port.note or name != key or new != value:
            out.note(name, f"from axolotl `{key}: {inline(value)}`" + (f": {port.note}" if port.note else ""))


def under_rl(key: str, value: Any, out: Ported) -> None:
    """A key both kinds of recipe have whose meaning differs in a preference recipe."""
    if key == "train_on_inputs":
        out.drop(key, value, "dropped, not needed: preference losses score the answers only (finetune refuses "
                             "`train_on_inputs` with a preference method; axolotl's rl trainers ignore it)")
    # lora_model_dir: preference_recipe, once base_model is read too


def preference_recipe(config: dict, rl_ports: dict, out: Ported) -> None:
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
        out.note("base_model", f"from axolotl `lora_model_dir: {inline(config['lora_model_dir'])}`: the adapter "
                 "this run continues; finetune loads its base (named in its adapter_config.json) and keeps training "
                 f"it.{reference}" + (f"; axolotl's base_model `{base}` is the base the adapter names" if base else ""))
