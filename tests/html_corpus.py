"""The HTML regression corpus (tests/assets/ingest/html_corpus): pages we wrote in the shapes real sites
have, what each page's main content is, and a slow, obviously-correct reference to measure word recall.

The reference is deliberately naive and independent of finetune's extraction: Python's own html.parser
(through beautifulsoup4, not lxml), the main element picked by a CSS selector written for each page, the
in-content chrome named per page removed, then `get_text(" ")`. Recall counts words as a multiset, so a
word that occurs twice in the page must occur twice in the output. Also used by benchmarks/bench_ingest.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

CORPUS = Path(__file__).parent / "assets" / "ingest" / "html_corpus"

# page -> (main element, chrome inside it that the reference removes, phrases that must not be output)
PAGES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "sphinx_api.html": ("div.body", ("a.headerlink",),
                        ("Quick search", "Show Source", "Created using", "Table of Contents", "¶")),
    "mkdocs_guide.html": ("article.md-content__inner", ("a.headerlink", "a.md-content__button", "aside"),
                          ("Skip to content", "On this page", "Deploying behind", "Made with Material",
                           "Last update", "Previous", "¶")),
    "docusaurus_doc.html": ("div.theme-doc-markdown", ("a.hash-link", "button"),
                            ("Skip to main content", "Introduction", "Edit this page", "On this page",
                             "Built with Docusaurus", "Copy", "\u200b")),
    "javadoc_class.html": ("main", (), ("JavaScript is disabled", "Overview", "Help", "Constr",
                                        "All rights reserved")),
    "wiki_article.html": ("main#content", (".mw-editsection", "#toc", ".navbox", ".vector-page-toolbar"),
                          ("Jump to content", "Main page", "Random article", "Creative Commons", "Privacy policy",
                           "Optimization algorithms", "Contents", "edit]", "Talk")),
    "blog_post.html": ("article.post", (".entry-footer",),
                       ("Skip to content", "Small experiments", "Archive", "Tomasz", "Great writeup",
                        "Leave a Reply", "Recent Posts", "Proudly powered", "Does LoRA rank matter", "Posted in")),
    "inline_prose.html": ("main", (), ("Field notes", "Essays", "All rights reserved")),
    "lists_tables.html": ("article", (), ("Trainbook is written", "Notes for people", "Popular", "Home ›")),
    # DocBook (PostgreSQL's manuals): navheader/navfooter tables; section ids made from titles hold chrome
    # words ("PLX-SHARING", "...-COMMENTS", "...-SHARE"); a titled sidebar box is part of the text
    "docbook_sharing.html": ("div.sect1", (), ("Prev", "Next", "Up", "Home", "Anonymous Blocks", "Chapter 12")),
    # publican (the Debian Administrator's Handbook): banner, docnav lists, sidebar boxes
    "publican_section.html": ("div.section", (), ("Download the ebook", "Prev", "Next", "Mirrors", "7. Keys",
                                                  "Administrator's Handbook")),
    # Sphinx (Python's docs): section ids "cookie-objects", "sharing-state-...", a `.. sidebar::` box,
    # footnotes in <aside>, headings that are links back to the local contents (toc-backref)
    "sphinx_sections.html": ("div.body", ("a.headerlink", "nav"),
                             ("Quick search", "Navigation", "3.11 Documentation", "Copyright", "¶")),
}
LINK_LIST_PAGES = ("index_links.html",)  # index pages of links only: rejected as low_text

_WORD = re.compile(r"\w+")
# HTML's phrasing (inline) elements that hold text
_INLINE = ("a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins",
           "kbd", "mark", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "time", "tt", "u", "var")
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.DOTALL | re.IGNORECASE)


def minified(html: str) -> str:
    """What HTML minifiers (collapse-whitespace mode) emit: every run of whitespace outside <pre> is
    one space, so the page is one line and no indentation is left to tell blocks apart."""
    parts = _PRE.split(html)
    return "".join(part if i % 2 else re.sub(r"\s+", " ", part) for i, part in enumerate(parts))


def reference_words(html: str, main: str, chrome: tuple[str, ...]) -> Counter:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    root = soup.select_one(main)
    for selector in chrome + ("script", "style", "svg"):
        for el in root.select(selector):
            el.decompose()
    # Inline elements do not break words ("mc<sup>2</sup>" is one word): unwrap them and merge the
    # strings they leave, so that get_text(" ") puts a space only where a block element ends.
    for el in root.find_all(_INLINE):
        el.unwrap()
    root.smooth()
    return Counter(_WORD.findall(root.get_text(" ")))


def word_recall(reference: Counter, text: str) -> float:
    """Share of the reference's words (counted with multiplicity) found in `text`."""
    found = reference & Counter(_WORD.findall(text))
    return sum(found.values()) / sum(reference.values())


def extract(html: str) -> str:
    """finetune's text for one page, exactly as `finetune ingest` produces it (before cleaning)."""
    import tempfile

    from finetune.ingest.from_html import read_html
    from finetune.ingest.options import IngestOptions

    with tempfile.NamedTemporaryFile("w", suffix=".html", encoding="utf-8", delete=False) as fh:
        fh.write(html)
    try:
        items = list(read_html(fh.name, IngestOptions(workers=1)))
    finally:
        Path(fh.name).unlink()
    return "\n\n".join(item[1]["text"] for item in items if isinstance(item, tuple))


def corpus_recall() -> dict[str, float]:
    """Word recall per page and variant ("sphinx_api.html minified"), plus "all": the pooled figure."""
    out, pooled_ref, pooled_found = {}, 0, 0.0
    for name, (main, chrome, _) in PAGES.items():
        page = (CORPUS / name).read_text(encoding="utf-8")
        for variant, html in (("pretty", page), ("minified", minified(page))):
            ref = reference_words(html, main, chrome)
            recall = word_recall(ref, extract(html))
            out[f"{name} {variant}"] = recall
            pooled_ref += sum(ref.values())
            pooled_found += recall * sum(ref.values())
    out["all"] = pooled_found / pooled_ref
    return out
