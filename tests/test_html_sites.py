"""HTML ingestion on pages shaped like real documentation sites (issue 25): PostgreSQL's DocBook manuals,
the publican-built Debian Administrator's Handbook, Python's Sphinx docs, SQLite's hand-written site.

No section is lost because its id or class holds a chrome word; the sites' navigation and template stay
out of the records, in `document` and `sections` mode; a page left with no main text is a counted reject.
The pages are in tests/assets/ingest/html_corpus (recall is measured in test_html_corpus.py)."""

from __future__ import annotations

import json
import re

import pytest

from html_corpus import CORPUS, extract

from finetune.ingest.from_html import read_html
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths


def _run(folder, out, **opts):
    """Ingest a folder; (records, rejects, report)."""
    ingest([str(folder)], out, IngestOptions(**opts))
    rejects_path, report_path = sidecar_paths(out)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    rejects = [json.loads(line) for line in rejects_path.read_text().splitlines()]
    return records, rejects, json.loads(report_path.read_text())


@pytest.mark.parametrize("name, kept", [
    # ids "PLX-SHARING" (the whole page), "PLX-SHARING-COMMENTS", "PLX-FOR-UPDATE-SHARE"; a DocBook sidebar
    ("docbook_sharing.html", ("## 12.3. Sharing Data Between Sessions", "The global dictionary `SD` keeps",
                              "### 12.3.1. Comments", "A comment starts with two dashes", "-- this is a line comment",
                              "### The Locking Clause", "locked for share can still be read",
                              "BACK TO BASICS Sessions and transactions", "a lock taken inside a transaction")),
    # a section id "sect.social-contract", a publican sidebar
    ("publican_section.html", ("### 6.1. The Social Contract", "the promise is why the bug tracker is public",
                               "TOOL A caching proxy", "gets it from the cache at local network speed")),
    # Sphinx ids "cookie-objects", "sharing-state-between-processes"; `.. sidebar::`; footnotes; toc-backref
    ("sphinx_sections.html", ("## Cookie Objects", "whose values are morsels", "## Sharing state between processes",
                              "Important\n\nThis page holds reference information only",
                              "Earlier versions raised an exception on a malformed pair")),
])
def test_sections_whose_id_or_class_holds_a_chrome_word_keep_their_text(name, kept):
    text = extract((CORPUS / name).read_text(encoding="utf-8"))
    assert [part for part in kept if part not in text] == []


@pytest.mark.parametrize("name", ["docbook_sharing.html", "publican_section.html"])
@pytest.mark.parametrize("mode", ["document", "sections"])
def test_docbook_navigation_stays_out_and_makes_no_record(tmp_path, name, mode):
    (tmp_path / name).write_text((CORPUS / name).read_text(encoding="utf-8"), encoding="utf-8")
    records, rejects, _ = _run(tmp_path, tmp_path / "out.jsonl", html_mode=mode, html_split_level=3, workers=1)
    sections = 3 if name.startswith("docbook") else 2  # at h2 and h3
    assert rejects == [] and len(records) == (1 if mode == "document" else sections)
    for record in records:
        assert not re.search(r"\b(Prev|Next|Up|Home)\b", record["text"]), record["text"]
        body = [line for line in record["text"].splitlines() if line and not line.startswith("#")]
        assert len(" ".join(body).split()) >= 20, record["text"]  # no navigation-only stub


def test_a_page_left_with_no_main_text_is_a_counted_reject_not_a_record(tmp_path):
    page = (CORPUS / "docbook_sharing.html").read_text(encoding="utf-8")
    # The same page with its section emptied: a title, and navigation around it
    title_end = "</h2></div></div></div>"
    start, end = page.index(title_end) + len(title_end), page.index('<div class="navfooter">')
    (tmp_path / "stub.html").write_text(page[:start] + "</div>" + page[end:], encoding="utf-8")
    (tmp_path / "full.html").write_text(page, encoding="utf-8")
    records, rejects, report = _run(tmp_path, tmp_path / "out.jsonl", workers=1)
    assert len(records) == 1 and report["dropped"] == {"no_main_text": 1}
    assert rejects[0]["where"].endswith("stub.html") and rejects[0]["reason"] == "no_main_text"


