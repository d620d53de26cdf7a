"""HTML ingestion on pages shaped like the manuals Debian ships (issue 33 items 11-12): git's asciidoc
manpages, Apache httpd's hand-built XSLT pages, GLib's gtk-doc reference, Django's Sphinx docs.

Each fixture is a few lines written in the structure of the real page (the same elements, ids and
classes), not a copy of it. A chrome word in a generated id or class never removes a heading, a
signature, a table row or cell, a titled box or the element holding the page's text; the sites' language
bars, quick-view boxes, breadcrumbs and repeated site headings stay out; tables of contents and redirect
stubs are counted rejects. bench_manuals.py measures the same on the whole manuals."""

from __future__ import annotations

import json

import pytest

from html_corpus import extract

from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths

PROSE = "The sentence that follows is the text a reader came for, and every word of it has to stay in the record."

ASCIIDOC_MANPAGE = f"""<html><head><title>git-frob(1)</title></head><body class="manpage">
<div id="header">
<h1>git-frob(1) Manual Page</h1>
<h2>NAME</h2>
<div class="sectionbody"><p>git-frob - Frobnicate the index</p></div>
</div>
<div id="content">
<div class="sect1"><h2 id="_description">DESCRIPTION</h2><div class="sectionbody"><div class="paragraph"><p>{PROSE}</p>
</div>
<div class="sect2"><h3 id="_options_related_to_merging">Options related to merging</h3>
<div class="paragraph"><p>Merging options come here. {PROSE}</p></div></div>
<div class="sect2"><h3 id="_related_reading">Related Reading</h3>
<div class="ulist"><ul><li><p>the user manual, chapter three</p></li></ul></div></div>
</div></div>
<div class="sect1"><h2 id="_steps">STEPS</h2><div class="sectionbody">
<div class="olist arabic"><ol class="arabic"><li><p>Clone the repository.</p></li><li><p>Frob it.</p></li></ol></div>
<div class="olist"><ol start="4"><li><p>Push the result.</p></li></ol></div>
</div></div>
</div>
<div id="footnotes"><hr></div>
<div id="footer"><div id="footer-text">Last updated 2024-10-25 12:00:00 UTC</div></div>
</body></html>"""


def test_asciidoc_manpage_keeps_its_name_line_headings_with_chrome_words_and_list_numbers():
    text = extract(ASCIIDOC_MANPAGE)
    assert "git-frob - Frobnicate the index" in text  # the NAME line in div#header
    assert "## NAME" in text and "# git-frob(1) Manual Page" in text
    assert "### Options related to merging" in text and "### Related Reading" in text
    assert "- the user manual, chapter three" in text
    assert "1. Clone the repository.\n2. Frob it." in text
    assert "4. Push the result." in text  # <ol start="4">
    assert "Last updated" not in text


APACHE_PAGE = f"""<html><head><title>mod_frob - Apache HTTP Server Version 2.4</title></head><body>
<div id="page-header"><p class="menu"><a href="../mod/">Modules</a> | <a href="../glossary.html">Glossary</a></p>
<p class="apache">Apache HTTP Server Version 2.4</p></div>
<div id="path"><a href="https://www.apache.org/">Apache</a> &gt; <a href="https://httpd.apache.org/">HTTP Server</a>
&gt; <a href="../">Documentation</a> &gt; <a href="../index.html">Version 2.4</a> &gt; <a href="./">Modules</a></div>
<div id="page-content">
<div id="preamble"><h1>Apache Module mod_frob</h1>
<div class="toplang"><p><span>Available Languages: </span><a href="../en/">&nbsp;en&nbsp;</a> |
<a href="../fr/">&nbsp;fr&nbsp;</a> | <a href="../ja/">&nbsp;ja&nbsp;</a></p></div>
<p>{PROSE}</p></div>
<div id="quickview"><h3>Directives</h3><p>This module provides no directives.</p>
<h3 class="directives">Directives</h3><ul id="toc"><li><a href="#frob">FrobEngine</a></li></ul>
<h3>Bugfix checklist</h3><ul class="seealso"><li><a href="https://x/">httpd changelog</a></li></ul></div>
<div class="section"><h2 id="related">Related Modules and Directives</h2>
<table class="related"><tr><th>Related Modules</th><th>Related Directives</th></tr>
<tr><td><code>mod_alias</code></td><td><code>Alias</code></td></tr></table></div>
<div class="section"><h2 id="order">Order of Processing</h2><p>{PROSE}</p>
<table class="bordered"><tr class="header"><th>Name</th><th>Description</th></tr>
<tr><td>frob</td><td>turns the engine on</td></tr></table></div>
</div>
<div class="bottomlang"><p><span>Available Languages: </span><a href="../en/">&nbsp;en&nbsp;</a></p></div>
<div id="footer"><p class="apache">Copyright 2025 The Apache Software Foundation.</p></div>
</body></html>"""


