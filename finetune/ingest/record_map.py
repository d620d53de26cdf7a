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
Preference rows keep their pair (`chosen`, `rejected`: `map:` names them otherwise), KTO rows their `label`.

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

from collections.abc import Callable

from finetune.errors import DataError
from finetune.ingest.mapping import build_mapper
from finetune.recipe.data import CONVERSATION_MAP_FIELDS as CONVERSATION_FIELDS, PAIR_MAP_FIELDS as PAIR_FIELDS

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
    mapping = {k: v for k, v in mapping.items() if k != "images"} or None if mapping else None  # images: the
    # column read beside the record (finetune/ingest/records_source.py), not a field of it
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
    if mapping and set(mapping) <= set(PAIR_FIELDS):
        return _pair_mapper(mapping)
    if mapping:
        flat = build_mapper(tuple(mapping.items()), None, columns, f"`{source}`")
        return lambda row, where: flat(row)
    if roles:
        return _conversation_mapper("messages", {}, role_names, source)
    return lambda row, where: (row, None)


def sharegpt_record(record: dict, where: str, source: str) -> tuple[dict | None, str | None]:
    """One sharegpt record ({conversations: [{from, value}]}, roles human/gpt) as a chat record, its `images`
    (LLaMA-Factory's layout) kept beside the turns."""
    mapped, why = record_mapper(None, None, list(record), source)(record, where)
    if mapped is not None and "images" in record:
        mapped = {**mapped, "images": record["images"]}
    return mapped, why


def _conversation_mapper(field: str, mapping: dict, role_names: dict, source: str) -> RecordMapper:
    """The turns under `field` as messages. A preference row keeps its pair: the turns are the prompt, and
    chosen / rejected (`map: {chosen: ..., rejected: ...}` names them otherwise) are converted the same way, a
    string being the assistant's answer (axolotl's `{conversation, chosen, rejected}`); a row with a `label`
    stays a KTO example, `{messages, label}`."""
    role_key, content_key, system_field = mapping.get("role"), mapping.get("content"), mapping.get("system")
    sides = {side: mapping.get(side, side) for side in PAIR_FIELDS}

    def turn_messages(turns: list, name: str, where: str) -> tuple[list | None, str | None]:
        messages = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                return None, f"{name}[{i}] is not an object"
            r_key = role_key or ("role" if "role" in turn else "from")
            c_key = content_key or ("content" if "content" in turn else "value")
            role = turn.get(r_key)
            if role not in role_names:
                known = ", ".join(sorted(role_names))
                raise RoleError(
                    f"`{source}` {where}: {name}[{i}] has the role {role!r} (key `{r_key}`), which the mapping "
                    f"does not cover (known: {known}); add it to the dataset's `roles:`, e.g. "
                    f"`roles: {{{role}: assistant}}` (or user, system)")
            content = turn.get(c_key)
            if not isinstance(content, str):
                return None, f"{name}[{i}] has no text under `{c_key}`"
            messages.append({"role": role_names[role], "content": content})
        return messages, None

    def mapper(row: dict, where: str) -> tuple[dict | None, str | None]:
        turns = row.get(field)
        if not isinstance(turns, list) or not turns:
            return None, f"`{field}` is not a non-empty list of turns"
        system = []
        if system_field and isinstance(row.get(system_field), str) and row[system_field].strip():
            system.append({"role": "system", "content": row[system_field]})
        messages, why = turn_messages(turns, field, where)
        if messages is None:
            return None, why
        if not any(key in row for key in sides.values()):
            return {"messages": system + messages, **({"label": row["label"]} if "label" in row else {})}, None
        pair = {"prompt": system + messages}
        for side, key in sides.items():
            value = row.get(key)
            if isinstance(value, (dict, list)):
                value, why = turn_messages([value] if isinstance(value, dict) else value, key, where)
                if value is None:
                    return None, why
            pair[side] = [{"role": "assistant", "content": value}] if isinstance(value, str) else value
        return pair, None

    return mapper


def _pair_mapper(mapping: dict) -> RecordMapper:
    """`map: {chosen: ..., rejected: ...}` alone: the pair's fields renamed, the rest of the row as it is."""
    renamed = {theirs: ours for ours, theirs in mapping.items()}
    return lambda row, where: ({renamed.get(key, key): value for key, value in row.items()
                                if key not in PAIR_FIELDS or key in renamed}, None)
