"""Parsing single SQL statements from a dump: CREATE TABLE column names (sqlparse), INSERT ... VALUES rows
and COPY data lines (a regex tokenizer: sqlparse would tokenize every value of a 1 MiB INSERT in Python)."""

from __future__ import annotations

import re

IDENT = r'(?:`[^`]+`|"[^"]+"|\[[^\]]+\]|[A-Za-z_][\w$]*)'
QUALIFIED = rf"{IDENT}(?:\s*\.\s*{IDENT})*"
_INSERT = re.compile(
    rf"INSERT\s+(?:IGNORE\s+|OR\s+\w+\s+)?INTO\s+(?P<table>{QUALIFIED})\s*(?:\((?P<cols>[^)]*)\))?\s*VALUES\s*",
    re.I | re.S)
_CREATE = re.compile(
    rf"CREATE\s+(?:(?:GLOBAL\s+|LOCAL\s+)?(?:TEMP|TEMPORARY|UNLOGGED)\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    rf"(?P<table>{QUALIFIED})\s*\(", re.I | re.S)
_COPY = re.compile(rf"COPY\s+(?P<table>{QUALIFIED})\s*(?:\((?P<cols>[^)]*)\))?\s+FROM\s+stdin", re.I | re.S)
_CONSTRAINT_WORDS = {"PRIMARY", "KEY", "UNIQUE", "CONSTRAINT", "INDEX", "FOREIGN", "CHECK", "FULLTEXT",
                     "SPATIAL", "EXCLUDE", "LIKE", "PERIOD"}
_MYSQL_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "\\": "\\", "'": "'",
                  '"': '"', "%": "\\%", "_": "\\_"}
_COPY_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_BACKSLASH = re.compile(r"\\(.)", re.S)
_COPY_BACKSLASH = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)


class SqlSyntaxError(ValueError):
    """A statement this parser cannot read; the caller rejects it with its line number."""


def unquote(name: str) -> str:
    """`db`.`t` / "public"."t" / [t] / t -> the last part, unquoted."""
    last = re.findall(IDENT, name)[-1]
    return last[1:-1] if last[0] in '`"[' else last


def _column_list(cols: str | None) -> list[str] | None:
    if cols is None:
        return None
    return [unquote(c.strip()) for c in cols.split(",") if c.strip()]


def create_table(text: str) -> tuple[str, list[str]] | None:
    """(table, column names) of a CREATE TABLE statement, None when it is not one."""
    m = _CREATE.match(text)
    if m is None:
        return None
    import sqlparse
    from sqlparse import tokens as T

    body = text[m.end() : text.rfind(")")]
    columns, depth, item = [], 0, []
    for tok in sqlparse.lexer.tokenize(body):
        ttype, value = tok
        if ttype in T.Punctuation and value in "()":
            depth += 1 if value == "(" else -1
        if depth == 0 and ttype in T.Punctuation and value == ",":
            columns.append(item)
            item = []
        elif ttype not in T.Whitespace and ttype not in T.Comment and ttype not in T.Newline:
            item.append((ttype, value))
    columns.append(item)
    names = []
    for item in columns:
        if not item or item[0][1].split()[0].upper() in _CONSTRAINT_WORDS:  # sqlparse: "PRIMARY KEY" is one token
            continue
        names.append(unquote(item[0][1]) if re.fullmatch(IDENT, item[0][1]) else item[0][1])
    return unquote(m.group("table")), names


def insert_head(text: str) -> tuple[str, list[str] | None, int] | None:
    """(table, column list or None, where VALUES start) for an INSERT, None for other statements."""
    m = _INSERT.match(text)
    if m is None:
        return None
    return unquote(m.group("table")), _column_list(m.group("cols")), m.end()


def copy_head(text: str) -> tuple[str, list[str] | None] | None:
    m = _COPY.match(text)
    return None if m is None else (unquote(m.group("table")), _column_list(m.group("cols")))


def value_regex(backslash: bool) -> re.Pattern:
    string = r"'(?:[^'\\]|\\.|'')*'" if backslash else r"'[^']*(?:''[^']*)*'"
    return re.compile(
        rf"""\s*(?:(?P<s>(?:_\w+\s*|[NnEe])?{string})
        |(?P<x>0x[0-9a-fA-F]*|[xX]'[0-9a-fA-F]*')
        |(?P<n>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
        |(?P<null>NULL)\b|(?P<b>TRUE|FALSE)\b)
        (?:\s*::\s*[A-Za-z_][\w ]*(?:\(\d+(?:,\s*\d+)?\))?)?\s*(?P<sep>[,)])""",
        re.X | re.I | re.S)


_ROW_OPEN = re.compile(r"\s*\(")
_ROW_NEXT = re.compile(r"\s*(,|;|$)")


def parse_rows(text: str, pos: int, values: re.Pattern, backslash: bool) -> list[list]:
    """Every (...) row of an INSERT's VALUES list, starting at `pos`. Raises SqlSyntaxError."""
    rows = []
    while True:
        if _ROW_OPEN.match(text, pos) is None:
            raise SqlSyntaxError(f"expected `(` at character {pos}: {text[pos:pos + 40]!r}")
        pos = _ROW_OPEN.match(text, pos).end()
        row = []
        while True:
            m = values.match(text, pos)
            if m is None:
                raise SqlSyntaxError(f"cannot read a value at character {pos}: {text[pos:pos + 40]!r}")
            row.append(_decode(m, backslash))
            pos = m.end()
            if m.group("sep") == ")":
                break
        rows.append(row)
        nxt = _ROW_NEXT.match(text, pos)
        if nxt is None:
            raise SqlSyntaxError(f"unexpected text after a row at character {pos}: {text[pos:pos + 40]!r}")
        if nxt.group(1) != ",":
            return rows
        pos = nxt.end()


def _decode(m: re.Match, backslash: bool):
    if m.group("s") is not None:
        raw = m.group("s")
        quote = raw.index("'")
        prefix, body = raw[:quote].strip().upper(), raw[quote + 1 : -1]
        if backslash or prefix == "E":
            body = _BACKSLASH.sub(lambda e: _MYSQL_ESCAPES.get(e.group(1), e.group(1)), body)
        return body.replace("''", "'")
    if m.group("n") is not None:
        num = m.group("n")
        return int(num) if re.fullmatch(r"[-+]?\d+", num) else float(num)
    if m.group("null") is not None:
        return None
    if m.group("b") is not None:
        return m.group("b").upper() == "TRUE"
    hexa = m.group("x")
    digits = hexa[2:] if hexa.lower().startswith("0x") else hexa[2:-1]
    return bytes.fromhex(digits).decode("utf-8", errors="replace")


def copy_row(line: str) -> list:
    """One line of COPY ... FROM stdin text format: tab-separated, \\N for NULL, backslash escapes."""
    out = []
    for field in line.rstrip("\r\n").split("\t"):
        if field == "\\N":
            out.append(None)
        elif "\\" in field:
            out.append(_COPY_BACKSLASH.sub(_copy_escape, field))
        else:
            out.append(field)
    return out


def _copy_escape(m: re.Match) -> str:
    esc = m.group(1)
    if esc[0] == "x" and len(esc) > 1:
        return chr(int(esc[1:], 16))
    if esc[0] in "01234567":
        return chr(int(esc, 8))
    return _COPY_ESCAPES.get(esc, esc)
