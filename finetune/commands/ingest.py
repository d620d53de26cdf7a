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

from dataclasses import fields

from finetune.errors import DataError
from finetune.ingest.options import (
    HTML_MODES,
    PARALLEL_MIN_FILES,
    SLOP_MODES,
    SOURCE_TYPES,
    SQL_DIALECTS,
    IngestOptions,
    default_workers,
    command_line_template,
    parse_map,
)

# Every flag that sets an option stores into the option's own name (`dest`), with the option's default, which
# comes from the recipe schema (DatasetSpec): tests/test_settings.py fails when an option has no flag or a
# flag's default differs. Older spellings stay as aliases (--dialect, --split-level, --slop-phrases FILE).
DEFAULTS = {f.name: f.default for f in fields(IngestOptions)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2]
    parser.add_argument("sources", nargs="*", metavar="SOURCE",
                        help="files, folders, globs (quote them) or a database URL")
    parser.add_argument("-o", "--output", metavar="OUT.jsonl",
                        help="records file; OUT.report.json and OUT.rejects.jsonl are written beside it")
    parser.add_argument("--type", choices=SOURCE_TYPES, default=DEFAULTS["type"],
                        help="force the source type instead of inferring it")
    what = parser.add_argument_group("what becomes a record")
    what.add_argument("--map", dest="mapping", action="append", metavar="FIELD=COLUMN",
                      help="record field from a column (or a {column} template; a CSS selector for HTML); "
                           "repeat: --map instruction=question --map output=answer (recipe: map)")
    what.add_argument("--template", default=DEFAULTS["template"],
                      help='completion text from a template, e.g. "{title}\\n\\n{body}"')
    what.add_argument("--table", default=DEFAULTS["table"],
                      help="table to read from a SQL dump, SQLite file or database")
    what.add_argument("--query", default=DEFAULTS["query"], help="read-only SELECT for a SQLite file or database URL")
    what.add_argument("--html-mode", choices=HTML_MODES, default=DEFAULTS["html_mode"],
                      help="one record per page, or one per heading section")
    what.add_argument("--html-split-level", "--split-level", dest="html_split_level", type=int,
                      default=DEFAULTS["html_split_level"],
                      help=f"sections: split at h1..hN (default {DEFAULTS['html_split_level']})")
    fmt = parser.add_argument_group("input format")
    fmt.add_argument("--delimiter", default=DEFAULTS["delimiter"], help="CSV delimiter (default: comma; tab for .tsv)")
    fmt.add_argument("--encoding", default=DEFAULTS["encoding"],
                     help="input encoding (default: BOM, declared charset, then detection)")
    fmt.add_argument("--sql-dialect", "--dialect", dest="sql_dialect", choices=SQL_DIALECTS,
                     default=DEFAULTS["sql_dialect"], help="SQL dump dialect")
    fmt.add_argument("--unescape-html", action="store_true", default=DEFAULTS["unescape_html"],
                     help="turn &amp; &lt; ... in cells into characters")
    fmt.add_argument("--chunk-rows", type=int, default=DEFAULTS["chunk_rows"], help="CSV rows held in memory at once")
    fmt.add_argument("--workers", type=int, default=None,
                     help="processes parsing HTML pages in parallel (default: one per CPU, at most 8; used "
                          f"for {PARALLEL_MIN_FILES} or more pages)")
    clean = parser.add_argument_group("cleaning")
    clean.add_argument("--slop", choices=SLOP_MODES, default=DEFAULTS["slop"],
                       help="drop records with slop phrases, strip the offending sentences, or turn it off")
    clean.add_argument("--slop-file", "--slop-phrases", dest="slop_files", action="append", default=[],
                       metavar="FILE", help="extra phrases, one a line (# comments); repeatable (recipe: slop_file)")
    clean.add_argument("--slop-phrase", dest="slop_phrases", action="append", default=[], metavar="TEXT",
                       help="one extra phrase; repeatable")
    clean.add_argument("--no-builtin-slop", dest="slop_builtin", action="store_false",
                       default=DEFAULTS["slop_builtin"], help="use only your own phrase lists")
    clean.add_argument("--list-slop", action="store_true", help="print the built-in phrase list and exit")
    clean.add_argument("--no-dedup", dest="dedup", action="store_false", default=DEFAULTS["dedup"],
                       help="keep exact duplicates")
    clean.add_argument("--near-dedup", type=float, default=DEFAULTS["near_dedup"], metavar="JACCARD",
                       help="drop near-duplicates, e.g. 0.85")
    clean.add_argument("--min-chars", type=int, default=DEFAULTS["min_chars"], help="drop records shorter than this")
    clean.add_argument("--max-chars", type=int, default=DEFAULTS["max_chars"], help="drop records longer than this")
    clean.add_argument("--no-normalize", dest="normalize", action="store_false", default=DEFAULTS["normalize"],
                       help="keep unicode and whitespace as they are")
    parser.add_argument("--strict", action="store_true", default=DEFAULTS["strict"],
                        help="exit 2 when any input row or page was unusable")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary table")


def options_from_args(args: argparse.Namespace) -> IngestOptions:
    """Every option from the flag that stores into its name (lists become tuples, --map pairs are parsed)."""
    values = {name: getattr(args, name) for name in DEFAULTS}
    values["mapping"] = parse_map(values["mapping"])
    values["template"] = command_line_template(values["template"])
    values["workers"] = default_workers() if values["workers"] is None else values["workers"]
    values = {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}
    return IngestOptions(**values).validate()


def run(args: argparse.Namespace) -> int:
    if args.list_slop:
        from finetune.ingest.slop import DEFAULT_PATTERNS, DEFAULT_PHRASES

        print("\n".join(DEFAULT_PHRASES))
        print("# patterns (regular expressions over the lower-cased text), each counted under its label:")
        print("\n".join(f"# {label}: {regex}" for label, regex, *_ in DEFAULT_PATTERNS))
        return 0
    from finetune.ingest.pipeline import ingest, sidecar_paths
    from finetune.ingest.report import skipped_line, summary_table

    if not args.sources or not args.output:
        raise DataError("give at least one SOURCE and -o OUT.jsonl, e.g. finetune ingest pages/ -o pages.jsonl")
    opts = options_from_args(args)
    acct = ingest(args.sources, args.output, opts, progress=not args.quiet)
    rejects, report = sidecar_paths(args.output)
    if acct.skipped:  # even with --quiet: files the user named were left out
        print(skipped_line(acct, str(report)), file=sys.stderr)
    if not args.quiet:
        print(summary_table(acct), file=sys.stderr)
        print(f"wrote {args.output} ({acct.records_out:,} records), {report} and {rejects}", file=sys.stderr)
    return 0
