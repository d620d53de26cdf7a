"""IngestOptions: every setting that changes what an ingest run writes, in one frozen object.

The CLI (`finetune ingest`) and the recipe (`datasets:` entries with a raw source type) both build one;
`fingerprint()` is part of the content-hash cache key, so any option that changes the output changes the key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

from finetune.errors import DataError

SOURCE_TYPES = ("html", "csv", "sql", "sqlite", "database", "records")
SLOP_MODES = ("drop", "strip", "off")
HTML_MODES = ("document", "sections")
SQL_DIALECTS = ("auto", "mysql", "postgres", "sqlite")
PARALLEL_MIN_FILES = 16  # HTML pages: below this, starting worker processes costs more than it saves
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """`finetune ingest`'s default: one HTML worker process per CPU this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


@dataclass(frozen=True)
class IngestOptions:
    type: str | None = None  # forced source type; None: inferred per path
    mapping: tuple[tuple[str, str], ...] = ()  # (record field, column / template / CSS selector)
    template: str | None = None  # "{title}\n\n{body}" -> {"text": ...}
    table: str | None = None  # SQL dump / SQLite / database table
    query: str | None = None  # SQLite / database read-only query
    sql_dialect: str = "auto"
    html_mode: str = "document"
    html_split_level: int = 2  # `sections`: split at headings of this level or higher (h1, h2)
    delimiter: str | None = None  # CSV; None: "," or tab for .tsv
    encoding: str | None = None  # None: BOM / declared charset / detection
    unescape_html: bool = False  # CSV/SQL cells: &amp; -> &
    chunk_rows: int = 20_000  # CSV rows held in memory at a time
    workers: int = 1  # processes parsing HTML pages; >1 pays on large folders with idle cores
    slop: str = "drop"
    slop_builtin: bool = True
    slop_phrases: tuple[str, ...] = ()
    slop_files: tuple[str, ...] = ()
    normalize: bool = True  # unicode NFC, whitespace, control characters
    dedup: bool = True  # exact duplicates on normalized text
    near_dedup: float | None = None  # Jaccard threshold for near-duplicates (MinHash), e.g. 0.85
    min_chars: int = 1
    max_chars: int | None = None
    strict: bool = False  # fail when any input row/document was unusable

    def validate(self) -> "IngestOptions":
        """Raise DataError for combinations that cannot work, naming the option and the fix."""
        if self.type is not None and self.type not in SOURCE_TYPES:
            raise DataError(f"unknown source type `{self.type}`; use one of {', '.join(SOURCE_TYPES)}")
        if self.slop not in SLOP_MODES:
            raise DataError(f"slop mode `{self.slop}` is not one of {', '.join(SLOP_MODES)}")
        if self.html_mode not in HTML_MODES:
            raise DataError(f"html mode `{self.html_mode}` is not one of {', '.join(HTML_MODES)}")
        if self.sql_dialect not in SQL_DIALECTS:
            raise DataError(f"SQL dialect `{self.sql_dialect}` is not one of {', '.join(SQL_DIALECTS)}")
        if self.mapping and self.template:
            raise DataError("give either a column mapping (--map / `map:`) or a template, not both")
        if self.near_dedup is not None and not 0.0 < self.near_dedup < 1.0:
            raise DataError(f"near-duplicate threshold {self.near_dedup} must be between 0 and 1, e.g. 0.85")
        if self.max_chars is not None and self.max_chars < self.min_chars:
            raise DataError(f"max_chars {self.max_chars} is below min_chars {self.min_chars}")
        if self.chunk_rows < 1:
            raise DataError("chunk_rows must be at least 1")
        if self.workers < 1:
            raise DataError("workers must be at least 1")
        return self

    def fingerprint(self) -> str:
        """A hash of every option that changes the output, slop list files' contents included."""
        data = asdict(self)
        data.pop("chunk_rows")  # changes memory use, never the output
        data.pop("workers")  # changes speed, never the output (pages come back in order)
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode())
        for path in self.slop_files:
            try:
                with open(path, "rb") as fh:
                    digest.update(fh.read())
            except OSError:
                digest.update(b"<missing>")
        return digest.hexdigest()


def parse_map(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--map FIELD=COLUMN` items -> ((field, column), ...). Raises DataError for a malformed item."""
    pairs = []
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise DataError(f"--map `{item}` is not FIELD=COLUMN, e.g. --map instruction=question")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)
