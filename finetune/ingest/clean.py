"""Cleaning: normalization, validation, slop filter, length bounds, exact and near-duplicate removal.

`Cleaner.apply(record)` returns the cleaned record, or a (reason, detail) for the rejects file. The slop
filter looks only at supervised text (completion `text`, instruction `output`, chat assistant turns):
a user asking "as an AI language model, what do you think..." is fine data; an answer saying it is not.
Preference and unpaired records are cleaned in their canonical form (finetune/ingest/preference.py); the slop
filter looks only at what they teach: a pair's chosen answer (a rejected answer full of slop is what
preference data should hold), an unpaired completion only when its label is true. A pair with an empty side
or two identical answers is rejected as `empty_side` / `identical_pair`.
Memory: the exact-dedup index keeps a 16-byte digest per kept record (about 100 bytes with set overhead);
near-dedup adds a 128-byte MinHash signature and 16 band keys per kept record (about 1.5 KB).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from finetune.errors import DataError
from finetune.ingest.near_dup import NearDuplicateIndex
from finetune.ingest.options import IngestOptions
from finetune.ingest.preference import PREFERENCE_SHAPES, RecordProblem, canonical, map_texts, sides_key, texts
from finetune.ingest.record_images import canonical_images, has_images
from finetune.ingest.records import a_shape, detect_shape, family, record_problem
from finetune.ingest.slop import SlopMatcher

# C0/C1 control characters except tab and newline, zero-width characters and the BOM.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200c\u200d\u2060\ufeff]")
_INLINE_SPACE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_LINES = re.compile("\n\n\n+")


def normalize_text(text: str) -> str:
    """NFC, \\r\\n -> \\n, no control or zero-width characters, single spaces, at most one blank line."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    # One scan for both character classes: most texts hold neither a control character nor an odd space
    odd = _CONTROL_OR_ODD.search(text) is not None
    if odd:
        text = _CONTROL.sub("", text)
    if "```" in text:  # keep code indentation: only tidy outside fenced blocks
        parts = text.split("```")
        parts[0::2] = [_tidy(p, strip=False, odd=odd) for p in parts[0::2]]
        return "```".join(parts).strip()
    return _tidy(text, strip=True, odd=odd)


def _tidy(text: str, strip: bool, odd: bool = True) -> str:
    # Each regex runs only when a C-level substring test says it has work: a pattern whose first
    # character is a space is tried at every space of the text, which made this the costliest step.
    # odd=False: the caller knows the text holds no tab or odd space.
    if "  " in text or odd and _ODD_SPACES.search(text) is not None:
        text = _INLINE_SPACE.sub(" ", text)
    if " \n" in text or "\t\n" in text:
        text = _TRAILING.sub("\n", text)
    if "\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text.strip() if strip else text


_ODD_SPACES = re.compile("[\t\u00a0\u2000-\u200a\u202f\u205f\u3000]")
# _CONTROL and _ODD_SPACES together
_CONTROL_OR_ODD = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u00a0\u2000-\u200d\u202f\u205f\u2060"
                             "\u3000\ufeff]")


def text_fields(record: dict, shape: str) -> list[str]:
    """Every string a record holds, in a fixed order."""
    if shape in PREFERENCE_SHAPES:
        return texts(record, shape)
    if shape == "completion":
        return [record["text"]]
    if shape == "instruction":
        return [record["instruction"], record.get("input") or "", record["output"]]
    return [m["content"] for m in record["messages"]]


def _map_supervised(record: dict, shape: str, fn) -> dict:
    """A copy of `record` with fn applied to its supervised strings (a preference record's taught ones)."""
    if shape in PREFERENCE_SHAPES:
        return map_texts(record, shape, fn, taught_only=True)
    if shape == "completion":
        return {**record, "text": fn(record["text"])}
    if shape == "instruction":
        return {**record, "output": fn(record["output"])}
    messages = [{**m, "content": fn(m["content"])} if m["role"] == "assistant" else m for m in record["messages"]]
    return {**record, "messages": messages}


