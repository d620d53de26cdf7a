"""One ingest run: sources -> readers -> Cleaner -> OUT.jsonl + OUT.rejects.jsonl + OUT.report.json.

All three files are written to temporary files and renamed into place only at the end, so an interrupted
run never leaves a truncated JSONL that looks complete. Memory: one input unit at a time (an HTML page,
a CSV chunk of `chunk_rows` rows, one SQL statement, a fetch of 2,000 database rows) plus the dedup index.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from finetune.atomic import temp_file
from finetune.compat import disable_tqdm_monitor
from finetune.errors import DataError
from finetune.ingest.clean import Cleaner, Prepared
from finetune.ingest.locate import expand_sources
from finetune.ingest.options import IngestOptions
from finetune.ingest.report import INPUT_PROBLEMS, Accounting, Reject


class AtomicFile:
    """A text file written under a temporary name; `commit()` renames it into place, `discard()` removes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = temp_file(self.path)  # honours the umask, like any other tool's output
        self.fh = os.fdopen(fd, "w", encoding="utf-8")

    def write_json(self, obj: object) -> None:
        self.fh.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def commit(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        """Remove the temporary file if it was never committed (a no-op after commit)."""
        if not self.fh.closed:
            self.fh.close()
        Path(self.tmp).unlink(missing_ok=True)


def sidecar_paths(out: str | os.PathLike) -> tuple[Path, Path]:
    """OUT.rejects.jsonl and OUT.report.json beside OUT.jsonl."""
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(f"{stem}.rejects.jsonl"), out.with_name(f"{stem}.report.json")


def read_unit(kind: str, source: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    """The reader for one file / URL. Imports stay inside: pandas only when a CSV is read, and so on."""
    if kind == "html":
        from finetune.ingest.from_html import read_html as reader
    elif kind == "csv":
        from finetune.ingest.from_csv import read_csv as reader
    elif kind == "sql":
        from finetune.ingest.from_sql import read_sql_dump as reader
    elif kind == "sqlite":
        from finetune.ingest.from_db import read_sqlite as reader
    elif kind == "database":
        from finetune.ingest.from_db import read_database as reader
    else:
        from finetune.ingest.from_records import read_record_file as reader
    return reader(source, opts)


def _unit_items(units: list[tuple[str, str]], opts: IngestOptions):
    """(source, items) per unit, in order. Runs of HTML pages are parsed, and their records prepared
    (everything but dedup), in worker processes."""
    i = 0
    while i < len(units):
        kind, source = units[i]
        if kind != "html":
            yield source, read_unit(kind, source, opts)
            i += 1
            continue
        j = i
        while j < len(units) and units[j][0] == "html":
            j += 1
        from finetune.ingest.from_html import read_html_files

        yield from read_html_files([src for _, src in units[i:j]], opts, opts.workers, prepare_item)
        i = j


def _progress(total_units: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # No monitor thread: HTML workers are forked only from a single-threaded process (from_html.start_method).
    disable_tqdm_monitor(tqdm)
    return tqdm(total=None, unit=" rec", desc="ingest", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5, postfix={"files": f"0/{total_units}"})


def ingest(sources: list[str], out: str | os.PathLike, opts: IngestOptions, progress: bool = False) -> Accounting:
    """Run the whole stage. Raises DataError when nothing usable came out, or (strict) on any bad input."""
    opts.validate()
    acct = Accounting()
    units = expand_sources(sources, opts.type, acct.skipped)
    cleaner = Cleaner(opts)
    rejects_path, report_path = sidecar_paths(out)
    out_file, rejects_file = AtomicFile(out), AtomicFile(rejects_path)
    bar = _progress(len(units), progress and sys.stderr.isatty())
    try:
        for i, (source, items) in enumerate(_unit_items(units, opts), start=1):
            for item in items:
                _account(item, source, cleaner, acct, out_file, rejects_file)
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.set_postfix(files=f"{i}/{len(units)}")
        report = AtomicFile(report_path)
        report.fh.write(acct.to_json())
        report.commit()
        rejects_file.commit()  # kept even when the run fails below: it says what went wrong
        _verdict(acct, opts, report_path)
        out_file.commit()
    finally:
        out_file.discard()
        rejects_file.discard()
        if bar is not None:
            bar.close()
    return acct


def _account(item, source: str, cleaner: Cleaner, acct: Accounting, out_file: AtomicFile,
             rejects_file: AtomicFile) -> None:
    """Count one item in and write it out or to the rejects. `item` is a Reject, a (where, record) pair,
    or a record that an HTML worker process already prepared."""
    acct.count_in(source)
    if isinstance(item, Reject):
        acct.drop(source, item.reason)
        rejects_file.write_json(item.as_json())
        return
    prep = item if isinstance(item, Prepared) else cleaner.prepare(*item)
    cleaner.check_kind(prep)
    acct.slop_phrases.update(prep.phrases)
    verdict = prep.verdict or cleaner.admit(prep)
    if verdict is None:
        acct.slop_stripped += prep.stripped
        acct.keep(source)
        out_file.write_json(prep.record)
        return
    reason, detail = verdict
    acct.drop(source, reason)
    rejects_file.write_json(Reject(prep.where, reason, detail, raw=prep.raw).as_json())


_WORKER_CLEANERS: dict = {}  # per process, by options: each HTML worker builds its slop matcher once


def prepare_item(item, opts: IngestOptions):
    """The stateless cleaning of one reader item, run inside an HTML worker process."""
    if isinstance(item, Reject):
        return item
    if opts not in _WORKER_CLEANERS:
        _WORKER_CLEANERS[opts] = Cleaner(opts)
    return _WORKER_CLEANERS[opts].prepare(*item)


def _verdict(acct: Accounting, opts: IngestOptions, report_path: Path) -> None:
    if acct.records_out == 0:
        reasons = ", ".join(f"{n} {r}" for r, n in acct.dropped.most_common()) or "no input records"
        raise DataError(f"nothing usable came out: {acct.records_in} records in, all dropped ({reasons}); "
                        f"see {report_path} and the rejects file beside it")
    if opts.strict and acct.input_problems:
        bad = ", ".join(f"{n} {r}" for r, n in acct.dropped.most_common() if r in INPUT_PROBLEMS)
        raise DataError(f"strict mode: {acct.input_problems} input records were unusable ({bad}); see "
                        f"{report_path}, fix the input or drop --strict")
