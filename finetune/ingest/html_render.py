"""Render the pruned tree (finetune/ingest/html_text.py: prune_to_main) as light Markdown, in one walk: `#`
headings, `-` / `1.` list items, ``` fenced <pre> blocks, table rows as `a | b | c`, paragraphs separated by a
blank line. A `--map` CSS selection (beautifulsoup4 selects) goes through the same chrome rules and this renderer:
`render_fragment`.
"""

from __future__ import annotations

import re

from finetune.ingest.html_text import (HEADINGS, INLINE_TAGS, PAGE_CHROME_TAGS, SKIP_TAGS, _WS, _chrome_in, _drop,
                                       _text, _xpath)

BLOCK_TAGS = frozenset({"p", "div", "section", "article", "main", "blockquote", "figure", "figcaption", "dl",
                        "dt", "dd", "ul", "ol", "address", "details", "summary", "hr", "header", "footer",
                        "center", "table", "caption", "body", "html"})
# A permalink sign left at the end of a heading when its anchor carries no class we recognise
_PERMALINK_MARKS = "¶§\u200b\U0001f517"  # pilcrow, section sign, zero-width space, link emoji (not "#": C#)
_PARA = "\x00P"  # paragraph-break marker, resolved in _finish()
_BR = "\x00B"  # hard line break (<br>, list items, table rows); source newlines are just spaces


def render_tree(root, page_level: bool) -> str:
    """The text of `root` (the lxml tree `prune_to_main` left) as light Markdown."""
    out: list[str] = []
    _walk_tree(root, out, page_level)
    return _finish("".join(out))


def _walk_tree(node, out: list, page_level: bool) -> None:
    """`_walk` for lxml elements: an element's text comes first, each child's tail after the child."""
    if node.text:
        out.append(node.text)
    for child in node:
        name = child.tag
        if not isinstance(name, str) or name in SKIP_TAGS or (page_level and name in PAGE_CHROME_TAGS):
            pass  # a comment or processing instruction (prune_to_main removed them), or chrome
        elif name in HEADINGS:
            text = _WS.sub(" ", _text(child)).strip().rstrip(_PERMALINK_MARKS).rstrip()
            if text:
                out.append(f"{_PARA}{'#' * HEADINGS[name]} {text}{_PARA}")
        elif name == "pre":
            out.append(f"{_PARA}```\n{_text(child).strip(chr(10))}\n```{_PARA}")
        elif name == "br":
            out.append(_BR)
        elif name == "li":
            inner: list[str] = []
            _walk_tree(child, inner, page_level)
            out.append(_BR + _item_mark(node, child) + "".join(inner).replace(_PARA, " ").strip() + _BR)
        elif name == "tr":
            cells = [c for c in child if c.tag in ("td", "th")]
            if any(len(cell) and _xpath(_LAYOUT_CELL)(cell) for cell in cells):  # text-only cells: no XPath
                _layout_row(cells, out, page_level)
            else:
                out.append(_BR + " | ".join(_tree_cell_text(c, page_level) for c in cells) + _BR)
        elif name == "code":
            out.append(f"`{_text(child)}`")
        elif not len(child):  # a leaf (most <p>, <dt>, <td>): its text, without a call
            if child.text:
                out.append(f"{_PARA}{child.text}{_PARA}" if name in BLOCK_TAGS else child.text)
            elif name in BLOCK_TAGS:
                out.append(_PARA + _PARA)
        elif name in BLOCK_TAGS:
            out.append(_PARA)
            _walk_tree(child, out, page_level and name not in ("article", "main"))
            out.append(_PARA)
        else:
            _walk_tree(child, out, page_level)
        if child.tail:
            out.append(child.tail)


def _item_mark(parent, item) -> str:
    """"- " in a list, "3. " for the third item of an <ol> (its `start` counted: `prune_to_main` keeps it)."""
    if parent.tag != "ol":
        return "- "
    start = parent.get("start")
    number = int(start) if start and start.lstrip("-").isdigit() else 1
    for sibling in item.itersiblings(preceding=True):
        number += sibling.tag == "li"
    return f"{number}. "


# A table cell holding a heading or a code block is layout, not data: gtk-doc's name + purpose row
# (`<td><h2>Strings</h2><p>Strings — text buffers...</p></td><td></td>`), its program listings (a cell of
# line numbers beside a cell holding the <pre>).
_LAYOUT_CELL = "boolean(.//h1|.//h2|.//h3|.//h4|.//h5|.//h6|.//pre)"
_LINE_NUMBERS = re.compile(r"\s*\d+(?:\s+\d+)+\s*")


def _layout_row(cells: list, out: list, page_level: bool) -> None:
    """Each cell as a block of its own; empty cells and a cell of line numbers (beside code) left out."""
    for cell in cells:
        text = _text(cell)
        if not text.strip() or _LINE_NUMBERS.fullmatch(text):
            continue
        out.append(_PARA)
        _walk_tree(cell, out, page_level)
        out.append(_PARA)


def render_fragment(html: str) -> str:
    """The text of one element given as its own HTML (a `--map` CSS selection): chrome inside it removed by the
    rules `prune_to_main` applies (`_chrome_in`), then rendered by `render_tree`."""
    import lxml.html
    from lxml import etree

    try:
        root = lxml.html.fragment_fromstring(html)
    except (etree.ParserError, ValueError):
        return ""
    for el in _chrome_in(root, False):
        if el.getparent() is not None:
            _drop(el)
    etree.strip_tags(root, *INLINE_TAGS)
    return render_tree(root, False)


def _tree_cell_text(cell, page_level: bool) -> str:
    if not len(cell):
        return " ".join((cell.text or "").split())
    inner: list[str] = []
    _walk_tree(cell, inner, page_level)
    return " ".join("".join(inner).replace(_PARA, " ").replace(_BR, " ").split())


_FENCE = re.compile(r"(```\n.*?\n```)", re.DOTALL)
# After whitespace is collapsed, a run of markers is a paragraph break if it holds one, else a line break.
# Each pattern starts with a plain literal (not a repeated group), so the regex engine skips to candidates in C.
_BR_BEFORE_PARA = re.compile("\x00B(?:\x00B)*(?=\x00P)")
_PARA_RUN = re.compile("\x00P(?:\x00[PB])*")
_BR_RUN = re.compile("\x00B(?:\x00B)*")
_BLANK_LINES = re.compile("\n\n\n+")


def _finish(raw: str) -> str:
    """Collapse whitespace outside code fences; markers become a newline or a blank line.

    str.split/replace and constant-replacement regexes that start with a literal run in C: this step
    was a fifth of the per-page time when done with a per-match Python callback."""
    parts = _FENCE.split(raw)
    for i in range(0, len(parts), 2):
        parts[i] = _markers_to_breaks(_collapse_ws(parts[i]))
    return _BLANK_LINES.sub("\n\n", "".join(parts)).strip()


def _collapse_ws(text: str) -> str:
    """Runs of whitespace become one space (an edge keeps its space: it may touch a code fence)."""
    core = " ".join(text.split())
    if not core:
        return " " if text else ""
    return (" " if text[0].isspace() else "") + core + (" " if text[-1].isspace() else "")


def _markers_to_breaks(text: str) -> str:
    text = text.replace(" \x00", "\x00").replace("\x00P ", "\x00P").replace("\x00B ", "\x00B")
    return _BR_RUN.sub("\n", _PARA_RUN.sub("\n\n", _BR_BEFORE_PARA.sub("", text)))
