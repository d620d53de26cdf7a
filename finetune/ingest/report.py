"""Accounting: every candidate record is counted in, and leaves either as output or as a reject with a reason.

records_in == records_out + sum(dropped.values()), always; `check()` enforces it before a report is written.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

# Reasons that mean the *input* was broken (as opposed to cleaning drops the user asked for).
# `--strict` fails the run when any of these occur.
INPUT_PROBLEMS = frozenset(
    {
        "unreadable_file",
        "binary_file",
        "encoding_error",
        "empty_document",
        "ragged_row",
        "sql_syntax_error",
        "invalid_json",
        "invalid_record",
        "empty_field",
        "pair_mismatch",
        "empty_side",  # a preference record with a side missing or empty
        "identical_pair",  # a preference record whose chosen and rejected answers are the same
    }
)


SKIPPED_LISTED = 1000  # skipped files named one by one in the report; past that, only counted by reason


@dataclass
class Reject:
    """A candidate record that did not make it, with where it came from and why."""

    where: str  # "data/posts.csv row 12", "dump.sql line 40"
    reason: str  # a short snake_case key, counted in the report
    detail: str = ""  # one human sentence
    raw: object = None  # the row / record when there is one

    def as_json(self) -> dict:
        out = {"where": self.where, "reason": self.reason, "detail": self.detail}
        if self.raw is not None:
            out["record"] = self.raw
        return out


@dataclass
class Accounting:
    """Counts for one ingest run. `sources` maps each source to its own in/out counts."""

    records_in: int = 0
    records_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    slop_phrases: Counter = field(default_factory=Counter)
    slop_stripped: int = 0
    sources: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (path, why): files a folder held that are not its type

    def _source(self, source: str) -> dict:
        return self.sources.setdefault(source, {"in": 0, "out": 0, "dropped": 0})

    def count_in(self, source: str) -> None:
        self.records_in += 1
        self._source(source)["in"] += 1

    def keep(self, source: str) -> None:
        self.records_out += 1
        self._source(source)["out"] += 1

    def drop(self, source: str, reason: str) -> None:
        self.dropped[reason] += 1
        self._source(source)["dropped"] += 1

    @property
    def input_problems(self) -> int:
        return sum(n for reason, n in self.dropped.items() if reason in INPUT_PROBLEMS)

    def check(self) -> None:
        """The accounting identity. A violation is a bug in finetune, not a user mistake."""
        total = self.records_out + sum(self.dropped.values())
        if total != self.records_in:
            raise RuntimeError(f"ingest accounting is off: in={self.records_in} but out+dropped={total}")

    def as_dict(self) -> dict:
        self.check()
        return {
            "records_in": self.records_in,
            "records_out": self.records_out,
            "dropped": dict(sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
            "dropped_total": sum(self.dropped.values()),
            "slop_phrases": dict(self.slop_phrases.most_common()),
            "slop_sentences_stripped": self.slop_stripped,
            "sources": self.sources,
            "notes": self.notes,
            "skipped_files": {
                "total": len(self.skipped),
                "by_reason": dict(Counter(why for _, why in self.skipped).most_common()),
                "files": [{"path": path, "why": why} for path, why in self.skipped[:SKIPPED_LISTED]],
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"


def summary_table(acct: Accounting, top_phrases: int = 8) -> str:
    """A short on-screen table: in, out, and each drop reason with its count."""
    rows = [("records in", acct.records_in), ("records out", acct.records_out)]
    rows += [(f"dropped: {reason}", n) for reason, n in acct.dropped.most_common()]
    if acct.slop_stripped:
        rows.append(("slop sentences stripped", acct.slop_stripped))
    rows += [(f'  slop "{phrase}"', n) for phrase, n in acct.slop_phrases.most_common(top_phrases)]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.ljust(width)}  {n:>9,}" for label, n in rows]
    return "\n".join(lines)


def skipped_line(acct: Accounting, report_path: str) -> str:
    """One line saying which files were skipped and why, or "" when none were."""
    if not acct.skipped:
        return ""
    reasons = Counter(why for _, why in acct.skipped).most_common()
    shown = ", ".join(f"{n} {why}" for why, n in reasons[:6]) + (", ..." if len(reasons) > 6 else "")
    return f"skipped {len(acct.skipped):,} files that are not of the source's type: {shown}; listed in {report_path}"
