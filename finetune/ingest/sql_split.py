"""A streaming SQL statement splitter for dump files of any size.

It reads line by line and holds one statement at a time (MySQL's extended INSERTs are about 1 MiB each
with mysqldump's defaults; a statement over MAX_STATEMENT_CHARS is an error, not a memory blow-up).
It knows just enough SQL to find statement ends: quoted strings (with backslash escapes in MySQL, and in
PostgreSQL dumps that set standard_conforming_strings off), quoted identifiers, -- # /* */ comments,
$tag$ dollar quoting, and PostgreSQL's COPY ... FROM stdin data blocks, whose rows it yields one by one.
Each statement is then parsed on its own (sqlparse for CREATE TABLE; a regex tokenizer for INSERT rows).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from finetune.errors import DataError

MAX_STATEMENT_CHARS = 256 << 20


class Event(NamedTuple):
    kind: str  # "statement" | "copy_row" | "copy_end" | "unterminated"
    text: str
    line: int  # 1-based line where it starts


def _patterns(backslash: bool, hash_comments: bool, dollar: bool):
    single = r"'(?:[^'\\]|\\.)*'" if backslash else r"'[^']*'"
    double = r'"(?:[^"\\]|\\.)*"' if backslash else r'"[^"]*"'
    stop = "'\"`;\\-/" + ("#" if hash_comments else "") + ("$" if dollar else "")
    body = rf"(?:[^{re.escape(stop)}]+|{single}|{double}|`[^`]*`|-(?!-)|/(?!\*)"
    body += r"|\$(?![A-Za-z_]?\w*\$))*" if dollar else ")*"
    ends = {
        "'": re.compile(r"(?:[^'\\]|\\.)*'" if backslash else r"[^']*'", re.S),
        '"': re.compile(r'(?:[^"\\]|\\.)*"' if backslash else r'[^"]*"', re.S),
        "`": re.compile(r"[^`]*`", re.S),
    }
    return re.compile(body, re.S), ends


_COPY_STDIN = re.compile(r"^\s*COPY\b.*\bFROM\s+stdin\b", re.I | re.S)
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_]\w*)?\$")


def split_statements(lines, backslash: bool, hash_comments: bool, dollar: bool) -> Iterator[Event]:
    """Events from an iterable of lines (each ending in its newline)."""
    body, ends = _patterns(backslash, hash_comments, dollar)
    parts: list[str] = []
    size = 0
    start_line = 0
    state: str | None = None  # None, a quote character, "/*", or a "$tag$"
    copying = False
    for line_no, line in enumerate(lines, start=1):
        if copying:
            if line.rstrip("\r\n") == "\\.":
                copying = False
                yield Event("copy_end", "", line_no)
            else:
                yield Event("copy_row", line, line_no)
            continue
        pos, n = 0, len(line)
        while pos < n:
            if state is None:
                m = body.match(line, pos)
                end = m.end()
                if end > pos:
                    piece = line[pos:end]
                    parts.append(piece)
                    size += end - pos
                    if not start_line and not piece.isspace():
                        start_line = line_no
                pos = end
                if pos >= n:
                    break
                ch = line[pos]
                if ch == ";":
                    text = "".join(parts).strip()
                    first = start_line or line_no
                    parts, size, start_line = [], 0, 0
                    pos += 1
                    if text:
                        yield Event("statement", text, first)
                        if _COPY_STDIN.match(text):
                            copying = True
                            break
                elif ch in "'\"`":
                    start_line = start_line or line_no
                    state = ch
                    parts.append(ch)
                    pos += 1
                elif line.startswith("--", pos) or ch == "#":
                    parts.append("\n")
                    break
                elif line.startswith("/*", pos):
                    state = "/*"
                    pos += 2
                else:  # a dollar-quote opening tag
                    tag = _DOLLAR_TAG.match(line, pos).group(0)
                    parts.append(tag)
                    state = tag
                    pos += len(tag)
            elif state == "/*":
                close = line.find("*/", pos)
                if close < 0:
                    break
                state, pos = None, close + 2
                parts.append(" ")
            elif state in ends:
                m = ends[state].match(line, pos)
                if m is None:  # the string goes on past this line
                    parts.append(line[pos:])
                    size += n - pos
                    break
                parts.append(line[pos : m.end()])
                size += m.end() - pos
                state, pos = None, m.end()
            else:  # inside $tag$ ... $tag$
                close = line.find(state, pos)
                if close < 0:
                    parts.append(line[pos:])
                    break
                parts.append(line[pos : close + len(state)])
                pos, state = close + len(state), None
        if size > MAX_STATEMENT_CHARS:
            raise DataError(f"a statement starting at line {start_line} is over {MAX_STATEMENT_CHARS >> 20} M "
                            "characters: an unterminated string? Check the dump around that line")
    leftover = "".join(parts).strip()
    if leftover or state not in (None, "/*"):
        yield Event("unterminated", leftover[:200], start_line or 1)