def test_apache_page_keeps_header_rows_and_related_headings_without_language_bar_or_quickview():
    text = extract(APACHE_PAGE)
    assert "Name | Description\nfrob | turns the engine on" in text  # <tr class="header">
    assert "## Related Modules and Directives" in text and "Related Modules | Related Directives" in text
    for chrome in ("Available Languages", "Bugfix checklist", "httpd changelog", "provides no directives"):
        assert chrome not in text, chrome


GTKDOC_PAGE = f"""<html><head><title>Strings: GLib Reference Manual</title></head><body>
<table class="navigation" id="top" width="100%"><tr valign="middle"><td><a accesskey="h" href="index.html">
<img src="home.png" alt="Home"></a></td><td><a accesskey="n" href="next.html"><img alt="Next"></a></td></tr></table>
<div class="refentry"><div class="refnamediv"><table width="100%"><tr><td valign="top">
<h2><span class="refentrytitle"><a name="glib-Strings.top_of_page"></a>Strings</span></h2>
<p>Strings — text buffers which grow automatically as text is added</p></td>
<td class="gallery_image" valign="top" align="right"></td></tr></table></div>
<div class="refsect1"><h2>Description</h2><p>{PROSE}</p>
<div class="informalexample"><table class="listing_frame" border="0"><tbody><tr>
<td class="listing_lines" align="right"><pre>1
2
3</pre></td>
<td class="listing_code"><pre class="programlisting"><span class="n">GString</span> <span class="o">*</span>s;
s = g_string_new (<span class="s">"x"</span>);
  g_string_free (s, TRUE);</pre></td></tr></tbody></table></div>
</div></div></body></html>"""


def test_gtkdoc_listing_is_a_code_block_without_line_numbers_and_the_name_row_is_not_one_heading():
    text = extract(GTKDOC_PAGE)
    assert "```\nGString *s;\ns = g_string_new (\"x\");\n  g_string_free (s, TRUE);\n```" in text
    assert "1 2 3" not in text and "```\n1\n2\n3\n```" not in text
    assert "## Strings\n\nStrings — text buffers which grow automatically as text is added\n" in text
    assert " |" not in text  # no stray cell separator after the purpose


DJANGO_PAGE = f"""<html><head><title>Admin — Django 3.2.25 documentation</title></head><body>
<div class="document"><div id="custom-doc" class="yui-t6">
<div id="hd"><h1><a href="../index.html">Django 3.2.25 documentation</a></h1>
<div id="global-nav"><a href="../index.html">Home</a> | <a href="../genindex.html">Index</a></div>
<div class="nav">&laquo; <a href="prev.html">previous</a> | <a href="next.html">next</a> &raquo;</div></div>
<div id="bd"><div id="yui-main"><div class="yui-b"><div class="yui-g" id="ref-admin">
<div class="section" id="s-admin"><h1>The admin<a class="headerlink" href="#admin">¶</a></h1><p>{PROSE}</p>
<dl class="method"><dt id="django.contrib.admin.ModelAdmin.save_related">
<code class="descclassname">ModelAdmin.</code><code class="descname">save_related</code>(<em>request</em>, <em>form</em>)
</dt><dd><p>The save_related method is given the request and the form. {PROSE}</p></dd></dl>
<div class="admonition-geos-related-errors admonition"><p class="first admonition-title">GEOS-related errors</p>
<p class="last">Exceptions filling the log come from objects made at import time. {PROSE}</p></div>
<table class="docutils"><thead valign="bottom"><tr class="row-odd"><th class="head">Old setting</th>
<th class="head">New setting</th></tr></thead><tbody valign="top"><tr class="row-even"><td>DATABASE_NAME</td>
<td>NAME</td></tr></tbody></table>
</div></div></div></div>
<div class="yui-b" id="sidebar"><h2>Browse</h2><ul><li>Prev: <a href="prev.html">Previous page</a></li></ul></div>
</div></div></div></body></html>"""


def test_django_page_keeps_signatures_titled_notes_and_table_headers():
    text = extract(DJANGO_PAGE)
    assert "save_related(request, form)" in text.replace("`", "")
    assert "GEOS-related errors" in text and "Exceptions filling the log" in text
    assert "Old setting | New setting\nDATABASE_NAME | NAME" in text.replace("`", "")
    assert "Previous page" not in text


def test_a_manual_wrapped_in_one_element_named_like_chrome_keeps_its_text():
    """A single-page manual inside `<div id="top">` (no <main>): it holds all the text, so it is the text."""
    chapters = "".join(f"<h2>Chapter {n}</h2><p>{PROSE}</p>" for n in range(1, 6))
    html = f"<html><head><title>Manual</title></head><body><div id='top'><h1>The manual</h1>{chapters}</div></body></html>"
    text = extract(html)
    assert "## Chapter 5" in text and text.count(PROSE) == 5


