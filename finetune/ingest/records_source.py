"""Recipe integration for records datasets that are not a plain JSONL/JSON file of our field names: parquet and
arrow files, hub-shaped folders, save_to_disk folders, hub ids, and any records file with `map:` or `roles:`.
They become a cached JSONL file of canonical records, like a raw source:

    materialize_records(spec, cache_dir) -> cache_dir/ingested/records-<key>.jsonl (+ .report.json)

The key covers what identifies the data (the content hash of local files, the resolved commit of a hub id),
the mapping and the format version, so a changed source is never read from a stale copy. The report counts
what was read, mapped and dropped (by reason, with the first example of each) and is said on every run.
JSONL and JSON files are read by our line-numbered reader (finetune/ingest/records.py); every other form
goes through `datasets` (finetune/ingest/from_dataset.py).

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

from finetune.atomic import temp_file
from finetune.errors import DataError
from finetune.ingest import from_dataset
from finetune.ingest.record_map import record_mapper
from finetune.ingest.records import checked_record, detect_shape, iter_json_objects

RECORDS_FORMAT = 1  # bump when the mapping changes what it writes for the same input
JSON_SUFFIXES = (".jsonl", ".json")
COLUMNS_FROM = 1000  # JSONL records whose keys are a records file's fields, for checking a mapping up front
MAX_REJECTS = 10_000  # dropped records kept in the rejects file; past that, counted only


def plain_records_file(spec) -> bool:
    """A JSONL/JSON file read as it is, with no mapping and no hub options: the data stage reads it directly."""
    p = Path(spec.path)
    return (p.suffix.lower() in JSON_SUFFIXES and not spec.map and not spec.roles
            and not (spec.model_fields_set & {"name", "split", "revision", "data_files"}))


def _rows(spec, kind: str, revision: str | None, cache_dir: Path):
    """(column names, iterator of (where, row))."""
    if kind == "json":  # fields: those of the first records (JSONL has no schema; an optional field may be absent)
        items = iter_json_objects(spec.path)
        head = list(itertools.islice(items, COLUMNS_FROM))
        columns = list(dict.fromkeys(key for _, row in head if isinstance(row, dict) for key in row))
        return columns, itertools.chain(head, items)
    rows = from_dataset.load_rows(spec, kind, revision, str(cache_dir / "datasets"))
    return list(rows.column_names), ((f"row {i}", row) for i, row in enumerate(rows, start=1))


def records_key(spec, identity: str) -> str:
    blob = json.dumps({"format": RECORDS_FORMAT, "data": identity, "type": spec.type, "map": spec.map,
                       "roles": spec.roles}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def materialize_records(spec, cache_dir: str) -> Path:
    """The canonical records of one records dataset as a cached JSONL file; the report said on stderr."""
    p = Path(spec.path)
    kind = "json" if p.is_file() and p.suffix.lower() in JSON_SUFFIXES else from_dataset.source_kind(spec.path)
    from_dataset.check_options(spec, kind)
    revision = from_dataset.resolve_hub_revision(spec) if kind == "hub" else None
    identity = from_dataset.identity(spec, "file" if kind == "json" else kind, revision)
    out = Path(cache_dir) / "ingested" / f"records-{records_key(spec, identity)}.jsonl"
    rejects_path, report_path = out.with_suffix(".rejects.jsonl"), out.with_suffix(".report.json")
    reused = out.is_file() and report_path.is_file()
    if reused:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    else:
        report = _write(spec, (kind, revision, Path(cache_dir)), out, rejects_path, report_path)
    print(records_summary({**report, "source": spec.path}, reused), file=sys.stderr)  # the key is the content:
    # a report written for another recipe's path still counts this one's records
    return out


def _write(spec, source: tuple, out: Path, rejects_path: Path, report_path: Path) -> dict:
    """Map every row; the kept records to `out`, each dropped one to `rejects_path` with where and why."""
    columns, rows = _rows(spec, *source)
    mapper = record_mapper(spec.map, spec.roles, columns, spec.path)
    dropped, first_drop, counts = Counter(), {}, Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(out)
    rejects: list[dict] = []
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            for where, row in rows:
                counts["read"] += 1
                record, why = mapper(row, where) if isinstance(row, dict) else (None, "not an object")
                reason = "unmapped"
                if record is not None:
                    shape = spec.type if spec.type != "auto" else detect_shape(record)
                    record, why = (None, "no record shape: no text, instruction/output, messages or "
                                   "chosen/rejected field") if shape is None else checked_record(record, shape)
                    reason = "invalid_record"
                if record is None:
                    dropped[reason] += 1
                    first_drop.setdefault(reason, f"{where}: {why}")
                    if len(rejects) < MAX_REJECTS:
                        rejects.append({"where": f"{spec.path} {where}", "reason": reason, "detail": why, "record": row})
                    continue
                counts["mapped"] += 1
                fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        report = {"source": spec.path, "records_read": counts["read"], "records_mapped": counts["mapped"],
                  "dropped": dict(dropped), "first_dropped": first_drop, "rejects": str(rejects_path)}
        if not counts["mapped"]:
            raise DataError(f"`{spec.path}`: none of its {counts['read']:,} records could be used"
                            + (f" ({_reasons(report)})" if counts["read"] else "")
                            + "; check the dataset's `type:`, `map:` and `roles:` (docs/data-sources.md)")
        Path(tmp).replace(out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    rejects_path.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rejects),
                            encoding="utf-8")
    report_path.write_text(json.dumps(report, indent=2), encoding="utf-8")  # written last: marks completion
    return report


def _reasons(report: dict) -> str:
    return "; ".join(f"{n:,} {reason}, e.g. {report['first_dropped'][reason]}" for reason, n in report["dropped"].items())


def records_summary(report: dict, reused: bool) -> str:
    """What reading one records dataset kept and dropped, by reason."""
    line = (f"records {report['source']}{' (cached)' if reused else ''}: {report['records_read']:,} read, "
            f"{report['records_mapped']:,} mapped")
    total = sum(report["dropped"].values())
    return line + (f", {total:,} dropped ({_reasons(report)}); rejects: {report['rejects']}" if total else "")
