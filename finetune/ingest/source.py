"""Recipe integration: a `datasets:` entry with a raw source type becomes a cached JSONL records file.

    materialize(spec, cache_dir) -> cache_dir/ingested/<content-hash>.jsonl

The key hashes the bytes of every input file, their names relative to the source, and every option that
changes the output (mapping, cleaning, slop lists' contents...). An unchanged source is never re-ingested;
an edited one gets a new key. The report and rejects sit beside the records file. A live database
(`type: database`) has no file to hash, so it is read again on every call (written atomically in place).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from finetune.ingest.locate import expand_sources, is_url
from finetune.ingest.options import IngestOptions

INGEST_FORMAT = 4  # bump when a reader or the cleaner changes what it writes for the same input


def options_from_spec(spec) -> IngestOptions:
    """IngestOptions from a recipe DatasetSpec whose `type` is a raw source type."""
    return IngestOptions.from_spec(spec)


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def source_key(path: str, opts: IngestOptions) -> str:
    """The content hash naming the ingested file: input bytes + names + options + format version."""
    digest = hashlib.sha256(f"ingest-format:{INGEST_FORMAT}\noptions:{opts.fingerprint()}\n".encode())
    if is_url(path):
        digest.update(f"url:{path}\n".encode())
        return "db-" + digest.hexdigest()[:24]
    base = path if os.path.isdir(path) else os.path.dirname(path)
    for kind, unit in expand_sources([path], opts.type):
        digest.update(f"{kind}:{os.path.relpath(unit, base)}:{_file_digest(unit)}\n".encode())
    return digest.hexdigest()[:24]


def materialize(spec, cache_dir: str) -> Path:
    """Ingest and clean a raw-source dataset (or reuse the cached result); the path of its JSONL records."""
    from finetune.ingest.pipeline import ingest, sidecar_paths

    opts = options_from_spec(spec)
    out = Path(cache_dir) / "ingested" / f"{source_key(spec.path, opts)}.jsonl"
    rejects, report = sidecar_paths(out)
    reused = out.is_file() and report.is_file() and not is_url(spec.path)
    if not reused:
        ingest([spec.path], out, opts)
    # Said every time, also when reused: a recipe user must see what ingestion dropped, not only a count
    # of the records that are left.
    counts = json.loads(report.read_text(encoding="utf-8"))
    print(ingest_summary(spec.path, counts, rejects, report, reused), file=sys.stderr)
    return out


def ingest_summary(source: str, report: dict, rejects: Path, report_path: Path, reused: bool) -> str:
    """What ingesting one recipe source kept and dropped, by reason, and where the rejects are."""
    lines = [f"ingest {source}{' (cached)' if reused else ''}: {report['records_in']:,} records in, "
             f"{report['records_out']:,} kept"]
    if report["dropped_total"]:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in report["dropped"].items())
        lines[0] += f", {report['dropped_total']:,} dropped ({reasons}); rejects: {rejects}"
    skipped = report.get("skipped_files", {}).get("total", 0)
    if skipped:
        by_reason = ", ".join(f"{n:,} {why}" for why, n in report["skipped_files"]["by_reason"].items())
        lines.append(f"  skipped {skipped:,} files that are not of the source's type ({by_reason}); see {report_path}")
    return "\n".join(lines)
