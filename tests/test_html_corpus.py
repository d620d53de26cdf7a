"""HTML extraction loses no word of the main content and keeps chrome out, on pages in the shapes real
sites have (Sphinx, MkDocs, Docusaurus, Javadoc, MediaWiki, a blog with comments, inline-heavy prose,
nested lists, definition lists, tables), each pretty-printed and minified. See tests/html_corpus.py."""

from __future__ import annotations

import json
import re

import pytest

from html_corpus import CORPUS, PAGES, extract, minified, reference_words, word_recall

from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths

VARIANTS = {"pretty": lambda html: html, "minified": minified}
DOCBOOK_PAGES = ("docbook_sharing.html", "publican_section.html")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", PAGES)
def test_every_word_of_the_main_content_survives_and_chrome_stays_out(name, variant):
    main, chrome, never = PAGES[name]
    html = VARIANTS[variant]((CORPUS / name).read_text(encoding="utf-8"))
    text = extract(html)
    ref = reference_words(html, main, chrome)
    assert sum(ref.values()) > 50  # the selector found the content: a recall over nothing proves nothing
    assert word_recall(ref, text) >= 0.995
    assert [phrase for phrase in never if phrase in text] == []


@pytest.mark.parametrize("name", PAGES)
def test_the_page_title_is_one_heading_without_a_permalink_sign(name):
    text = re.sub(r"```\n.*?\n```", "", extract((CORPUS / name).read_text(encoding="utf-8")), flags=re.DOTALL)
    level1 = re.findall(r"^# (.*)$", text, re.MULTILINE)
    if name in DOCBOOK_PAGES:  # the page's title is its h2, which opens the text; no level-1 heading is added
        title = re.search(r"<title>(.*?)</title>", (CORPUS / name).read_text(encoding="utf-8")).group(1)
        assert level1 == [] and text.startswith(f"## {title}\n"), text[:100]
    elif name == "javadoc_class.html":  # <title> "RingBuffer (ringlib 3.2 API)" is not the h1 "Class RingBuffer<E>"
        assert level1 == ["RingBuffer (ringlib 3.2 API)", "Class RingBuffer<E>"]
    else:
        assert len(level1) == 1, level1
    assert not re.search(r"[¶§#\u200b]$", "\n".join(re.findall(r"^#+ (.*)$", text, re.MULTILINE)), re.MULTILINE)


def test_sphinx_signature_and_source_lines_are_kept():
    text = extract((CORPUS / "sphinx_api.html").read_text(encoding="utf-8"))
    assert text.startswith("# tokenlib.codec — Encoders and decoders\n\nSource code: src/tokenlib/codec.py\n")
    assert "tokenlib.codec.encode(text, *, vocab=None, add_bos=True)" in text
    assert "Warning Decoding ids from a different vocabulary" in text


def test_a_cell_holding_a_list_keeps_its_words_apart():
    text = extract((CORPUS / "lists_tables.html").read_text(encoding="utf-8"))
    assert "H100 | 80 GB | yes | - FP8 capable - NVLink\n" in text  # was "FP8 capableNVLink"


def test_index_pages_of_links_are_rejected_as_low_text_and_counted(tmp_path):
    out = tmp_path / "site.jsonl"
    acct = ingest([str(CORPUS)], out, IngestOptions(workers=1))
    rejects_path, report_path = sidecar_paths(out)
    report = json.loads(report_path.read_text())
    assert report["dropped"] == {"low_text": 1} and acct.records_out == len(PAGES)
    (reject,) = [json.loads(line) for line in rejects_path.read_text().splitlines()]
    assert reject["where"].endswith("index_links.html") and "link text" in reject["detail"]


@pytest.mark.parametrize("title, h1, kept", [
    ("Install | Docs", "Install", False),
    ("Docs :: Install", "Install", False),
    ("Annual report 2023 — Acme", "Report", True),  # a word of the title is not the title
    ("Learning C# - Guide", "Learning C#", False),
])
def test_the_title_is_kept_unless_the_h1_is_one_of_its_segments(title, h1, kept):
    text = extract(f"<html><head><title>{title}</title></head><body><h1>{h1}</h1><p>Some words.</p></body></html>")
    assert text.startswith(f"# {title}\n\n# {h1}\n" if kept else f"# {h1}\n"), text