def _map_all(record: dict, shape: str, fn) -> dict:
    if shape in PREFERENCE_SHAPES:
        return map_texts(record, shape, fn)
    if shape == "completion":
        return {**record, "text": fn(record["text"])}
    if shape == "instruction":
        out = {**record, "instruction": fn(record["instruction"]), "output": fn(record["output"])}
        if isinstance(record.get("input"), str):
            out["input"] = fn(record["input"])
        return out
    return {**record, "messages": [{**m, "content": fn(m["content"])} for m in record["messages"]]}


@dataclass
class Prepared:
    """A record after the stateless steps (validation, normalization, slop, length bounds).

    HTML worker processes prepare records in parallel; only `Cleaner.admit` (dedup) needs the one place
    that remembers what was kept."""

    where: str
    raw: object  # the record as read, for the rejects file
    record: dict | None  # cleaned; None when `verdict` rejected it
    shape: str | None
    verdict: tuple[str, str] | None  # (reason, detail)
    phrases: list[str] = field(default_factory=list)  # slop phrases found (dropped or stripped)
    stripped: int = 0  # sentences removed by slop: strip
    digest: bytes | None = None  # exact dedup's key (stateless, so made here: in the worker, for HTML)


class Cleaner:
    """Stateful (it remembers what it kept, for dedup); one per ingest run."""

    def __init__(self, opts: IngestOptions):
        self.opts = opts
        self.slop = SlopMatcher.build(opts.slop_builtin, opts.slop_phrases, opts.slop_files)
        self.seen: set[bytes] = set()
        self.near = NearDuplicateIndex(opts.near_dedup) if opts.near_dedup else None
        self.phrases_found: list[str] = []  # of the last apply()
        self.sentences_stripped = 0
        self.first_kind: tuple[str, str] | None = None  # (where, shape) of the first record of a known kind

    def apply(self, record: object) -> tuple[dict | None, tuple[str, str] | None]:
        """prepare() then admit(): the cleaned record or None, and the (reason, detail) of a rejection."""
        prep = self.prepare("", record)
        self.check_kind(prep)
        self.phrases_found, self.sentences_stripped = prep.phrases, prep.stripped
        verdict = prep.verdict or self.admit(prep)
        return (None, verdict) if verdict else (prep.record, None)

    def prepare(self, where: str, record: object) -> Prepared:
        """Every step that looks at this record alone; safe to run in any process."""
        shape = detect_shape(record) if isinstance(record, dict) else None
        try:
            cleaned = _validated(record, shape)
        except RecordProblem as problem:
            return Prepared(where, record, None, shape, (problem.reason, str(problem)))
        if self.opts.normalize:
            try:
                cleaned = _validated(_map_all(cleaned, shape, normalize_text), shape)
            except RecordProblem as problem:
                return Prepared(where, record, None, shape, (problem.reason, f"after normalization: {problem}"))
        cleaned, verdict, phrases, stripped = self._slop(cleaned, shape)
        if verdict is None:
            verdict = self._length(cleaned, shape)
        if verdict:
            return Prepared(where, record, None, shape, verdict, phrases, stripped)
        digest = _digest(self._dedup_text(cleaned, shape)) if self.opts.dedup else None
        return Prepared(where, record, cleaned, shape, None, phrases, stripped, digest)

    def check_kind(self, prep: Prepared) -> None:
        """One output holds one kind of record (supervised, preference or unpaired), as a record file must:
        DataError at the first record of another kind. A record too broken to have a kind does not count."""
        if prep.shape is None or (prep.verdict and prep.verdict[0] == "invalid_record"):
            return
        if self.first_kind is None:
            self.first_kind = (prep.where, prep.shape)
        elif family(prep.shape) != family(self.first_kind[1]):
            where, shape = self.first_kind
            raise DataError(f"{prep.where or 'a record'}: {a_shape(prep.shape)} record, but "
                            f"{where or 'an earlier record'} is {a_shape(shape)} record; one ingest output holds "
                            "supervised records (text, instruction, chat), preference pairs or unpaired (KTO) "
                            "records, not a mix: ingest each kind into its own file")

    def _length(self, record: dict, shape: str) -> tuple[str, str] | None:
        size = sum(len(t) for t in text_fields(record, shape))
        if size < self.opts.min_chars:
            return "too_short", f"{size} characters, under min_chars {self.opts.min_chars}"
        if self.opts.max_chars is not None and size > self.opts.max_chars:
            return "too_long", f"{size} characters, over max_chars {self.opts.max_chars}"
        return None

    def _slop(self, record: dict, shape: str) -> tuple[dict, tuple[str, str] | None, list[str], int]:
        """(record, verdict, phrases found, sentences stripped)."""
        if self.opts.slop == "off" or self.slop.regex is None:
            return record, None, [], 0
        if self.opts.slop == "drop":
            found = [p for text in _supervised(record, shape) for p in self.slop.find(text)]
            return record, (("slop", f'contains "{found[0]}"') if found else None), found, 0
        stripped: list[str] = []
        changed: list[str] = []  # the texts strip() rewrote: one without a phrase comes back as it was

        def strip(text: str) -> str:
            new, hits = self.slop.strip(text)
            stripped.extend(hits)
            if new is not text:
                changed.append(new)
            return new

        cleaned = _map_supervised(record, shape, strip)
        n_stripped = len(stripped)
        # Only a rewritten text can hold a phrase still (searching the others again doubled the filter's time)
        leftover = [p for text in changed for p in self.slop.find(text)]
        if leftover:  # a phrase spanning a sentence break: cannot strip it cleanly
            return cleaned, ("slop", f'"{leftover[0]}" spans sentences; cannot strip it cleanly'), \
                stripped + leftover, n_stripped
        problem = record_problem(cleaned, shape)
        if problem:
            return cleaned, ("slop", f"nothing left after stripping slop sentences ({problem})"), stripped, n_stripped
        return cleaned, None, stripped, n_stripped

    def admit(self, prep: Prepared) -> tuple[str, str] | None:
        """Dedup against the records kept so far (and remember this one): None, or why it is dropped."""
        if not (self.opts.dedup or self.near):
            return None
        if self.opts.dedup:
            digest = prep.digest or _digest(self._dedup_text(prep.record, prep.shape))
            if digest in self.seen:
                return "duplicate", "same normalized text as an earlier record"
            self.seen.add(digest)
        if self.near is not None:
            similar = self.near.check_and_add(self._dedup_text(prep.record, prep.shape))
            if similar is not None:
                return "near_duplicate", f"about {similar:.0%} similar to an earlier record"
        return None


    def _dedup_text(self, record: dict, shape: str) -> str:
        """The text dedup compares: each field's words, single-spaced and lower case."""
        fields = sides_key(record, shape) if shape in PREFERENCE_SHAPES else text_fields(record, shape)
        return "\x1f".join(self.slop.spaced_lower(t) for t in fields)  # str.split(): what \s matches, in C


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _validated(record: object, shape: str | None) -> dict:
    """The record to clean: a supervised record as it is, a preference record canonical. Raises RecordProblem."""
    if shape is None:
        raise RecordProblem("not a record: no text, instruction/output or messages, nor a preference record's "
                            "chosen/rejected or completion/label")
    if shape in PREFERENCE_SHAPES:
        return canonical(record, shape)
    problem = record_problem(record, shape)
    if problem:
        raise RecordProblem(problem)
    if shape == "chat" and any(isinstance(m["content"], list) for m in record["messages"]):
        if has_images(record):
            raise RecordProblem("a chat record with images: the cleaning steps (`type: records`) read text only; "
                                "list the file as a records dataset (`type: auto`), which reads and checks its images")
        record = canonical_images(record, None, Path("."))  # text parts joined into each message's string
    return record


def _supervised(record: dict, shape: str) -> list[str]:
    if shape in PREFERENCE_SHAPES:
        return texts(record, shape, taught_only=True)
    if shape == "completion":
        return [record["text"]]
    if shape == "instruction":
        return [record["output"]]
    return [m["content"] for m in record["messages"] if m["role"] == "assistant"]
