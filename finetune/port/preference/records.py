"""axolotl's preference dataset types (and its reward models' `bradley_terry.*`) -> finetune's `preference` / `unpaired` records: whether finetune reads
the records as they are (same prompt, same answers, same chat turns), or what each record must become.

Checked against axolotl's prompt_strategies/{dpo,orpo,kto}/ at commit 067b021 (2026-07): the fields each
`type:` reads and the turns it writes. finetune's reader is finetune/ingest/preference.py: {prompt, chosen,
rejected} plain or as messages, TRL's implicit prompt (whole conversations, UltraFeedback's string prompt
beside them too), sharegpt-style {conversations, chosen, rejected}, alpaca-style pairs; KTO's {prompt,
completion, label}. Plain strings are plain text there: no chat template. Pure data and small functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# the types themselves (their names, the fields each reads): `finetune validate` tells them apart too
from finetune.recipe.axolotl.preference import PAIR_TYPES, REWARD_TYPES, SHORT_NAMES, SYSTEM_FIELD, UNPAIRED_TYPES

_PAIR = ('{"prompt": [{"role": "user", "content": ...}], "chosen": [{"role": "assistant", "content": ...}], '
         '"rejected": [{"role": "assistant", "content": ...}]}')
_UNPAIRED = ('{"prompt": [{"role": "user", "content": ...}], "completion": [{"role": "assistant", "content": ...}], '
             '"label": true | false}')
_TURNS = {"chatml": "ChatML turns", "llama3": "Llama 3 turns", "template": "the chat template's turns"}
# keys of a preference dataset entry that describe the records' fields (their notes come with `type`'s)
LAYOUT_KEYS = ("field_messages", "field_chosen", "field_rejected", "message_property_mappings", "roles",
               "message_field_role", "message_field_content")


@dataclass
class DatasetPort:
    """A preference dataset entry in finetune: its `type`, the note on it, a note per layout key, `convert`: what
    each record must become before training (empty when finetune reads them as they are), and `chat`: the turns
    axolotl writes its records in (see recipe/axolotl/preference.py, Layout)."""

    type: str
    note: str
    key_notes: dict[str, str] = field(default_factory=dict)
    convert: str = ""
    chat: str | None = None
    map: dict[str, str] = field(default_factory=dict)  # the dataset's `map:` (finetune/ingest/record_map.py)
    roles: dict[str, str] = field(default_factory=dict)  # the dataset's `roles:` (theirs -> ours)


def dataset(spec: dict, method: str) -> DatasetPort:
    """How finetune reads the records of one axolotl preference dataset entry, for `method`."""
    shape, target = ("unpaired", _UNPAIRED) if method == "kto" else ("preference", _PAIR)
    value = spec.get("type")
    if isinstance(value, dict):
        return _user_defined(value, method, shape, target)
    if value is None:
        fields = "{prompt, completion, label}" if method == "kto" else "{prompt, chosen, rejected}"
        return DatasetPort(shape, f"no `type`: axolotl reads TRL's {fields} as they are, as finetune does")
    name = SHORT_NAMES.get(value, value)
    if name == "chat_template.default" and method != "kto":
        return _chat_template_default(spec, target)
    layout = (UNPAIRED_TYPES if method == "kto" else {**PAIR_TYPES, **REWARD_TYPES} if method == "reward"
              else PAIR_TYPES).get(name)
    if layout is None:
        kind = "KTO" if method == "kto" else "reward model" if method == "reward" else "DPO/IPO/ORPO/SimPO"
        return DatasetPort(shape, f"`{value}` is not one of axolotl's {kind} dataset types finetune knows",
                           convert=f"write each record as {target} (or another layout docs/preference.md lists)")
    turns = _TURNS.get(layout.chat or "template")
    if layout.reads:
        system = ' (a "system" field is not read: put it in the records as a first system message)' \
            if SYSTEM_FIELD in layout.fields else ""
        fixed = f"; axolotl writes {turns} whatever chat_template says" if layout.chat in ("chatml", "llama3") else ""
        return DatasetPort(shape, f"{layout.fields}, read as they are{system}{fixed}", chat=layout.chat)
    if layout.plain:
        why = f"finetune would read these as plain text, with no chat turns, where axolotl wraps them in {turns}"
    elif layout.chat:
        why = f"finetune does not read these field names (and axolotl wraps the strings in {turns})"
    else:
        why = "finetune does not read this layout"
    system = ' (a "system" field becomes a first system message)' if SYSTEM_FIELD in layout.fields else ""
    same = "" if not layout.chat else (", to train on the chat template's turns, as axolotl does" if
                                       layout.chat == "template" else f", to train on the same {turns}")
    return DatasetPort(shape, f"{layout.fields}: {why}", chat=layout.chat,
                       convert=f"write each record as {target}{system}{same}")


def _chat_template_default(spec: dict, target: str) -> DatasetPort:
    """axolotl's chat_template.default: {field_messages: [prompt messages], field_chosen: message, field_rejected:
    message}, rendered with the recipe's chat template: finetune's sharegpt-style pair as it is when the prompt
    field is `conversations`, else read through the dataset's `map:` (and `roles:` for other role names)."""
    names = {"messages": spec.get("field_messages") or "messages", "chosen": spec.get("field_chosen") or "chosen",
             "rejected": spec.get("field_rejected") or "rejected"}
    mapping = spec.get("message_property_mappings") or {}
    role = mapping.get("role") or spec.get("message_field_role") or "role"
    content = mapping.get("content") or spec.get("message_field_content") or "content"
    props_read = (role, content) in (("role", "content"), ("from", "value"))
    mapped = {ours: theirs for ours, theirs in names.items() if theirs != ours and not
              (ours == "messages" and theirs == "conversations")}
    if not props_read:
        mapped.update(role=role, content=content)
    if names["messages"] == "messages":  # a pair under `messages` reads only through the conversation mapping
        mapped["messages"] = "messages"
    roles = _role_map(spec.get("roles"))
    said = {"field_messages": "messages", "field_chosen": "chosen", "field_rejected": "rejected",
            "message_property_mappings": "role", "message_field_role": "role", "message_field_content": "content"}
    key_notes = {key: (f"-> `map: {{{ours}: {mapped[ours]}}}`" if ours in mapped else "finetune's name already")
                 for key, ours in said.items() if key in spec}
    if "roles" in spec:
        key_notes["roles"] = f"-> `roles:` {json.dumps(roles)}" if roles else "finetune reads these role names"
    layout = f"{{{names['messages']}: [prompt messages], {names['chosen']}: message, {names['rejected']}: message}}"
    how = "read through the dataset's `map:`" + (" and `roles:`" if roles else "") if mapped or roles \
        else "finetune's sharegpt-style pair, read as it is"
    return DatasetPort("preference", f"{layout}: {how} and rendered with the chat template, as axolotl renders it",
                       key_notes, chat="template", map=mapped, roles=roles)


