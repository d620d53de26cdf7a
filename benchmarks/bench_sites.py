"""HTML ingestion on real documentation sites: speed against the naive approach, and what is kept.

For each folder of pages (a real site, e.g. one unpacked from a Debian documentation package):

  speed   the whole `finetune ingest` stage in one process and with N worker processes, against the
          fastest naive extraction, `BeautifulSoup(html, "lxml").get_text()` of every page, in the same run
          (until issue 33 the baseline was html.parser, about twice as slow: ratios measured before then
          are against that slower baseline)
  recall  word recall of each page's main content (words counted with their multiplicity) against a
          reference extraction that knows the generator: Sphinx `div[role=main]`; DocBook's <body>
          without navheader / navfooter; publican's <body> without docnav, banner and title bar;
          SQLite's hand-written pages without the `.nosearch` menu and tagline and the footer line
  chrome  records still holding the site's navigation or template (Prev | Up | Home | Next, "Small.
          Fast. Reliable.", "This page last modified", Sphinx's "Quick search"...), against the naive text
  sections  records of `--html-mode sections`: how many, how many hold chrome, how many have fewer than 10
          words under their heading (short sections: "See Also", a one-line Synopsis, or navigation stubs)

Get the sites (Debian bookworm):
  apt-get download postgresql-doc-15 python3.11-doc sqlite3-doc debian-handbook
  for p in *.deb; do dpkg -x "$p" sites/; done
Run:
  python benchmarks/bench_sites.py sites/usr/share/doc/postgresql-doc-15/html \\
      sites/usr/share/doc/python3.11/html sites/usr/share/doc/sqlite3 \\
      sites/usr/share/doc/debian-handbook/html/en-US
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

# generator -> (reference main element, chrome inside it removed by the reference, phrases of chrome)
GENERATORS = {
    "sphinx": ("div[role=main]", ("a.headerlink",), ("Quick search", "Navigation", "© Copyright", "Show Source")),
    "docbook": ("body", (".navheader", ".navfooter"), (re.compile(r"\bPrev\W{0,9}Up\b"),
                                                        re.compile(r"\bHome\W{0,9}Next\b"))),
    "publican": ("body", ("ul.docnav", "#banner", "p#title"), ("Download the ebook", "Prev", "Next")),
    # the footer and the one-line notes that close every page of a folder (the site's template) are chrome
    "sqlite": ("body", (".nosearch", 'p:-soup-contains("This page last modified")',
                        'p:-soup-contains("A complete list of SQLite releases")',
                        'p:-soup-contains("See also lists of Objects, Constants")'),
               ("Small. Fast. Reliable", "This page last modified", "Choose any three")),
}
_WORD = re.compile(r"\w+")


def generator(html: str) -> str:
    head = html[:4000]
    if "publican" in head:
        return "publican"
    if "DocBook" in head:
        return "docbook"
    if 'role="main"' in html or "Sphinx" in html[-3000:]:
        return "sphinx"
    return "sqlite"


def pages_of(folder: str) -> list[str]:
    from finetune.ingest.locate import expand_sources

    return [src for kind, src in expand_sources([folder], "html", [])]


def chrome_lines(text: str, gen: str) -> bool:
    phrases = GENERATORS[gen][2]
    if gen == "publican":  # "Prev" / "Next" as whole lines: the words occur in prose too
        lines = text.split("\n")
        return "Download the ebook" in text or any(line.strip("- ") in phrases for line in lines) or any(
            line.startswith(("- Prev", "- Next")) for line in lines)
    return any(p.search(text) if isinstance(p, re.Pattern) else p in text for p in phrases)


def timed(*fns, repeat: int) -> list[float]:
    """Best wall time of each function, the functions run in alternation `repeat` times."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def quality(paths: list[str], gen: str) -> dict:
    """Recall and chrome of the reader's text (template removal included), page by page."""
    from html_corpus import reference_words

    from finetune.ingest.from_html import read_html_files
    from finetune.ingest.options import IngestOptions
    from finetune.ingest.report import Reject

    main, chrome, _ = GENERATORS[gen]
    ref_total = found_total = ref_kept = found_kept = 0
    rejects: Counter = Counter()
    chrome_records = naive_chrome = records = 0
    worst, unmeasured = (1.0, ""), 0
    for path, items in read_html_files(paths, IngestOptions(workers=1), 1):
        html = Path(path).read_text(encoding="utf-8", errors="replace")
        try:
            ref = reference_words(html, main, chrome)
        except (RecursionError, AttributeError):  # html.parser nests unclosed tags (SQLite's <li>s) past
            unmeasured += 1  # Python's stack; a page without the generator's main element (Sphinx's search page)
            continue
        texts = [item[1]["text"] for item in items if not isinstance(item, Reject)]
        rejects.update(item.reason for item in items if isinstance(item, Reject))
        found = sum((ref & Counter(_WORD.findall("\n".join(texts)))).values())
        ref_total, found_total = ref_total + sum(ref.values()), found_total + found
        if texts:
            records += len(texts)
            ref_kept, found_kept = ref_kept + sum(ref.values()), found_kept + found
            chrome_records += any(chrome_lines(t, gen) for t in texts)
            if sum(ref.values()) >= 50 and found / sum(ref.values()) < worst[0]:
                worst = (found / sum(ref.values()), Path(path).name)
        naive_chrome += chrome_lines(_naive(path), gen)
    stubs, sections, section_chrome = _section_stubs(paths, gen)
    return {"records": records, "rejects": dict(rejects), "recall_kept_pages": round(found_kept / ref_kept, 4),
            "recall_all_pages": round(found_total / ref_total, 4), "worst_page": (round(worst[0], 3), worst[1]),
            "records_with_chrome": chrome_records, "naive_pages_with_chrome": naive_chrome,
            "sections": sections, "section_stubs": stubs, "sections_with_chrome": section_chrome,
            "pages_without_reference": unmeasured}


