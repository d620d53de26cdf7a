"""Bytes to text: transparent decompression and charset handling (BOM, declared, detected)."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import zipfile

from finetune.errors import DataError

SAMPLE_BYTES = 1 << 16

# Browsers decode these labels as windows-1252 (WHATWG encoding standard); so do we, or curly quotes
# in "latin-1" pages become C1 control characters.
_WHATWG_ALIASES = {"iso-8859-1": "cp1252", "latin-1": "cp1252", "latin1": "cp1252", "ascii": "cp1252",
                   "us-ascii": "cp1252", "iso8859-1": "cp1252"}
_LATIN_CODEPAGES = frozenset({"cp1250", "cp1252", "cp1254", "cp1257", "iso8859-1", "iso8859-2", "iso8859-3",
                              "iso8859-4", "iso8859-9", "iso8859-10", "iso8859-13", "iso8859-14", "iso8859-15",
                              "iso8859-16", "latin-1", "mac-roman", "mac-latin2", "cp850", "cp437", "cp858"})
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def open_binary(path: str | os.PathLike):
    """A binary file object, decompressing .gz / .bz2 / .xz / single-member .zip on the fly."""
    name = str(path).lower()
    try:
        if name.endswith(".gz"):
            return gzip.open(path, "rb")
        if name.endswith(".bz2"):
            return bz2.open(path, "rb")
        if name.endswith(".xz"):
            return lzma.open(path, "rb")
        if name.endswith(".zip"):
            archive = zipfile.ZipFile(path)
            members = [m for m in archive.namelist() if not m.endswith("/")]
            if len(members) != 1:
                raise DataError(f"`{path}` holds {len(members)} files; a .zip source must hold exactly one")
            return archive.open(members[0])
        return open(path, "rb")
    except (OSError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot open `{path}`: {exc}") from None


def read_sample(path: str | os.PathLike, size: int = SAMPLE_BYTES) -> bytes:
    try:
        with open_binary(path) as fh:
            return fh.read(size)
    except (OSError, EOFError, zipfile.BadZipFile, lzma.LZMAError) as exc:
        raise DataError(f"`{path}` is truncated or not the compressed file its name says ({exc})") from None


def canonical_encoding(label: str) -> str | None:
    """Python's codec name for a charset label, None when unknown."""
    label = label.strip().strip("'\"").lower()
    label = _WHATWG_ALIASES.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return None


def bom_encoding(sample: bytes) -> str | None:
    for bom, name in _BOMS:
        if sample.startswith(bom):
            return name
    return None


def utf16_without_bom(sample: bytes) -> str | None:
    """"utf-16-le" / "utf-16-be" for BOM-less UTF-16 text (what some Windows tools export), else None.

    Text in a Latin or similar script has a NUL as the high byte of most characters, so NULs crowd one byte
    parity and are nearly absent from the other; a binary file's NULs fall on both."""
    head = sample[:8192]
    head = head[: len(head) - len(head) % 2]
    if len(head) < 8:
        return None
    even, odd = head[0::2].count(0), head[1::2].count(0)
    half = len(head) // 2
    for zeros, other, name in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if zeros >= 0.3 * half and other <= 0.01 * half and _decodes(head, name):
            return name
    return None


def looks_binary(sample: bytes) -> bool:
    """NUL bytes in text that is not UTF-16/32 (with or without BOM): an image, archive or database."""
    return b"\x00" in sample[:8192] and bom_encoding(sample) is None and utf16_without_bom(sample) is None


def _decodes(sample: bytes, encoding: str) -> bool:
    try:
        sample.decode(encoding)
        return True
    except UnicodeDecodeError as exc:
        # a sample cut mid-character fails only in its last few bytes
        return exc.start >= len(sample) - 4 and len(sample) >= SAMPLE_BYTES - 4
    except LookupError:
        return False


def detect_encoding(sample: bytes, declared: str | None = None) -> str:
    """BOM, then a declared charset that actually decodes, then UTF-8, then charset-normalizer's guess."""
    bom = bom_encoding(sample) or utf16_without_bom(sample)
    if bom:
        return bom
    if declared:
        name = canonical_encoding(declared)
        if name and _decodes(sample, name):
            return name
    if _decodes(sample, "utf-8"):
        return "utf-8"
    from charset_normalizer import from_bytes

    best = from_bytes(sample).best()
    guess = canonical_encoding(best.encoding) if best is not None else None
    # Short Western-European samples are often guessed as another single-byte Latin code page (cp1250,
    # iso8859-2...). Like browsers, prefer windows-1252 among those when it decodes cleanly; Cyrillic,
    # Greek, CJK... guesses are kept. --encoding overrides all of this.
    if guess is None or (guess in _LATIN_CODEPAGES and _decodes(sample, "cp1252")):
        return "cp1252" if _decodes(sample, "cp1252") else (guess or "latin-1")
    return guess


def open_text(path: str | os.PathLike, encoding: str | None = None) -> tuple[io.TextIOBase, str]:
    """A text stream over a (possibly compressed) file and the encoding used. Decode errors raise."""
    if encoding is None:
        sample = read_sample(path)
        if looks_binary(sample):
            raise DataError(f"`{path}` looks binary (it contains NUL bytes), not text")
        encoding = detect_encoding(sample)
    elif canonical_encoding(encoding) is None:
        raise DataError(f"unknown encoding `{encoding}`; use a Python codec name such as utf-8 or cp1252")
    return io.TextIOWrapper(open_binary(path), encoding=encoding, newline=""), encoding
