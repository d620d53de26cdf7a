"""axolotl recipe -> finetune recipe, the parts only `finetune port` needs: what an unported `rl:` is, a dataset
entry's field and role mappings, a DeepSpeed config's name. The table of axolotl's keys (with what `finetune validate`
says of each) is finetune/recipe/axolotl/: the recipe reads it too, and the recipe sits below port.
"""

from __future__ import annotations

from pathlib import PurePath

from finetune.port.preference import method as preference

# Keys of both kinds of recipe whose meaning differs under `rl:` (convert.py, _under_rl).
RL_DIFFERENT = frozenset({"train_on_inputs", "lora_model_dir"})


def online_rl(value) -> str:
    """Why an `rl:` that is neither a preference method nor grpo does not port."""
    methods = ", ".join(preference.RL_METHODS)
    if value == "gdpo":
        return ("axolotl's `gdpo` is GRPO with each reward normalized before the weighted sum; finetune's GRPO sums "
                "first, then normalizes (TRL's default): to train that, write `rl: grpo` and port again")
    if value in preference.ONLINE_RL:
        return (f"axolotl's `{value}` is online RL that finetune does not train; finetune trains the preference "
                f"methods ({methods}) and GRPO (`rl: grpo`)")
    return f"not an axolotl rl method finetune knows; finetune trains {methods} and grpo (`method:`)"


# Defaults that need no comment when a recipe spells them out.
DATASET_DEFAULTS = {"split": "train", "ds_type": "json", "field_messages": "messages",
                    "message_field_role": "role", "message_field_content": "content",
                    "message_property_mappings": {"role": "role", "content": "content"},
                    "roles_to_train": ["assistant"]}

# axolotl's dataset field keys -> the finetune `map:` field they set (finetune/ingest/record_map.py)
FIELD_MAP = {"field_messages": "messages", "message_field_role": "role", "message_field_content": "content",
             "field_instruction": "instruction", "field_input": "input", "field_output": "output", "field": "text"}
_OUR_ROLES = ("system", "user", "assistant")


def dataset_map(key: str, value) -> tuple[dict, str]:
    """The `map:` entries an axolotl dataset field key sets, and a note for what does not port ("" when all does)."""
    if key == "message_property_mappings" and isinstance(value, dict):
        mapped = {ours: theirs for ours, theirs in value.items() if ours in ("role", "content") and ours != theirs}
        rest = sorted(set(value) - {"role", "content"})
        return mapped, (f"{', '.join(rest)}: dropped, finetune's chat turns carry a role and content only" if rest else "")
    if key == "field_system" and isinstance(value, str):
        return {"system": value}, ""
    if key in FIELD_MAP and isinstance(value, str):
        return ({FIELD_MAP[key]: value} if value != FIELD_MAP[key] else {}), ""
    return {}, f"dropped: `{key}: {value}` has no finetune `map:` equivalent"


def dataset_roles(value) -> tuple[dict, str]:
    """axolotl's `roles:` ({user: [human, user], assistant: [gpt]}: ours -> theirs) as finetune's `roles:` (theirs ->
    ours), leaving out the names finetune knows already; a note for a role finetune has no turn for."""
    known = {"system": "system", "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}
    if not isinstance(value, dict):
        return {}, f"dropped: `roles` is not a mapping ({value!r})"
    out, unknown = {}, []
    for ours, names in value.items():
        if ours not in _OUR_ROLES:
            unknown.append(str(ours))
            continue
        for name in [names] if isinstance(names, str) else names or []:
            if known.get(name) != ours:
                out[str(name)] = ours
    return out, (f"roles {', '.join(unknown)}: dropped, finetune's turns are system, user and assistant" if unknown
                 else "")


def roles_to_train(values: list) -> tuple[list | None, str]:
    """axolotl's per-dataset `roles_to_train` (each chat dataset's; axolotl's default ["assistant"]) -> finetune's one
    top-level list, or (None, why) when the datasets ask for different roles or a role finetune has no turn for."""
    aliases = {"human": "user", "gpt": "assistant"}
    wanted = []
    for value in values:
        names = [aliases.get(name, name) for name in ([value] if isinstance(value, str) else list(value or []))]
        unknown = [name for name in names if name not in _OUR_ROLES]
        if unknown or not names:
            return None, (f"roles {', '.join(map(str, unknown)) or '(none)'}: finetune's turns are system, user and "
                          "assistant; write `roles_to_train` with those")
        wanted.append(sorted(set(names), key=_OUR_ROLES.index))
    if any(roles != wanted[0] for roles in wanted):
        return None, ("the datasets train different roles, and finetune has one top-level `roles_to_train` for every "
                      "chat: write one list (or port the datasets apart)")
    return wanted[0], ""


def deepspeed(value: str) -> tuple[str, str]:
    """axolotl's deepspeed_configs/zero3_bf16.json etc. -> finetune's shipped config of the same stage."""
    stem = PurePath(value).stem.lower()
    for stage in ("zero3", "zero2", "zero1"):
        if stem.startswith(stage):
            name = f"{stage}_offload" if "offload" in stem and stage != "zero1" else stage
            return name, f"axolotl's `{value}` -> finetune's shipped `{name}` (same ZeRO stage; \"auto\" values)"
    return value, ""
