"""Cleaning: normalization, validation, slop filter, length bounds, exact and near-duplicate removal.

`Cleaner.apply(record)` returns the cleaned record, or a (reason, detail) for the rejects file. The slop
filter looks only at supervised text (completion `text`, instruction `output`, chat assistant turns):
a user asking "as an AI language model, what do you think..." is fine data; an answer saying it is not.
Memory: the exact-dedup index keeps a 16-byte digest per kept record (about 100 bytes with set overhead);
near-dedup adds a 128-byte MinHash signature and 16 band keys per kept record (about 1.5 KB).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from finetune.ingest.near_dup import NearDuplicateIndex
from finetune.ingest.options import IngestOptions
from finetune.ingest.records import detect_shape, record_problem
from finetune.ingest.slop import SlopMatcher

# C0/C1 control characters except tab and newline, zero-width characters and the BOM.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200c\u200d\u2060\ufeff]")
_INLINE_SPACE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_LINES = re.compile(r"\n{3,}")
_DEDUP_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFC, \\r\\n -> \\n, no control or zero-width characters, single spaces, at most one blank line."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    if "```" in text:  # keep code indentation: only tidy outside fenced blocks
        parts = text.split("```")
        parts[0::2] = [_tidy(p, strip=False) for p in parts[0::2]]
        return "```".join(parts).strip()
    return _tidy(text, strip=True)


def _tidy(text: str, strip: bool) -> str:
    text = _INLINE_SPACE.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip() if strip else text


def text_fields(record: dict, shape: str) -> list[str]:
    """Every string a record holds, in a fixed order."""
    if shape == "completion":
        return [record["text"]]
    if shape == "instruction":
        return [record["instruction"], record.get("input") or "", record["output"]]
    return [m["content"] for m in record["messages"]]


def _map_supervised(record: dict, shape: str, fn) -> dict:
    """A copy of `record` with fn applied to its supervised strings."""
    if shape == "completion":
        return {**record, "text": fn(record["text"])}
    if shape == "instruction":
        return {**record, "output": fn(record["output"])}
    messages = [{**m, "content": fn(m["content"])} if m["role"] == "assistant" else m for m in record["messages"]]
    return {**record, "messages": messages}


def _map_all(record: dict, shape: str, fn) -> dict:
    if shape == "completion":
        return {**record, "text": fn(record["text"])}
    if shape == "instruction":
        out = {**record, "instruction": fn(record["instruction"]), "output": fn(record["output"])}
        if isinstance(record.get("input"), str):
            out["input"] = fn(record["input"])
        return out
    return {**record, "messages": [{**m, "content": fn(m["content"])} for m in record["messages"]]}


class Cleaner:
    """Stateful (it remembers what it kept, for dedup); one per ingest run."""

    def __init__(self, opts: IngestOptions):
        self.opts = opts
        self.slop = SlopMatcher.build(opts.slop_builtin, opts.slop_phrases, opts.slop_files)
        self.seen: set[bytes] = set()
        self.near = NearDuplicateIndex(opts.near_dedup) if opts.near_dedup else None
        self.phrases_found: list[str] = []  # of the last apply(); the pipeline counts them
        self.sentences_stripped = 0

    def apply(self, record: object) -> tuple[dict | None, tuple[str, str] | None]:
        self.phrases_found = []
        self.sentences_stripped = 0
        shape = detect_shape(record) if isinstance(record, dict) else None
        problem = record_problem(record, shape) if shape else "not a record: no text, instruction/output or messages"
        if problem:
            return None, ("invalid_record", problem)
        if self.opts.normalize:
            record = _map_all(record, shape, normalize_text)
            problem = record_problem(record, shape)
            if problem:
                return None, ("invalid_record", f"after normalization: {problem}")
        record, verdict = self._slop(record, shape)
        if verdict:
            return None, verdict
        size = sum(len(t) for t in text_fields(record, shape))
        if size < self.opts.min_chars:
            return None, ("too_short", f"{size} characters, under min_chars {self.opts.min_chars}")
        if self.opts.max_chars is not None and size > self.opts.max_chars:
            return None, ("too_long", f"{size} characters, over max_chars {self.opts.max_chars}")
        return self._dedup(record, shape)

    def _slop(self, record: dict, shape: str) -> tuple[dict, tuple[str, str] | None]:
        if self.opts.slop == "off" or self.slop.regex is None:
            return record, None
        if self.opts.slop == "drop":
            for text in _supervised(record, shape):
                self.phrases_found += self.slop.find(text)
            if self.phrases_found:
                return record, ("slop", f'contains "{self.phrases_found[0]}"')
            return record, None
        stripped = []

        def strip(text: str) -> str:
            new, found = self.slop.strip(text)
            stripped.extend(found)
            return new

        cleaned = _map_supervised(record, shape, strip)
        self.phrases_found = stripped
        self.sentences_stripped = len(stripped)
        leftover = [p for text in _supervised(cleaned, shape) for p in self.slop.find(text)]
        if leftover:  # a phrase spanning a sentence break: cannot strip it cleanly
            self.phrases_found += leftover
            return cleaned, ("slop", f'"{leftover[0]}" spans sentences; cannot strip it cleanly')
        problem = record_problem(cleaned, shape)
        if problem:
            return cleaned, ("slop", f"nothing left after stripping slop sentences ({problem})")
        return cleaned, None

    def _dedup(self, record: dict, shape: str) -> tuple[dict | None, tuple[str, str] | None]:
        if not (self.opts.dedup or self.near):
            return record, None
        joined = "\x1f".join(_DEDUP_SPACE.sub(" ", t).strip().lower() for t in text_fields(record, shape))
        if self.opts.dedup:
            digest = hashlib.blake2b(joined.encode(), digest_size=16).digest()
            if digest in self.seen:
                return None, ("duplicate", "same normalized text as an earlier record")
            self.seen.add(digest)
        if self.near is not None:
            similar = self.near.check_and_add(joined)
            if similar is not None:
                return None, ("near_duplicate", f"about {similar:.0%} similar to an earlier record")
        return record, None


def _supervised(record: dict, shape: str) -> list[str]:
    if shape == "completion":
        return [record["text"]]
    if shape == "instruction":
        return [record["output"]]
    return [m["content"] for m in record["messages"] if m["role"] == "assistant"]
