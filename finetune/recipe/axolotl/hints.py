"""What `finetune validate` says of an axolotl key or value it meets (recipe/load.py asks, only when a recipe does
not load): the finetune equivalent instead of a fuzzy did-you-mean, and `finetune port` once."""

from __future__ import annotations

from finetune.recipe.axolotl import preference
from finetune.recipe.axolotl.chat_templates import SAME_CHAT_TEMPLATES, chat_template
from finetune.recipe.axolotl.keys import DATASET_KEYS, GRPO_HINTS, KEYS, UNPORTABLE, dataset_type, gradient_checkpointing


def value_hint(loc: tuple, value) -> str | None:
    """For `finetune validate`: a value axolotl accepts where finetune does not, with what to write."""
    keys = [p for p in loc if isinstance(p, str)]
    if keys == ["datasets", "type"]:
        ported, note = dataset_type(value)
        return f"axolotl's `type: {value}` is finetune's `type: {ported}`" if ported else note
    if keys == ["chat_template"] and value not in SAME_CHAT_TEMPLATES:
        return chat_template(value)[1]
    if keys == ["gradient_checkpointing"]:
        return gradient_checkpointing(value)[1] or None
    return None


def key_hint(loc: tuple) -> str | None:
    """For `finetune validate`: an unknown key that is an axolotl key, with its finetune equivalent."""
    keys = [p for p in loc if isinstance(p, str)]
    table = KEYS if len(keys) == 1 else DATASET_KEYS if keys[:1] == ["datasets"] and len(keys) == 2 else {}
    entry = table.get(keys[-1]) if keys else None
    if entry is None and len(keys) == 1 and keys[0] in preference.HINTS:
        return f"an axolotl key: {preference.HINTS[keys[0]]}"
    if entry is None and len(keys) == 1 and keys[0] in GRPO_HINTS:
        return f"an axolotl key (GRPO): {GRPO_HINTS[keys[0]]}"
    if entry is None and len(keys) == 1 and keys[0] in UNPORTABLE:
        return f"an axolotl key: {UNPORTABLE[keys[0]].format(value='...')}"
    if entry is None:
        return None
    return f"an axolotl key: {entry.hint}"


def with_port_tip(messages: list[str], source: str) -> list[str]:
    """Point the first axolotl-flavoured problem at `finetune port`, once rather than on every line."""
    for i, message in enumerate(messages):
        if "axolotl" in message:
            tip = (f" (this looks like an axolotl recipe: `finetune port {source} -o recipe.yml` converts all of it; "
                   "docs/porting-from-axolotl.md)")
            return [*messages[:i], message + tip, *messages[i + 1:]]
    return messages
