"""Recipe integration: a `datasets:` entry with a raw source type becomes a cached JSONL records file.

    materialize(spec, cache_dir) -> cache_dir/ingested/<content-hash>.jsonl

The key hashes the bytes of every input file, their names relative to the source, and every option that
changes the output (mapping, cleaning, slop lists' contents...). An unchanged source is never re-ingested;
an edited one gets a new key. The report and rejects sit beside the records file. A live database
(`type: database`) has no file to hash, so it is read again on every call (written atomically in place).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from finetune.ingest.locate import expand_sources, is_url
from finetune.ingest.options import IngestOptions

INGEST_FORMAT = 3  # bump when a reader or the cleaner changes what it writes for the same input
log = logging.getLogger("finetune.ingest")


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
    _, report = sidecar_paths(out)
    if out.is_file() and report.is_file() and not is_url(spec.path):
        log.info("ingest: reusing %s for %s", out, spec.path)
        return out
    acct = ingest([spec.path], out, opts)
    dropped = ", ".join(f"{n} {reason}" for reason, n in acct.dropped.most_common()) or "none"
    log.info("ingest: %s -> %s: %d records in, %d out (dropped: %s); report %s",
             spec.path, out, acct.records_in, acct.records_out, dropped, report)
    return out
