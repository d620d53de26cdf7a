"""SQL dump files (MySQL, PostgreSQL, SQLite dialects; plain or compressed) -> records, streamed.

Nothing in a dump is ever executed: statements are parsed as text. Rows come from INSERT ... VALUES
(multi-row) and PostgreSQL COPY ... FROM stdin blocks; column names from the INSERT's column list, else
the table's CREATE TABLE, else positions (`1`, `2`, ...). A statement that cannot be parsed is rejected
as `sql_syntax_error` with its line number, and the rest of the dump still ingests.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from finetune.errors import DataError
from finetune.ingest.mapping import build_mapper
from finetune.ingest.options import IngestOptions
from finetune.ingest.report import Reject
from finetune.ingest.sql_split import split_statements
from finetune.ingest.sql_values import (SqlSyntaxError, copy_head, copy_row, create_table, insert_head,
                                        parse_rows, value_regex)
from finetune.ingest.textio import open_text, read_sample

_MYSQL_HINTS = re.compile(rb"MySQL dump|MariaDB dump|/\*!\d{5}|ENGINE\s*=|LOCK TABLES|`\w+`", re.I)
_PG_HINTS = re.compile(rb"PostgreSQL database dump|standard_conforming_strings|pg_catalog|COPY \S+ .*FROM stdin", re.I)
_PG_OLD_STRINGS = re.compile(rb"standard_conforming_strings\s*=\s*'?off", re.I)


def detect_dialect(sample: bytes) -> str:
    if _PG_HINTS.search(sample):
        return "postgres"
    if _MYSQL_HINTS.search(sample):
        return "mysql"
    return "sqlite"


class _Dump:
    """Per-file state: known tables' columns, the table being read, mapper per column layout."""

    def __init__(self, path: str, opts: IngestOptions):
        self.path, self.opts = path, opts
        self.columns: dict[str, list[str]] = {}
        self.tables_with_rows: list[str] = []
        self.mappers: dict[tuple, object] = {}
        self.copy_target: tuple[str, list[str]] | None = None
        self.row_count = 0
        # Without --table, rows of a second table turn the read into a census: every table's rows are
        # counted, nothing more is yielded, and the end of the dump raises one error listing them all.
        self.census = False
        self.rows_per_table: Counter = Counter()
        # Without --table, the first table's columns may not map (a real dump often starts with users or
        # migrations): that turns the read into a census too, and is said only when the dump has one table.
        self.mapping_error: DataError | None = None

    def wanted(self, table: str, line: int) -> bool:
        if table not in self.tables_with_rows:
            self.tables_with_rows.append(table)
        if self.opts.table is not None:
            return table == self.opts.table
        self.census = self.census or table != self.tables_with_rows[0]
        return not self.census

    def count(self, table: str, n: int) -> None:
        if self.opts.table is None:
            self.rows_per_table[table] += n

    def census_error(self) -> DataError:
        if self.mapping_error is not None and len(self.rows_per_table) == 1:
            return self.mapping_error
        by_rows = sorted(self.rows_per_table.items(), key=lambda kv: -kv[1])  # stable: ties in dump order
        width, digits = max(len(table) for table, _ in by_rows), len(f"{by_rows[0][1]:,}")
        listing = "\n".join(f"  {table.ljust(width)}  {n:>{digits},} row{'s' * (n != 1)}" for table, n in by_rows)
        return DataError(f"`{self.path}` has rows for {len(by_rows)} tables; choose one with --table (recipe: "
                         f"`table:`), e.g. --table {by_rows[0][0]}:\n{listing}")

    def rows_to_items(self, table: str, cols: list[str] | None, rows: list[list], line: int):
        cols = cols or self.columns.get(table)
        width = len(rows[0]) if rows else 0
        cols = cols or [str(i) for i in range(1, width + 1)]
        key = tuple(cols)
        if key not in self.mappers:
            try:
                self.mappers[key] = build_mapper(self.opts.mapping, self.opts.template, cols,
                                                 f"`{self.path}` table `{table}`", self.opts.unescape_html)
            except DataError as exc:
                if self.opts.table is not None:
                    raise
                self.census, self.mapping_error = True, exc  # list the tables at the end of the dump
                return
        mapper = self.mappers[key]
        for values in rows:
            self.row_count += 1
            where = f"{self.path} line {line} row {self.row_count}"
            if len(values) != len(cols):
                yield Reject(where, "ragged_row", f"{len(values)} values for {len(cols)} columns of `{table}`",
                             raw=[v if not isinstance(v, bytes) else v.hex() for v in values])
                continue
            row = dict(zip(cols, values))
            record, problem = mapper(row)
            yield (where, record) if record is not None else Reject(where, "empty_field", problem, raw=row)