def _role_map(roles: Any) -> dict[str, str]:
    """axolotl's `roles:` (ours -> their names) as finetune's (theirs -> ours), for the names finetune does not
    read as they are (it reads system/user/assistant, human/gpt)."""
    aliases = {"user": ("user", "human"), "assistant": ("assistant", "gpt"), "system": ("system",)}
    if not isinstance(roles, dict):
        return {}
    return {str(name): target for target, names in roles.items() if target in aliases
            for name in (names if isinstance(names, list) else [names]) if name not in aliases[target]}


def _user_defined(value: dict, method: str, shape: str, target: str) -> DatasetPort:
    """axolotl's user_defined.default (a mapping as `type:`): fields renamed and formatted as plain text, no chat
    template, as finetune reads plain strings."""
    sides = ("prompt", "completion") if method == "kto" else ("prompt", "chosen", "rejected")
    fields = sides + (("label",) if method == "kto" else ())
    renamed = [f"`{value[f'field_{s}']}` to `{s}`" for s in fields if value.get(f"field_{s}") not in (None, s)]
    custom = [f"{s}_format {json.dumps(value[f'{s}_format'])}" for s in sides
              if value.get(f"{s}_format") not in (None, "", "{" + s + "}")]
    plain = "{" + ", ".join(fields) + "}"
    if not renamed and not custom:
        return DatasetPort(shape, f"axolotl's user-defined {plain}, unformatted: plain text, read as they are")
    todo = ([f"rename {', '.join(renamed)}"] if renamed else []) + (
        [f"apply {', '.join(custom)} to the fields (the plain text axolotl trains on)"] if custom else [])
    return DatasetPort(shape, f"axolotl's user-defined layout, formatted as plain text: finetune reads {plain} "
                              "plain text as it is", convert=f"{'; '.join(todo)} in each record")
