"""Records whose fields are named otherwise: a recipe's `map:` and `roles:` for a records dataset, and
sharegpt read as it is.

The vocabulary is the raw sources' `map:` (finetune/ingest/mapping.py): record field -> source column, or a
`{column}` template. Records add the conversation:
  messages   the field holding the turns (sharegpt: `conversations`)
  role       the key of a turn that holds its role (sharegpt: `from`)
  content    the key of a turn that holds its text (sharegpt: `value`)
  system     a field whose text becomes a leading system turn
and `roles:` maps a source role name to ours (system, user, assistant). Without a mapping a record with
`conversations` is read as sharegpt: turns under `from`/`value` (or `role`/`content`), roles human/gpt.

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

from collections.abc import Callable

from finetune.errors import DataError
from finetune.ingest.mapping import build_mapper
from finetune.recipe.data import CONVERSATION_MAP_FIELDS as CONVERSATION_FIELDS

ROLE_ALIASES = {"system": "system", "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}
SHAREGPT_FIELD = "conversations"

RecordMapper = Callable[[dict, str], tuple[dict | None, str | None]]


class RoleError(DataError):
    """A turn's role that neither our names nor `roles:` cover: an error naming the record, never a drop."""


def is_conversation(mapping: dict | None) -> bool:
    return bool(set(mapping or {}) & set(CONVERSATION_FIELDS))


def record_mapper(mapping: dict | None, roles: dict | None, columns: list[str], source: str) -> RecordMapper:
    """A function (row, where) -> (record, None) or (None, why it is unusable).

    No mapping: records read as they are, sharegpt rows converted. A conversation mapping: the turns converted.
    A flat mapping (instruction/input/output, text, system/user/assistant): the raw sources' mapper, its
    columns checked up front against `columns`."""
    role_names = {**ROLE_ALIASES, **(roles or {})}
    sharegpt = SHAREGPT_FIELD in columns and not {"messages", "chosen", "rejected", "completion"} & set(columns)
    if is_conversation(mapping) or (not mapping and sharegpt):
        default = SHAREGPT_FIELD if SHAREGPT_FIELD in columns and "messages" not in columns else "messages"
        field = (mapping or {}).get("messages") or default
        if columns and field not in columns:
            raise DataError(f"`{source}`: the conversation field `{field}` (map: messages) is not in the records; "
                            f"their fields are: {', '.join(columns[:20])}")
        return _conversation_mapper(field, mapping or {}, role_names, source)
    if mapping and "prompt" in mapping:  # GRPO: the prompt from its column, the other columns kept for the rewards
        column = mapping["prompt"]
        if columns and column not in columns:
            raise DataError(f"`{source}`: the prompt column `{column}` (map: prompt) is not in the records; their "
                            f"fields are: {', '.join(columns[:20])}")
        return lambda row, where: ({"prompt": row.get(column), **{k: v for k, v in row.items() if k != column}}, None)
    if mapping:
        flat = build_mapper(tuple(mapping.items()), None, columns, f"`{source}`")
        return lambda row, where: flat(row)
    if roles:
        return _conversation_mapper("messages", {}, role_names, source)
    return lambda row, where: (row, None)


def _conversation_mapper(field: str, mapping: dict, role_names: dict, source: str) -> RecordMapper:
    role_key, content_key, system_field = mapping.get("role"), mapping.get("content"), mapping.get("system")

    def mapper(row: dict, where: str) -> tuple[dict | None, str | None]:
        turns = row.get(field)
        if not isinstance(turns, list) or not turns:
            return None, f"`{field}` is not a non-empty list of turns"
        messages = []
        if system_field and isinstance(row.get(system_field), str) and row[system_field].strip():
            messages.append({"role": "system", "content": row[system_field]})
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                return None, f"{field}[{i}] is not an object"
            r_key = role_key or ("role" if "role" in turn else "from")
            c_key = content_key or ("content" if "content" in turn else "value")
            name = turn.get(r_key)
            if name not in role_names:
                known = ", ".join(sorted(role_names))
                raise RoleError(
                    f"`{source}` {where}: {field}[{i}] has the role {name!r} (key `{r_key}`), which the mapping "
                    f"does not cover (known: {known}); add it to the dataset's `roles:`, e.g. "
                    f"`roles: {{{name}: assistant}}` (or user, system)")
            content = turn.get(c_key)
            if not isinstance(content, str):
                return None, f"{field}[{i}] has no text under `{c_key}`"
            messages.append({"role": role_names[name], "content": content})
        return {"messages": messages}, None

    return mapper