def read_sql_dump(path: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    sample = read_sample(path)
    if b"\x00" in sample[:8192]:
        raise DataError(f"`{path}` looks binary (it contains NUL bytes); a SQLite database file is ingested "
                        "with --type sqlite, a dump must be SQL text")
    dialect = detect_dialect(sample) if opts.sql_dialect == "auto" else opts.sql_dialect
    backslash = dialect == "mysql" or bool(_PG_OLD_STRINGS.search(sample))
    values = value_regex(backslash)
    dump = _Dump(path, opts)
    stream, encoding = open_text(path, opts.encoding)
    try:
        with stream:
            events = split_statements(stream, backslash, dialect == "mysql", dialect == "postgres")
            yield from _events(events, dump, values, backslash)
    except UnicodeDecodeError as exc:
        raise DataError(f"`{path}` is not {encoding} text ({exc.reason}); pass --encoding") from None
    if dump.census:
        raise dump.census_error()
    if opts.table is not None and opts.table not in dump.tables_with_rows:
        found = ", ".join(dump.tables_with_rows) or "none"
        raise DataError(f"`{path}` has no rows for table `{opts.table}`; tables with rows: {found}")
    if not dump.tables_with_rows:
        raise DataError(f"`{path}` holds no INSERT or COPY rows; is it a schema-only dump?")


def _events(events, dump: _Dump, values, backslash: bool):
    for event in events:
        if event.kind == "copy_row":
            if dump.copy_target is not None:
                table, cols = dump.copy_target
                dump.count(table, 1)
                if not dump.census:
                    yield from dump.rows_to_items(table, cols, [copy_row(event.text)], event.line)
            continue
        if event.kind == "copy_end":
            dump.copy_target = None
            continue
        if event.kind == "unterminated":
            yield Reject(f"{dump.path} line {event.line}", "sql_syntax_error",
                         "the last statement never ends (unterminated string or missing `;`): a truncated dump?")
            continue
        yield from _statement(event.text, event.line, dump, values, backslash)


def _statement(text: str, line: int, dump: _Dump, values, backslash: bool):
    head = text[:32].lstrip().upper()
    if head.startswith("CREATE"):
        parsed = create_table(text)
        if parsed is not None:
            dump.columns[parsed[0]] = parsed[1]
    elif head.startswith("INSERT") or head.startswith("REPLACE"):
        parsed = insert_head(text.replace("REPLACE", "INSERT", 1) if head.startswith("REPLACE") else text)
        if parsed is None:
            yield Reject(f"{dump.path} line {line}", "sql_syntax_error", f"cannot read the INSERT: {text[:80]!r}")
            return
        table, cols, start = parsed
        if not dump.wanted(table, line) and not dump.census:
            return
        try:
            rows = parse_rows(text, start, values, backslash)
        except SqlSyntaxError as exc:
            if not dump.census:
                yield Reject(f"{dump.path} line {line}", "sql_syntax_error", f"INSERT INTO {table}: {exc}")
            return
        dump.count(table, len(rows))
        if not dump.census:
            yield from dump.rows_to_items(table, cols, rows, line)
    elif head.startswith("COPY"):
        parsed = copy_head(text)
        if parsed is not None and (dump.wanted(parsed[0], line) or dump.census):
            dump.copy_target = parsed