def _site(folder, pages: dict[str, str]):
    for name, html in pages.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")


def _run(folder, out):
    ingest([str(folder)], out, IngestOptions(workers=1))
    rejects_path, _ = sidecar_paths(out)
    records = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    rejects = {json.loads(line)["where"].rsplit("/", 1)[-1]: json.loads(line)["reason"]
               for line in rejects_path.read_text().splitlines()}
    return records, rejects


WORDS = ("access control", "authentication", "caching", "content negotiation", "custom errors", "logging",
         "handlers", "filters", "environment variables", "expressions", "sockets", "upgrading")


def _apache_shaped(title: str, trail: str, n: int) -> str:
    return (f"<html><head><title>{title} - Apache HTTP Server Version 2.4</title></head><body><div id='page-header'>"
            f"<p class='apache'>Apache HTTP Server Version 2.4</p></div><div id='path'><a href='/'>Apache</a> &gt; "
            f"<a href='/s'>HTTP Server</a> &gt; <a href='/d'>Documentation</a> &gt; <a href='/v'>Version 2.4</a>"
            f"{trail}</div><div id='page-content'><h1>Apache Module {title}</h1><p>This page explains {WORDS[n]}. {PROSE}</p>"
            f"</div></body></html>")


@pytest.mark.parametrize("small_folder", ["ssl", "misc"])
def test_breadcrumbs_in_a_folder_of_few_pages_are_removed_by_the_sites_template(tmp_path, small_folder):
    pages = {f"page{n}.html": _apache_shaped(f"Topic {n}", "", n) for n in range(12)}
    pages.update({f"{small_folder}/p{n}.html": _apache_shaped(f"Sub {n}", " &gt; <a href='./'>Sub docs</a>", n)
                  for n in range(3)})
    _site(tmp_path / "site", pages)
    records, rejects = _run(tmp_path / "site", tmp_path / "out.jsonl")
    assert len(records) == 15 and rejects == {}
    for text in records:
        assert "Apache > HTTP Server" not in text and "Apache HTTP Server Version" not in text, text[:200]
        assert PROSE in text and text.startswith("# Apache Module ")  # the title minus the site name is in it


def test_sphinx_site_heading_repeated_on_every_page_is_template_but_a_pages_heading_is_not(tmp_path):
    pages = {}
    for n in range(10):
        html = DJANGO_PAGE.replace("The admin", f"Topic number {n}").replace("<p>", f"<p>It covers {WORDS[n]}. ", 1)
        pages[f"sub{n % 3}/page{n}.html"] = html
    _site(tmp_path / "site", pages)
    records, _ = _run(tmp_path / "site", tmp_path / "out.jsonl")
    assert len(records) == 10
    for text in records:
        assert "Django 3.2.25 documentation" not in text.split("\n\n", 1)[0] or text.startswith("# Admin"), text[:120]
        assert "# Django 3.2.25 documentation" not in text
        assert "# Topic number" in text


def test_a_chapter_toc_and_a_redirect_stub_are_counted_rejects(tmp_path):
    """Django's `ref/models/index.html`: a sentence and its chapter's pages (under `low_text`'s share)."""
    links = "".join(f"<li><a href='c{n}.html'>Chapter {n}: a longer link title for the chapter</a></li>"
                    for n in range(6))
    pages = {
        "toc.html": f"<html><body><h1>Models</h1><p>Model API reference. This part of the documentation covers the features of models.</p><ul>{links}</ul></body></html>",
        "moved.html": "<html><body><h1>Frequently Asked Questions</h1><p>The FAQ has been moved to the wiki.</p>"
                      "</body></html>",
        "refresh.html": "<html><head><meta http-equiv='refresh' content='0; URL=en/index.html'></head><body>"
                        "<table><tr><td><a href='da/'>da/</a></td></tr></table></body></html>",
        "content.html": f"<html><body><h1>Content</h1><p>{PROSE}</p></body></html>",
        # gtk-doc's part page: an intro and the part's table of contents (chrome: class "toc")
        "part.html": "<html><body><div class='part'><div class='titlepage'><h1 class='title'>Part V. Migrating</h1>"
                     "</div><div class='partintro'><p>This part describes what to change in older programs.</p>"
                     f"<div class='toc'><dl class='toc'>{links.replace('li>', 'dt>')}</dl></div></div></div>"
                     "</body></html>",
    }
    _site(tmp_path / "site", pages)
    records, rejects = _run(tmp_path / "site", tmp_path / "out.jsonl")
    assert len(records) == 1 and PROSE in records[0]
    assert rejects == {"toc.html": "toc_page", "moved.html": "redirect_stub", "refresh.html": "redirect_stub",
                       "part.html": "toc_page"}
