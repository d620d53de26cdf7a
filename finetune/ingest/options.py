"""IngestOptions: every setting that changes what an ingest run writes, in one frozen object.

The recipe schema (`DatasetSpec` in finetune/recipe/schema.py) is the home of every ingestion option: its name, its
default, its choices and what it affects. IngestOptions takes its defaults and choices from there; the recipe
(`datasets:` entries with a raw source type, `from_spec`) and the CLI (`finetune ingest`, whose flags a test
checks against this class) both build one. `fingerprint()` is part of the content-hash cache key: it covers
exactly the DatasetSpec fields tagged `ingest`, so any option that changes the output changes the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from typing import get_args

from finetune.errors import DataError
from finetune.recipe.data import DatasetSpec, RECORD_TYPES
from finetune.recipe.tags import INGEST, fields_affecting

# IngestOptions field -> DatasetSpec field where the names differ because the shapes do: the recipe's `map:` is a
# mapping, the option an ordered tuple of pairs (the CLI's repeated --map); the recipe takes one `slop_file`, the
# CLI any number of --slop-phrases files.
SPEC_NAMES = {"mapping": "map", "slop_files": "slop_file"}
# Options with no recipe key: they change speed and memory, never the output (so never the cache key).
RUN_ONLY = ("chunk_rows", "workers")


def _choices(name: str) -> tuple[str, ...]:
    return get_args(DatasetSpec.model_fields[name].annotation)


SOURCE_TYPES = tuple(t for t in _choices("type") if t not in RECORD_TYPES)  # html, csv, sql, sqlite, ...
SLOP_MODES = _choices("slop")
HTML_MODES = _choices("html_mode")
SQL_DIALECTS = _choices("sql_dialect")
PARALLEL_MIN_FILES = 16  # HTML pages: below this, starting worker processes costs more than it saves
MAX_DEFAULT_WORKERS = 8


def spec_name(option: str) -> str:
    """The DatasetSpec field an IngestOptions field comes from."""
    return SPEC_NAMES.get(option, option)


def as_option(option: str, value):
    """A recipe value in the option's shape: frozen, hashable, in order."""
    if option == "mapping":
        return tuple((value or {}).items()) if not isinstance(value, tuple) else value
    if option == "slop_files":
        return value if isinstance(value, tuple) else ((value,) if value else ())
    return tuple(value) if isinstance(value, list) else value


def _default(option: str):
    """The schema's default for an option: the recipe is the only place a default lives."""
    field = DatasetSpec.model_fields[spec_name(option)]
    return as_option(option, field.get_default(call_default_factory=True))


def default_workers() -> int:
    """`finetune ingest`'s default: one HTML worker process per CPU this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


@dataclass(frozen=True)
class IngestOptions:
    # forced source type; None: inferred per path (the recipe's `auto` means a records file, not a raw source)
    type: str | None = None
    mapping: tuple[tuple[str, str], ...] = _default("mapping")  # (record field, column / template / CSS selector)
    template: str | None = _default("template")  # "{title}\n\n{body}" -> {"text": ...}
    table: str | None = _default("table")  # SQL dump / SQLite / database table
    query: str | None = _default("query")  # SQLite / database read-only query
    sql_dialect: str = _default("sql_dialect")
    html_mode: str = _default("html_mode")
    html_split_level: int = _default("html_split_level")  # `sections`: split at h1..hN
    delimiter: str | None = _default("delimiter")  # CSV; None: "," or tab for .tsv
    encoding: str | None = _default("encoding")  # None: BOM / declared charset / detection
    unescape_html: bool = _default("unescape_html")  # CSV/SQL cells: &amp; -> &
    chunk_rows: int = 20_000  # CSV rows held in memory at a time (run-only: no recipe key)
    workers: int = 1  # processes parsing HTML pages; >1 pays on large folders with idle cores (run-only)
    slop: str = _default("slop")
    slop_builtin: bool = _default("slop_builtin")
    slop_phrases: tuple[str, ...] = _default("slop_phrases")
    slop_files: tuple[str, ...] = _default("slop_files")
    normalize: bool = _default("normalize")  # unicode NFC, whitespace, control characters
    dedup: bool = _default("dedup")  # exact duplicates on normalized text
    near_dedup: float | None = _default("near_dedup")  # Jaccard threshold for near-duplicates (MinHash)
    min_chars: int = _default("min_chars")
    max_chars: int | None = _default("max_chars")
    strict: bool = _default("strict")  # fail when any input row/document was unusable

    @classmethod
    def from_spec(cls, spec: DatasetSpec) -> "IngestOptions":
        """The options of a recipe `datasets:` entry whose `type` is a raw source type."""
        values = {f.name: as_option(f.name, getattr(spec, spec_name(f.name))) for f in fields(cls)
                  if f.name not in RUN_ONLY}
        return cls(**values).validate()

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
        """A hash of every option that changes the output (the schema's `ingest` fields), slop list files'
        contents included."""
        data = asdict(self)
        data = {name: data[name] for name in OUTPUT_OPTIONS}
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode())
        for path in self.slop_files:
            try:
                with open(path, "rb") as fh:
                    digest.update(fh.read())
            except OSError:
                digest.update(b"<missing>")
        return digest.hexdigest()


# The options whose value changes what an ingest run writes: exactly the DatasetSpec fields tagged `ingest`.
# (A DatasetSpec field without an option is left out here and named by tests/test_settings.py.)
_OPTION_OF = {spec_name(f.name): f.name for f in fields(IngestOptions)}
OUTPUT_OPTIONS = tuple(_OPTION_OF[name] for name in fields_affecting(DatasetSpec, INGEST) if name in _OPTION_OF)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def command_line_template(value: str | None) -> str | None:
    """A template typed on the command line: `\\n`, `\\t` and `\\\\` become the newline, tab and backslash a
    shell cannot pass (`--template "{title}\\n\\n{body}"`), as the same template in a recipe's YAML gives."""
    if value is None:
        return None
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], value)


def parse_map(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--map FIELD=COLUMN` items -> ((field, column), ...); a `{column}` template's escapes are decoded as
    --template's are. Raises DataError for a malformed item."""
    pairs = []
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise DataError(f"--map `{item}` is not FIELD=COLUMN, e.g. --map instruction=question")
        value = value.strip()
        pairs.append((name.strip(), command_line_template(value) if "{" in value else value))
    return tuple(pairs)