def _section_stubs(paths: list[str], gen: str) -> tuple[int, int, int]:
    """(sections with under 10 words below their heading, sections, sections holding chrome)"""
    from finetune.ingest.from_html import read_html_files
    from finetune.ingest.options import IngestOptions
    from finetune.ingest.report import Reject

    stubs = total = chrome = 0
    for _, items in read_html_files(paths, IngestOptions(workers=1, html_mode="sections"), 1):
        for item in items:
            if isinstance(item, Reject):
                continue
            total += 1
            body = [line for line in item[1]["text"].split("\n") if line and not line.startswith("#")]
            stubs += len(" ".join(body).split()) < 10
            chrome += chrome_lines(item[1]["text"], gen)
    return stubs, total, chrome


def _naive(path: str) -> str:
    from bs4 import BeautifulSoup

    return BeautifulSoup(Path(path).read_text(encoding="utf-8", errors="replace"), "lxml").get_text()


def speed(folder: str, paths: list[str], workers: int, repeat: int) -> dict:
    from finetune.ingest.options import IngestOptions
    from finetune.ingest.pipeline import ingest

    with tempfile.TemporaryDirectory() as tmp:
        out1, outn = Path(tmp) / "one.jsonl", Path(tmp) / "many.jsonl"
        naive_s, one_s, many_s = timed(
            lambda: [_naive(p) for p in paths],
            lambda: ingest([folder], out1, IngestOptions(workers=1)),
            lambda: ingest([folder], outn, IngestOptions(workers=workers)),
            repeat=repeat)
        assert out1.read_bytes() == outn.read_bytes(), "worker processes changed the output"
    mb = sum(Path(p).stat().st_size for p in paths) / 1e6
    return {"MB": round(mb, 1), "naive_MBps": round(mb / naive_s, 2), "one_process_ratio": round(naive_s / one_s, 2),
            f"workers_{workers}_ratio": round(naive_s / many_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sites", nargs="+", help="folders of HTML pages, one site each")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="alternating timed repeats; the best counts")
    parser.add_argument("--no-speed", action="store_true", help="measure recall and chrome only")
    parser.add_argument("--speed-only", action="store_true", help="measure speed only (e.g. an older checkout)")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(20_000)  # the reference's html.parser tree of a page with thousands of unclosed <li>
    for folder in args.sites:
        paths = pages_of(folder)
        gen = Counter(generator(Path(p).read_text(encoding="utf-8", errors="replace")) for p in paths[:20])
        gen = gen.most_common(1)[0][0]
        res = {"site": folder, "generator": gen, "pages": len(paths)}
        if not args.speed_only:
            res.update(quality(paths, gen))
        if not args.no_speed:
            res.update(speed(folder, paths, args.workers, args.repeat))
        print(json.dumps(res, ensure_ascii=False))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
