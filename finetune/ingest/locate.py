"""Where the input is and what it is: expand folders and globs, infer each file's source type."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from finetune.errors import DataError

COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zip", ".xz", ".zst")
SUFFIX_TYPES = {
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".csv": "csv",
    ".tsv": "csv",
    ".sql": "sql",
    ".db": "sqlite",
    ".sqlite": "sqlite",
    ".sqlite3": "sqlite",
    ".jsonl": "records",
    ".json": "records",
}


def is_url(source: str) -> bool:
    return "://" in source and not os.path.exists(source)


def base_suffix(path: str | os.PathLike) -> str:
    """The data suffix under any compression suffix: posts.csv.gz -> .csv."""
    name = Path(path).name.lower()
    for comp in COMPRESSION_SUFFIXES:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    return Path(name).suffix


def infer_type(source: str) -> str | None:
    if is_url(source):
        return "database"
    return SUFFIX_TYPES.get(base_suffix(source))


def _expand_one(source: str, forced: str | None) -> list[tuple[str, str]]:
    if is_url(source):
        return [(forced or "database", source)]
    if any(ch in source for ch in "*?["):
        paths = sorted(p for p in glob.glob(os.path.expanduser(source), recursive=True) if os.path.isfile(p))
        if not paths:
            raise DataError(f"the pattern `{source}` matches no files; check the path and the quoting")
    elif os.path.isdir(source):
        paths = sorted(str(p) for p in Path(source).rglob("*") if p.is_file() and not p.name.startswith("."))
        paths = [p for p in paths if (forced and base_suffix(p) != "") or infer_type(p)]
        if forced:
            paths = [p for p in paths if infer_type(p) in (forced, None)]
        if not paths:
            raise DataError(f"the folder `{source}` holds no files of a known type ({', '.join(SUFFIX_TYPES)})")
    elif os.path.isfile(source):
        paths = [source]
    else:
        raise DataError(f"no such file or folder: `{source}`; check the path")
    out = []
    for path in paths:
        kind = forced or infer_type(path)
        if kind is None:
            raise DataError(
                f"cannot tell what `{path}` holds from its name; force it with --type (recipe: `type:`) "
                "html, csv, sql, sqlite or records"
            )
        out.append((kind, path))
    return out


def expand_sources(sources: list[str], forced: str | None = None) -> list[tuple[str, str]]:
    """(type, path or URL) for every input file, in a stable order. Raises DataError for missing inputs."""
    units = []
    for source in sources:
        units.extend(_expand_one(str(source), forced))
    return units
