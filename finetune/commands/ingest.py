"""Turn HTML / CSV / SQL / SQLite / database / record files into clean JSONL records, with a report.

Examples:
  finetune ingest site/ -o pages.jsonl
  finetune ingest faq.csv --map instruction=question --map output=answer -o faq.jsonl
  finetune ingest dump.sql.gz --table posts --template "{title}\\n\\n{body}" -o posts.jsonl
  finetune ingest synthetic.jsonl --slop strip -o clean.jsonl
"""

from __future__ import annotations

import argparse
import sys

from finetune.errors import DataError
from finetune.ingest.options import (
    HTML_MODES,
    PARALLEL_MIN_FILES,
    SLOP_MODES,
    SOURCE_TYPES,
    SQL_DIALECTS,
    IngestOptions,
    default_workers,
    parse_map,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2]
    parser.add_argument("sources", nargs="*", metavar="SOURCE",
                        help="files, folders, globs (quote them) or a database URL")
    parser.add_argument("-o", "--output", metavar="OUT.jsonl",
                        help="records file; OUT.report.json and OUT.rejects.jsonl are written beside it")
    parser.add_argument("--type", choices=SOURCE_TYPES, help="force the source type instead of inferring it")
    what = parser.add_argument_group("what becomes a record")
    what.add_argument("--map", action="append", metavar="FIELD=COLUMN",
                      help="record field from a column (or a {column} template; a CSS selector for HTML); "
                           "repeat: --map instruction=question --map output=answer")
    what.add_argument("--template", help='completion text from a template, e.g. "{title}\\n\\n{body}"')
    what.add_argument("--table", help="table to read from a SQL dump, SQLite file or database")
    what.add_argument("--query", help="read-only SELECT for a SQLite file or database URL")
    what.add_argument("--html-mode", choices=HTML_MODES, default="document",
                      help="one record per page, or one per heading section")
    what.add_argument("--split-level", type=int, default=2, help="sections: split at h1..hN (default 2)")
    fmt = parser.add_argument_group("input format")
    fmt.add_argument("--delimiter", help="CSV delimiter (default: comma; tab for .tsv)")
    fmt.add_argument("--encoding", help="input encoding (default: BOM, declared charset, then detection)")
    fmt.add_argument("--dialect", choices=SQL_DIALECTS, default="auto", help="SQL dump dialect")
    fmt.add_argument("--unescape-html", action="store_true", help="turn &amp; &lt; ... in cells into characters")
    fmt.add_argument("--chunk-rows", type=int, default=20_000, help="CSV rows held in memory at once")
    fmt.add_argument("--workers", type=int, default=None,
                     help="processes parsing HTML pages in parallel (default: one per CPU, at most 8; used "
                          f"for {PARALLEL_MIN_FILES} or more pages)")
    clean = parser.add_argument_group("cleaning")
    clean.add_argument("--slop", choices=SLOP_MODES, default="drop",
                       help="drop records with slop phrases, strip the offending sentences, or turn it off")
    clean.add_argument("--slop-phrases", action="append", default=[], metavar="FILE",
                       help="extra phrases, one a line (# comments)")
    clean.add_argument("--slop-phrase", action="append", default=[], metavar="TEXT", help="one extra phrase")
    clean.add_argument("--no-builtin-slop", action="store_true", help="use only your own phrase lists")
    clean.add_argument("--list-slop", action="store_true", help="print the built-in phrase list and exit")
    clean.add_argument("--no-dedup", action="store_true", help="keep exact duplicates")
    clean.add_argument("--near-dedup", type=float, metavar="JACCARD", help="drop near-duplicates, e.g. 0.85")
    clean.add_argument("--min-chars", type=int, default=1, help="drop records shorter than this")
    clean.add_argument("--max-chars", type=int, help="drop records longer than this")
    clean.add_argument("--no-normalize", action="store_true", help="keep unicode and whitespace as they are")
    parser.add_argument("--strict", action="store_true", help="exit 2 when any input row or page was unusable")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary table")


def options_from_args(args: argparse.Namespace) -> IngestOptions:
    return IngestOptions(
        type=args.type, mapping=parse_map(args.map), template=args.template, table=args.table,
        query=args.query, sql_dialect=args.dialect, html_mode=args.html_mode, html_split_level=args.split_level,
        delimiter=args.delimiter, encoding=args.encoding, unescape_html=args.unescape_html,
        chunk_rows=args.chunk_rows, workers=default_workers() if args.workers is None else args.workers, slop=args.slop, slop_builtin=not args.no_builtin_slop,
        slop_phrases=tuple(args.slop_phrase), slop_files=tuple(args.slop_phrases), normalize=not args.no_normalize,
        dedup=not args.no_dedup, near_dedup=args.near_dedup, min_chars=args.min_chars, max_chars=args.max_chars,
        strict=args.strict,
    ).validate()


def run(args: argparse.Namespace) -> int:
    if args.list_slop:
        from finetune.ingest.slop import DEFAULT_PHRASES

        print("\n".join(DEFAULT_PHRASES))
        return 0
    from finetune.ingest.pipeline import ingest, sidecar_paths
    from finetune.ingest.report import summary_table

    if not args.sources or not args.output:
        raise DataError("give at least one SOURCE and -o OUT.jsonl, e.g. finetune ingest pages/ -o pages.jsonl")
    opts = options_from_args(args)
    acct = ingest(args.sources, args.output, opts, progress=not args.quiet)
    if not args.quiet:
        rejects, report = sidecar_paths(args.output)
        print(summary_table(acct), file=sys.stderr)
        print(f"wrote {args.output} ({acct.records_out:,} records), {report} and {rejects}", file=sys.stderr)
    return 0