def test_hash_lines_in_code_blocks_do_not_cut_sections(tmp_path):
    page = tmp_path / "page.html"
    page.write_text((CORPUS / "sphinx_sections.html").read_text(encoding="utf-8"), encoding="utf-8")
    items = list(read_html(str(page), IngestOptions(html_mode="sections", workers=1)))
    texts = [text for _, record in items for text in [record["text"]]]
    assert not any("# a comment line" in text.split("\n", 1)[0] for text in texts)
    code = [text for text in texts if ">>> from http import cookies" in text]
    assert len(code) == 1 and "# another comment line\n>>> C[\"fig\"]" in code[0] and code[0].count("```") == 2


SQLITE_SHAPED = """<!DOCTYPE html>
<html><head><title>{title}</title></head>
<body>
<div class=nosearch>
<a href="index.html"><img class="logo" src="images/banner.gif" alt="Quarry"></a>
<div class="tagline desktoponly">Small. Fast. Reliable.<br>Choose any three.</div>
<div class="menu mainmenu"><ul><li><a href="index.html">Home</a><li><a href="about.html">About</a></ul></div>
</div>
<div class=fancy><div class=nosearch><div class="fancy_title">{title}</div></div>
<h1>1. Overview</h1>
<p>The {title} statement {body} It reads rows from the tables named in its clause and returns them
in the order the query asks for; the planner picks the indexes it uses.</p>
<p>This page last modified on 2021-03-04 is not a footer when it is a sentence in the text of page {n}.</p>
<p>Each clause of {title} is described below with the rules for the values it accepts.</p>
</div>
<p align="center"><small><i>This page last modified on <a href="https://example.org/docsrc">2022-{n:02d}-26 20:02:18</a>
UTC </i></small></p>
</body></html>
"""


STATEMENTS = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE TABLE", "DROP TABLE", "ALTER TABLE", "CREATE INDEX",
              "VACUUM", "ANALYZE")


def _sqlite_shaped_site(folder):
    folder.mkdir()
    for n, title in enumerate(STATEMENTS, start=1):
        html = SQLITE_SHAPED.format(title=title, n=n, body=f"is statement number {title.lower()} of the language.")
        (folder / f"lang_{n:02d}.html").write_text(html, encoding="utf-8")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sites_repeated_footer_and_tagline_are_removed_from_every_page(tmp_path, workers):
    _sqlite_shaped_site(tmp_path / "site")
    records, rejects, _ = _run(tmp_path / "site", tmp_path / "out.jsonl", workers=workers)
    assert len(records) == 10 and rejects == []
    for n, record in enumerate(records, start=1):
        text = record["text"]
        assert "Small. Fast." not in text and "Choose any three" not in text
        assert not text.rstrip().endswith("UTC"), text[-120:]  # the footer line is gone
        # the same words inside the text are the text, not the template
        sentence = "This page last modified on 2021-03-04 is not a footer when it is a sentence in the text"
        assert f"{sentence} of page {n}." in text
        assert text.rstrip().endswith("with the rules for the values it accepts."), text[-120:]


def test_a_wrapper_named_with_a_chrome_word_keeps_the_page_text_but_a_small_one_goes(tmp_path):
    """WordPress themes put "has-sidebar" on the wrapper of the whole page; a masthead is small."""
    prose = " ".join(f"Sentence {n} of the article says something about tuning the learning rate." for n in range(12))
    html = ("<html><head><title>Tuning</title></head><body>"
            "<div id='masthead' class='site-branding'><h1>Notes from the loss curve</h1></div>"
            f"<div id='page' class='site has-sidebar'><div class='content'><h2>Tuning</h2><p>{prose}</p></div>"
            "<div class='widget sidebar'><h3>Recent posts</h3><ul><li><a href='/a'>Older post one</a></li>"
            "<li><a href='/b'>Older post two</a></li></ul></div></div></body></html>")
    text = extract(html)
    assert prose in text and "## Tuning" in text
    assert "Recent posts" not in text and "Older post" not in text and "Notes from the loss curve" not in text
