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
import re
import sys
from collections import Counter
from pathlib import Path

from finetune.atomic import temp_file
from finetune.errors import DataError
from finetune.ingest import from_dataset
from finetune.ingest.images import ImageRejected, check_image
from finetune.ingest.record_images import PartProblem, Store, canonical_images, image_parts, image_store
from finetune.ingest.record_map import record_mapper, sharegpt_record
from finetune.ingest.preference import ImageSource
from finetune.ingest.records import PROMPT_SHAPE, SFT_SHAPES, checked_record, detect_shape, iter_json_objects

RECORDS_FORMAT = 2  # bump when the mapping changes what it writes for the same input (2: images, text parts joined)
JSON_SUFFIXES = (".jsonl", ".json")
COLUMNS_FROM = 1000  # JSONL records whose keys are a records file's fields, for checking a mapping up front
MAX_REJECTS = 10_000  # dropped records kept in the rejects file; past that, counted only


def plain_records_file(spec) -> bool:
    """A JSONL/JSON file read as it is, with no mapping, no hub options and no images: the data stage reads it
    directly. A file with images is read here, where each image is checked and a bad one is a counted reject."""
    p = Path(spec.path)
    return (p.suffix.lower() in JSON_SUFFIXES and not spec.map and not spec.roles
            and not (spec.model_fields_set & {"name", "split", "revision", "data_files"}) and not mentions_images(p))


IMAGE_KEY = re.compile(rb'(?<!\\)"image')  # a key or part type "image", "images", "image_url"; not an escaped quote


def mentions_images(path: Path) -> bool:
    """Whether a JSON/JSONL file may hold images: a `"image` anywhere in it (a byte scan, no parsing). A text
    that merely quotes the word is read here too, to the same records."""
    try:
        with open(path, "rb") as fh:
            tail = b""
            while block := fh.read(1 << 20):
                if IMAGE_KEY.search(tail + block):
                    return True
                tail = block[-8:]
    except OSError:
        return False
    return False


def _rows(spec, kind: str, revision: str | None, cache_dir: Path):
    """(column names, the columns typed as images, iterator of (where, row))."""
    if kind == "json":  # fields: those of the first records (JSONL has no schema; an optional field may be absent)
        items = iter_json_objects(spec.path)
        head = list(itertools.islice(items, COLUMNS_FROM))
        columns = list(dict.fromkeys(key for _, row in head if isinstance(row, dict) for key in row))
        return columns, [], itertools.chain(head, items)
    rows, image_columns = from_dataset.undecoded_images(
        from_dataset.load_rows(spec, kind, revision, str(cache_dir / "datasets")))
    return list(rows.column_names), image_columns, ((f"row {i}", row) for i, row in enumerate(rows, start=1))


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
    if kind == "json" and mentions_images(p):  # its relative image paths resolve against its folder: the same
        identity += f" in {p.absolute().parent}"  # content elsewhere names other images
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
    columns, image_columns, rows = _rows(spec, *source)
    mapper = record_mapper(spec.map, spec.roles, columns, spec.path)
    read = RowReader(spec, mapper, images_column(spec, columns, image_columns),
                     image_store(source[2] / "ingested" / "images"))
    dropped, first_drop, counts = Counter(), {}, Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(out)
    rejects: list[dict] = []
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            for where, row in rows:
                counts["read"] += 1
                record, reason, why = read(row, where)
                if record is None:
                    dropped[reason] += 1
                    first_drop.setdefault(reason, f"{where}: {why}")
                    if len(rejects) < MAX_REJECTS:
                        rejects.append({"where": f"{spec.path} {where}", "reason": reason, "detail": why,
                                        "record": printable(row)})
                    continue
                counts["mapped"] += 1
                counts["images"] += len(image_parts(record))
                fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        report = {"source": spec.path, "records_read": counts["read"], "records_mapped": counts["mapped"],
                  "images": counts["images"], "dropped": dict(dropped), "first_dropped": first_drop,
                  "rejects": str(rejects_path)}
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


