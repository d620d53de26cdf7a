"""CSV / TSV (optionally .gz / .bz2 / .xz / .zip) -> records, streamed in chunks of `chunk_rows` rows.

pandas' C parser reads every cell as a string (no type guessing, no NaN conversion); multi-line quoted
fields work as in any CSV. A row with more fields than the header is skipped by the parser and reported
as `ragged_row` with its line number; a row with fewer fields is padded with empty cells (as every CSV
reader does), so it is rejected as `empty_field` only when a required record field ends up empty.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

from finetune.errors import DataError
from finetune.ingest.locate import base_suffix
from finetune.ingest.mapping import build_mapper
from finetune.ingest.options import IngestOptions
from finetune.ingest.report import Reject
from finetune.ingest.textio import detect_encoding, looks_binary, read_sample

_BAD_LINE = re.compile(r"Skipping line (\d+): (.*)")


def csv_settings(path: str, opts: IngestOptions) -> tuple[str, str]:
    """(delimiter, encoding) from the options, else from the file name and a sample of its bytes."""
    sample = read_sample(path)
    if looks_binary(sample):
        raise DataError(f"`{path}` looks binary (it contains NUL bytes), not CSV text; check the file")
    delimiter = opts.delimiter or ("\t" if base_suffix(path) == ".tsv" else ",")
    if delimiter in ("\\t", "tab"):
        delimiter = "\t"
    encoding = opts.encoding or detect_encoding(sample)
    return delimiter, encoding


def _reader(path: str, delimiter: str, encoding: str, chunk_rows: int):
    import pandas as pd

    return pd.read_csv(path, sep=delimiter, encoding=encoding, dtype=str, keep_default_na=False,
                       na_filter=False, chunksize=chunk_rows, on_bad_lines="warn", engine="c",
                       compression="infer", skip_blank_lines=True)


def read_csv(path: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    import pandas as pd

    delimiter, encoding = csv_settings(path, opts)
    mapper = None
    row_no = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            reader = _reader(path, delimiter, encoding, opts.chunk_rows)
            for chunk in reader:
                if mapper is None:
                    columns = [str(c) for c in chunk.columns]
                    mapper = build_mapper(opts.mapping, opts.template, columns, f"`{path}`", opts.unescape_html)
                yield from _bad_lines(caught, path)
                for values in chunk.itertuples(index=False, name=None):
                    row_no += 1
                    yield _one_row(path, row_no, columns, values, mapper)
            yield from _bad_lines(caught, path)
        except pd.errors.EmptyDataError:
            raise DataError(f"`{path}` is empty: no header row and no data") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"`{path}` is not {encoding} text near row {row_no + 1} ({exc.reason}); "
                            "pass the right --encoding (recipe: `encoding:`)") from None
        except pd.errors.ParserError as exc:
            raise DataError(f"`{path}` cannot be parsed as CSV near row {row_no + 1}: {exc}; check the "
                            "delimiter (--delimiter) and unbalanced quotes") from None
        except (EOFError, OSError) as exc:
            raise DataError(f"`{path}` is truncated or unreadable near row {row_no + 1}: {exc}") from None
    if mapper is None:  # a header and no rows: the mapping is still checked
        raise DataError(f"`{path}` has a header but no data rows")


def _one_row(path: str, row_no: int, columns: list, values: tuple, mapper) -> tuple[str, dict] | Reject:
    where = f"{path} row {row_no}"
    row = dict(zip(columns, values))
    record, problem = mapper(row)
    if record is None:
        return Reject(where, "empty_field", problem, raw=row)
    return where, record


def _bad_lines(caught: list, path: str) -> Iterator[Reject]:
    for warning in caught:
        for line in str(warning.message).splitlines():
            match = _BAD_LINE.search(line)
            if match:
                yield Reject(f"{path} line {match.group(1)}", "ragged_row", match.group(2).strip())
    caught.clear()
