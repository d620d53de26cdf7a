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


def _folder_files(folder: str, forced: str | None, skipped: list) -> list[str]:
    """The files of `folder` (recursively; hidden files and folders such as .git aside) whose name says they
    hold the folder's type.

    The type is --type when given; else a folder holding HTML pages is a site, read as pages only (its
    .json, .js, .css, images are assets, not data); else every file of a known type is taken. What is
    left out is appended to `skipped` as (path, why)."""
    files = sorted(str(p) for p in Path(folder).rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    kinds = {path: infer_type(path) for path in files}
    wanted = forced or ("html" if "html" in kinds.values() else None)
    taken = []
    for path in files:
        kind = kinds[path]
        if (kind == wanted) if wanted else kind is not None:
            taken.append(path)
            continue
        suffix = base_suffix(path) or "no extension"
        skipped.append((path, f"not {wanted} ({suffix})" if wanted else f"unknown type ({suffix})"))
    if not taken:
        known = ", ".join(suffix for suffix, kind in SUFFIX_TYPES.items() if kind == wanted or not wanted)
        raise DataError(f"the folder `{folder}` holds no files named like {wanted or 'a known type'} ({known}, "
                        "compressed too: .gz, .bz2, .xz, .zst, .zip); check the folder or --type (recipe: `type:`)")
    return taken


def _expand_one(source: str, forced: str | None, skipped: list) -> list[tuple[str, str]]:
    if is_url(source):
        return [(forced or "database", source)]
    if any(ch in source for ch in "*?["):
        paths = sorted(p for p in glob.glob(os.path.expanduser(source), recursive=True) if os.path.isfile(p))
        if not paths:
            raise DataError(f"the pattern `{source}` matches no files; check the path and the quoting")
    elif os.path.isdir(source):
        paths = _folder_files(source, forced, skipped)
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


def expand_sources(sources: list[str], forced: str | None = None,
                   skipped: list | None = None) -> list[tuple[str, str]]:
    """(type, path or URL) for every input file, in a stable order. Raises DataError for missing inputs.
    Files a folder holds that are not of its type are appended to `skipped` as (path, why)."""
    units = []
    skipped = [] if skipped is None else skipped
    for source in sources:
        units.extend(_expand_one(str(source), forced, skipped))
    return units
