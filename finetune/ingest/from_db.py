"""Databases -> records: a SQLite file (opened read-only) or a live database by SQLAlchemy URL, with a
read-only query. Rows are fetched in batches, so a large table streams through."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from urllib.parse import quote

from finetune.errors import DataError
from finetune.ingest.mapping import build_mapper
from finetune.ingest.options import IngestOptions
from finetune.ingest.report import Reject

FETCH_ROWS = 2_000
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _table_query(table: str, quote_char: str = '"') -> str:
    return f"SELECT * FROM {quote_char}{table.replace(quote_char, quote_char * 2)}{quote_char}"


def _rows_to_items(label: str, columns: list[str], batches, opts: IngestOptions):
    mapper = build_mapper(opts.mapping, opts.template, columns, label, opts.unescape_html)
    n = 0
    for batch in batches:
        for values in batch:
            n += 1
            row = dict(zip(columns, values))
            record, problem = mapper(row)
            where = f"{label} row {n}"
            yield (where, record) if record is not None else Reject(where, "empty_field", problem,
                                                                  raw={k: str(v) for k, v in row.items()})
    if n == 0:
        raise DataError(f"{label}: the query returned no rows; check the table name or the WHERE clause")


def read_sqlite(path: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    with open(path, "rb") as fh:
        if fh.read(16) != _SQLITE_MAGIC:
            raise DataError(f"`{path}` is not a SQLite database (no SQLite header); a SQL text dump is "
                            "ingested with --type sql")
    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        conn.execute("PRAGMA query_only = ON")  # belt and braces on top of mode=ro
        query = opts.query or _table_query(_pick_sqlite_table(conn, path, opts.table))
        try:
            cursor = conn.execute(query)
        except sqlite3.Error as exc:
            raise DataError(f"`{path}`: the query failed: {exc}. Query: {query}") from None
        columns = [d[0] for d in cursor.description or ()]
        if not columns:
            raise DataError(f"`{path}`: the query returns no columns; it must be a SELECT")
        batches = iter(lambda: cursor.fetchmany(FETCH_ROWS), [])
        yield from _rows_to_items(f"`{path}`", columns, batches, opts)
    except sqlite3.DatabaseError as exc:
        raise DataError(f"`{path}` cannot be read as a SQLite database: {exc}") from None
    finally:
        conn.close()


def _pick_sqlite_table(conn, path: str, table: str | None) -> str:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                                        "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    if table is not None:
        if table not in names:
            raise DataError(f"`{path}` has no table `{table}`; tables: {', '.join(names) or 'none'}")
        return table
    if len(names) != 1:
        raise DataError(f"`{path}` has {len(names)} tables ({', '.join(names) or 'none'}); choose one with "
                        "--table, or give a --query (recipe: `table:` / `query:`)")
    return names[0]


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def read_database(url: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    """A live database by URL. The query runs inside a READ ONLY transaction that is always rolled back."""
    try:
        from sqlalchemy import create_engine, text
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
    except ImportError:
        raise DataError("reading a database URL needs SQLAlchemy: pip install 'sqlalchemy>=2'") from None
    if not (opts.query or opts.table):
        raise DataError(f"say what to read from {url.split('://')[0]}://...: --query 'SELECT ...' or --table NAME")
    try:
        label = f"`{_redact(url)}`"
        engine = create_engine(url)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise DataError(f"cannot use the database URL: {exc}") from None
    query = opts.query or _table_query(opts.table, "`" if engine.dialect.name == "mysql" else '"')
    try:
        with engine.connect() as conn:
            _read_only(conn, engine.dialect.name)
            result = conn.execution_options(stream_results=True).execute(text(query))
            columns = list(result.keys())
            yield from _rows_to_items(label, columns, iter(lambda: result.fetchmany(FETCH_ROWS), []), opts)
            conn.rollback()
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise DataError(f"{label}: the query failed: {reason}. Query: {query}") from None
    finally:
        engine.dispose()


def _read_only(conn, dialect: str) -> None:
    from sqlalchemy import text

    if dialect == "postgresql":
        conn.execute(text("SET TRANSACTION READ ONLY"))
    elif dialect in ("mysql", "mariadb"):
        conn.execute(text("SET SESSION TRANSACTION READ ONLY"))
    elif dialect == "sqlite":
        conn.execute(text("PRAGMA query_only = ON"))
