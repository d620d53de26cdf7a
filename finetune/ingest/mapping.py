"""Rows (column -> value) to records, by a field mapping or a template.

A mapping value is a column name, or a template when it contains `{column}` placeholders:
  instruction=question               {"instruction": row["question"], "output": ...}
  output="{answer}\n\nSource: {url}" a template for one field
Record fields: `text` (completion); `instruction`, `input`, `output` (instruction, with `system` replacing the
alpaca prompt's opening sentence); `system`, `user`, `assistant` (one chat turn each). With no mapping, columns named like record fields are used as they are.
"""

from __future__ import annotations

import html
import string
from collections.abc import Callable

from finetune.errors import DataError

COMPLETION_FIELDS = ("text",)
INSTRUCTION_FIELDS = ("instruction", "input", "output")
CHAT_FIELDS = ("system", "user", "assistant")
ALL_FIELDS = COMPLETION_FIELDS + INSTRUCTION_FIELDS + CHAT_FIELDS
REQUIRED = {"completion": ("text",), "instruction": ("instruction", "output"), "chat": ("user", "assistant")}

Mapper = Callable[[dict], tuple[dict | None, str | None]]


def template_fields(template: str) -> list[str]:
    """The column names a format template uses; raises DataError for a malformed template."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise DataError(f"template {template!r} is malformed ({exc}); write a literal brace as {{{{ or }}}}") from None


def mapping_shape(fields: list[str]) -> str:
    """Which record shape a set of mapped fields makes; DataError when it makes none or mixes shapes."""
    unknown = [f for f in fields if f not in ALL_FIELDS]
    if unknown:
        raise DataError(f"cannot map to `{unknown[0]}`: record fields are {', '.join(ALL_FIELDS)}")
    shapes = {s for s, group in (("completion", COMPLETION_FIELDS), ("instruction", INSTRUCTION_FIELDS),
                                 ("chat", CHAT_FIELDS)) if set(fields) & set(group)}
    if shapes == {"instruction", "chat"} and not {"user", "assistant"} & set(fields):
        shapes = {"instruction"}  # instruction data with a system column: it replaces the alpaca preamble
    if len(shapes) != 1:
        raise DataError(f"the mapped fields {', '.join(fields)} mix record shapes; map to one of: text | "
                        "instruction, input, output | system, user, assistant")
    shape = shapes.pop()
    missing = [f for f in REQUIRED[shape] if f not in fields]
    if missing:
        raise DataError(f"a {shape} record needs `{missing[0]}` mapped too (e.g. --map {missing[0]}=COLUMN)")
    return shape


def default_mapping(columns: list[str], where: str) -> tuple[tuple[str, str], ...]:
    """Columns that already carry record field names; DataError listing the columns when there are none."""
    lower = {c.lower(): c for c in columns}
    for shape_fields in (("instruction", "input", "output"), ("text",), ("system", "user", "assistant")):
        present = [(f, lower[f]) for f in shape_fields if f in lower]
        try:
            mapping_shape([f for f, _ in present])
        except DataError:
            continue
        return tuple(present)
    shown = ", ".join(columns[:12]) + (" ..." if len(columns) > 12 else "")
    first = columns[0] if columns else "COLUMN"
    raise DataError(
        f"{where} has columns {shown or '(none)'}; say which become the record, e.g. "
        f"--map instruction={first} --map output=COLUMN, or --template \"{{{first}}}\" "
        "(recipe: `map:` or `template:`)"
    )


def _value(value: object, unescape: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value != value:  # NaN: a missing cell
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    return html.unescape(text) if unescape and "&" in text else text


def build_mapper(mapping, template: str | None, columns: list[str], where: str, unescape: bool = False) -> Mapper:
    """A function row -> (record, None) or (None, why it is unusable). Checks every column up front."""
    if template is not None:
        mapping = (("text", template),)
    elif not mapping:
        mapping = default_mapping(columns, where)
    shape = mapping_shape([f for f, _ in mapping])
    known = set(columns)
    getters = []
    for field, source in mapping:
        names = template_fields(source) if "{" in source else [source]
        for name in names:
            if name not in known:
                shown = ", ".join(columns[:20])
                raise DataError(f"{where}: column `{name}` (mapped to `{field}`) does not exist; columns are: {shown}")
        getters.append((field, source if "{" in source else None, source))

    def mapper(row: dict) -> tuple[dict | None, str | None]:
        values = {}
        for field, tmpl, column in getters:
            if tmpl is None:
                values[field] = _value(row.get(column), unescape)
            else:
                values[field] = tmpl.format_map({k: _value(v, unescape) for k, v in row.items()})
        for field in REQUIRED[shape]:
            if not values[field].strip():
                return None, f"`{field}` is empty (from {dict(mapping)[field]!r})"
        return to_record(shape, values), None

    return mapper


def to_record(shape: str, values: dict) -> dict:
    if shape == "completion":
        return {"text": values["text"]}
    if shape == "instruction":
        record = {"instruction": values["instruction"], "input": values.get("input", ""), "output": values["output"]}
        return {**record, "system": values["system"]} if values.get("system", "").strip() else record
    messages = [{"role": "system", "content": values["system"]}] if values.get("system", "").strip() else []
    messages += [{"role": "user", "content": values["user"]}, {"role": "assistant", "content": values["assistant"]}]
    return {"messages": messages}