def images_column(spec, columns: list[str], image_columns: list[str]) -> str | None:
    """The column holding a row's images: `map: {images: ...}`, else `images`, else the one column typed as
    images (a datasets Image feature, e.g. `image`)."""
    named = (spec.map or {}).get("images")
    if named:
        if columns and named not in columns:
            raise DataError(f"`{spec.path}`: the images column `{named}` (map: images) is not in the records; their "
                            f"fields are: {', '.join(columns[:20])}")
        return named
    if "images" in columns:
        return "images"
    return image_columns[0] if len(image_columns) == 1 else None


class RowReader:
    """One row -> (canonical record, "", "") or (None, the reject's reason, why)."""

    def __init__(self, spec, mapper, column: str | None, store: Store):
        self.spec, self.mapper, self.column, self.store = spec, mapper, column, store
        self.plain = not spec.map and not spec.roles  # records read as they are, sharegpt ones converted
        path = Path(spec.path).absolute()
        self.base_dir = path if path.is_dir() else path.parent  # relative image paths start here

    def __call__(self, row: object, where: str) -> tuple[dict | None, str, str]:
        record, why = self.mapper(row, where) if isinstance(row, dict) else (None, "not an object")
        if record is None:
            return None, "unmapped", why
        if self.plain and "conversations" in record and detect_shape(record) is None:  # as read_records does
            record, why = sharegpt_record(record, where, self.spec.path)
            if record is None:
                return None, "unmapped", why
        shape = self.spec.type if self.spec.type != "auto" else detect_shape(record)
        if shape is None:
            return None, "invalid_record", ("no record shape: no text, instruction/output, messages or chosen/rejected "
                                            "field")
        images = row.get(self.column) if self.column else record.get("images")
        if shape == PROMPT_SHAPE and images:
            raise DataError(f"`{self.spec.path}` {where}: a prompt record with images; GRPO does not read images (its "
                            "rollouts generate from text prompts). Images train with chat records (`method: sft`) "
                            "and preference records (`method: dpo`, ipo, orpo, simpo, kto: docs/vision.md)")
        try:
            if shape in SFT_SHAPES and (shape == "chat" or images is not None):
                record = canonical_images({k: v for k, v in record.items() if k != self.column}, images,
                                          self.base_dir, self.store)
            elif images is not None:  # a pair's prompt: its images placed (and stored) as a chat record's are
                record = {**{k: v for k, v in record.items() if k != self.column}, "images": images}
            record, why = checked_record(record, shape, ImageSource(self.base_dir, self.store))
            if record is None:
                return None, "invalid_record", why
            for part in image_parts(record):
                check_image(part)
        except ImageRejected as rejected:
            if rejected.reason == "image_url_offline":  # the whole dataset's way of giving images: one message
                raise DataError(f"`{self.spec.path}` {where}: {rejected.detail}") from None
            return None, rejected.reason, rejected.detail
        except PartProblem as problem:
            return None, "invalid_record", str(problem)
        return record, "", ""


def printable(value: object) -> object:
    """A row as the rejects file shows it: image bytes and PIL images as a short note, not their contents."""
    if isinstance(value, dict):
        return {k: printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value):,} bytes>"
    if type(value).__module__.startswith("PIL."):
        return f"<image {getattr(value, 'size', '')}>"
    return value


def _reasons(report: dict) -> str:
    return "; ".join(f"{n:,} {reason}, e.g. {report['first_dropped'][reason]}" for reason, n in report["dropped"].items())


def records_summary(report: dict, reused: bool) -> str:
    """What reading one records dataset kept and dropped, by reason."""
    line = (f"records {report['source']}{' (cached)' if reused else ''}: {report['records_read']:,} read, "
            f"{report['records_mapped']:,} mapped") + (f" ({report['images']:,} images)" if report.get("images") else "")
    total = sum(report["dropped"].values())
    return line + (f", {total:,} dropped ({_reasons(report)}); rejects: {report['rejects']}" if total else "")
