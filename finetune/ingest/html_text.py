"""HTML -> readable text: decode with the right charset, find the main content, drop chrome, keep structure.

One lxml parse: `prune_to_main` finds the main content and removes chrome from it in C (scripts, styles,
nav, header/footer outside the article, asides, forms, elements whose role, class or id says navigation,
banner, cookie notice, share bar..., unless the element holds the text: see `_chrome_in`); `render_tree`
(finetune/ingest/html_render.py) walks what is left once, into light Markdown. A `--map` CSS selection
(beautifulsoup4 selects) goes through the same rules and renderer: `render_fragment` there.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from finetune.ingest.textio import bom_encoding, canonical_encoding, detect_encoding, looks_binary

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_XML_DECL = re.compile(rb"""<\?xml[^>]+encoding\s*=\s*["']([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
# Removed before parsing: their content is never text, and skipping them here is cheaper than building
# their subtrees in Python objects only to throw them away.
_NEVER_TEXT = re.compile(r"<(script|style|noscript|template|svg)\b[^>]*>.*?</\1\s*>|<!--.*?-->",
                         re.IGNORECASE | re.DOTALL)

SKIP_TAGS = frozenset({"script", "style", "noscript", "template", "svg", "nav", "aside", "form", "iframe",
                       "button", "select", "input", "textarea", "canvas", "head", "object", "embed", "dialog",
                       "label", "menu"})
PAGE_CHROME_TAGS = frozenset({"header", "footer"})  # chrome at page level; inside an <article> a header is its title
CHROME_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar",
                          "dialog", "alert"})
_CHROME_WORDS = re.compile(
    r"(?:^|[\s_-])(nav|navbar|menu|breadcrumbs?|sidebar|footer|site-header|masthead|cookie|cookies|consent|"
    r"banner|share|sharing|social|related|comments|advert|ads|ad-slot|promo|newsletter|subscribe|skip-link|"
    r"pagination|toc-sidebar|popup|modal|tagline|"
    # DocBook's Prev | Up | Home | Next tables, publican's list of the same
    r"navheader|navfooter|docnav|"
    # heading permalinks: Sphinx/MkDocs "¶" (headerlink), Docusaurus (hash-link), MediaWiki "[edit]"
    r"headerlink|hash-link|anchorjs-link|editsection|"
    # a language switcher ("Available Languages: en | fr"), Apache's quick-view box (the page's table of
    # contents and see-also links beside the text)
    r"toplang|bottomlang|lang-?switcher|language-?switcher|quickview)(?:$|[\s_-])"
    # a page's own table of contents, named exactly so (Sphinx's heading links are `toc-backref`)
    r"|(?:^|\s)toc(?:$|\s)", re.IGNORECASE)
_TOC_NAME = re.compile(r"(?:^|\s)toc(?:$|\s)", re.IGNORECASE)
_PAGE_CHROME_WORDS = re.compile(r"^(header|top|topbar|head)$", re.IGNORECASE)  # id/class, outside articles
INLINE_TAGS = ("a", "span", "em", "strong", "b", "i", "u", "small", "sup", "sub", "abbr", "time", "mark", "font",
               "cite", "q", "s", "del", "ins", "bdi", "bdo", "wbr", "data", "var", "kbd", "samp", "dfn", "big", "tt")
_INLINE_BUT_LINKS = tuple(tag for tag in INLINE_TAGS if tag != "a")
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_XML_SPACE = " \t\r\n"  # what XPath normalize-space() counts as blank
_XML_RUN = re.compile("[ \t\r\n]+")
_WS = re.compile(r"[ \t\r\n\f\u00a0]+")


def decode_html(data: bytes, encoding: str | None = None) -> tuple[str, str]:
    """(text, encoding): a forced encoding, else BOM, else <meta charset> / XML declaration, else detection."""
    if encoding:
        return data.decode(encoding, errors="replace"), encoding
    declared = None
    head = data[:4096]
    if not bom_encoding(head):
        match = _META_CHARSET.search(head) or _XML_DECL.search(head)
        if match:
            declared = canonical_encoding(match.group(1).decode("ascii", "ignore"))
    chosen = detect_encoding(data, declared)
    return data.decode(chosen, errors="replace"), chosen


def is_binary(data: bytes) -> bool:
    return looks_binary(data)


def parse(text: str, prestrip: bool = True):
    from bs4 import BeautifulSoup

    return BeautifulSoup(_NEVER_TEXT.sub(" ", text) if prestrip else text, "lxml")


_XML_DECL_TEXT = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)
_NEVER_TEXT_TAGS = ("script", "style", "noscript", "template", "svg")
_MAIN_XPATH = "//main|//*[@role='main']"
_ROLE = re.compile("role", re.IGNORECASE)
_XPATHS: dict = {}  # compiled once per process: compiling an XPath costs as much as evaluating it here


def _xpath(expr: str, smart_strings: bool = False):
    """The compiled XPath; its strings are plain `str` unless `smart_strings` (text nodes that know their
    element: a Python object more each)."""
    key = (expr, smart_strings)
    if key not in _XPATHS:
        from lxml import etree

        _XPATHS[key] = etree.XPath(expr, smart_strings=smart_strings)
    return _XPATHS[key]


def _text(el) -> str:
    """`el`'s text, its descendants' included (lxml.html's `text_content()`, for plain lxml elements). An element
    with no child (an inline `<code>`, most headings) is its own text: no XPath call."""
    return _xpath("string()")(el) if len(el) else el.text or ""


def _drop(el) -> None:
    """Remove `el` and what it holds, keeping its tail text (lxml.html's `drop_tree()`)."""
    parent = el.getparent()
    if parent is None:
        return
    if el.tail:
        previous = el.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + el.tail
        else:
            parent.text = (parent.text or "") + el.tail
    parent.remove(el)


_PARSER: list = []  # one lxml HTML parser per process, with lxml's own element classes (no Python lookup)


def _html_parser():
    """The parser of the page's text as UTF-8 bytes: libxml2 reads them ~25% faster than a `str` (the same tree)."""
    if not _PARSER:
        from lxml import etree

        _PARSER.append(etree.HTMLParser(encoding="utf-8"))
    return _PARSER[0]


_WORD_CACHE: dict = {}  # class or id value -> (holds a chrome word, is a page-level chrome word)


def _chrome_words(value: str) -> tuple[bool, bool]:
    hit = _WORD_CACHE.get(value)
    if hit is None:
        if len(_WORD_CACHE) > 100_000:
            _WORD_CACHE.clear()
        hit = _WORD_CACHE[value] = (bool(_CHROME_WORDS.search(value)),
                                    any(map(_PAGE_CHROME_WORDS.match, value.split())))
    return hit


def _named_like_chrome(main, page_level: bool) -> list:
    """The elements under `main`, in document order, whose role or hidden attribute, class or id may say
    chrome (each distinct class and id value is tested once per process). One pass over the elements, most
    of which have no attribute at all: 3.6x faster on PostgreSQL's manual than the XPath that looked each
    element's class and id up in the page's matching values (libxml2 evaluates a predicate per node more
    slowly than lxml hands Python an element and its attributes). Code blocks' highlighting spans are gone
    by now (prune_to_main), so a Sphinx page is not a Python object per token."""
    found = []
    for el in main.iterdescendants():
        attrs = el.attrib
        if not attrs:
            continue
        if "role" in attrs or "hidden" in attrs or "aria-hidden" in attrs:
            found.append(el)
            continue
        value = attrs.get("class")
        if value is not None and _may_be_chrome(value, page_level):
            found.append(el)
            continue
        value = attrs.get("id")
        if value is not None and _may_be_chrome(value, page_level):
            found.append(el)
    return found


def _may_be_chrome(value: str, page_level: bool) -> bool:
    word, page_word = _chrome_words(value)
    return word or page_level and page_word


def _chrome_by_attrs(el, page_level: bool) -> str:
    """Why `el`'s attributes say chrome: "explicit" (role, hidden), "class" or "id" (a chrome word), "page"
    (`id="header"` outside an article), or ""."""
    attrs = el.attrib
    if attrs.get("role") in CHROME_ROLES or attrs.get("aria-hidden") == "true" or "hidden" in attrs:
        return "explicit"
    cls, ident = attrs.get("class", ""), attrs.get("id", "")
    if _CHROME_WORDS.search(cls):
        return "class"
    if page_level and (_PAGE_CHROME_WORDS.match(ident) or any(map(_PAGE_CHROME_WORDS.match, cls.split()))):
        return "page"
    return "id" if _CHROME_WORDS.search(ident) else ""


# An element that opens with one of these is a titled box or section: DocBook `titlepage` / `title`,
# docutils `sidebar-title` (Sphinx's `.. sidebar::`), or a heading.
_TITLE_CLASS = re.compile(r"(?:^|\s)(?:title|titlepage|sidebar-title|admonition-title|topic-title)(?:$|\s)")
_SIDEBAR_CLASS = re.compile(r"(?:^|\s)sidebar(?:$|\s)")
_FOOTNOTE_CLASS = re.compile(r"(?:^|\s)footnote(?:-list)?(?:$|\s)")
# A chrome-named element is a link list (navigation) when at least this share of its text is link text.
_LINK_LIST_SHARE = 0.5
_MIN_PROSE_CHARS = 40  # of text under a title: less is a masthead or a label, not a section
# A chrome-named element holding at least this share of the main content's text is the content's wrapper
_MOST_OF_THE_TEXT = 0.5


def _opening_title(el):
    """The heading or title markup `el` opens with (no text before it), else None."""
    if (el.text or "").strip(_XML_SPACE):
        return None
    for n, inner in enumerate(el.iterdescendants()):
        if inner.tag in HEADINGS or _TITLE_CLASS.search(inner.get("class") or ""):
            return inner
        if n > 12 or (inner.text or "").strip(_XML_SPACE) or (inner.tail or "").strip(_XML_SPACE):
            return None
    return None


def _chars(el) -> int:
    """Characters of `el`'s text, whitespace runs counted once (XPath's normalize-space)."""
    return int(_xpath("string-length(normalize-space())")(el))


def _link_chars(el) -> int:
    """Of which inside links: each link's text in Python (a link is mostly one text node), where an XPath call
    per link cost more than the measure (XPath's normalize-space collapses only " \t\r\n", as _XML_RUN)."""
    return sum(len(_XML_RUN.sub(" ", _text(a).strip(_XML_SPACE))) for a in el.iter("a"))


def _text_and_link_chars(el) -> tuple[int, int]:
    return _chars(el), _link_chars(el)


def _is_prose_section(el) -> bool:
    """A titled section or box of text, not a list of links nor a bare title (a masthead):
    `<div class="sect2" id="SQL-SYNTAX-COMMENTS">` (a generator makes ids from heading text), a DocBook /
    docutils sidebar box."""
    title = _opening_title(el)
    if title is None:
        return False
    chars, link_chars = _text_and_link_chars(el)
    return chars - _chars(title) >= _MIN_PROSE_CHARS and link_chars < _LINK_LIST_SHARE * chars


def _content_sidebar(el) -> bool:
    """`<aside class="sidebar">` / `<div class="sidebar">` holding a titled box of the text itself, or
    Sphinx's `<aside class="footnote">`: a footnote is part of the text."""
    cls = el.get("class") or ""
    return bool(_FOOTNOTE_CLASS.search(cls)) or bool(_SIDEBAR_CLASS.search(cls)) and _is_prose_section(el)


# Elements a chrome word in their own class or id never removes: generators derive ids from the text
# (`<h3 id="_related_reading">`, `<dt id="...ModelAdmin.save_related">`) and name table parts by their role
# (`<tr class="header">`, Sphinx's `<th class="head">`, Apache's `<table class="related">`). Chrome holding
# them goes as a whole; a whole table named `id="top"` outside any article is gtk-doc's navigation bar.
_KEPT_WHATEVER_THEIR_NAME = frozenset({*HEADINGS, "dt", "table", "tr", "td", "th", "thead", "tbody", "tfoot",
                                       "caption", "pre", "code"})


def _chrome_in(main, page_level: bool) -> list:
    """The elements of `main` to remove. Tags and roles are chrome whatever they hold; a chrome *word* in a
    class or id is a guess, so it never removes a heading, a signature, a table row or cell (above), an
    element that holds most of the page's text (a wrapper `<div class="page has-sidebar">`, a single-page
    manual inside `<div id="top">`), nor a titled box or section of prose (`<div class="sect1"
    id="PLPYTHON-SHARING">`, a note `<div class="admonition-geos-related-errors">`, an asciidoc manpage's
    `<div id="header">` holding its title and NAME line)."""
    doomed = []
    main_chars = None
    for el in main.iter(*SKIP_TAGS, *(PAGE_CHROME_TAGS if page_level else ())):
        if el.tag == "aside" and _content_sidebar(el):
            el.tag = "div"  # kept, and rendered as the block it is (the renderer skips <aside>)
        elif el.tag in PAGE_CHROME_TAGS:
            main_chars = _chars(main) if main_chars is None else main_chars
            if not _holds_most_text(el, main_chars):
                doomed.append(el)
        elif el is not main:
            doomed.append(el)
    for el in _named_like_chrome(main, page_level):
        why = _chrome_by_attrs(el, page_level)
        if not why:
            continue
        if el.tag in _KEPT_WHATEVER_THEIR_NAME and why != "explicit" and not (
                why == "page" and el.tag == "table"):
            continue
        if why == "page" and _is_document_head(el):
            continue
        if why in ("id", "page") and _is_prose_section(el) and not _named_for_its_role(el) or why == "class" and (
                _content_sidebar(el) or _named_after_its_title(el) and _is_prose_section(el)):
            continue
        if why == "class" and _TITLE_CLASS.search(el.get("class")):  # `sidebar-title`: its box decides
            continue
        if why != "explicit":
            main_chars = _chars(main) if main_chars is None else main_chars
            if _holds_most_text(el, main_chars):
                continue
        doomed.append(el)
    return doomed


def _named_after_its_title(el) -> bool:
    """Whether the chrome word in `el`'s class is in the title it opens with: a generator named the box
    after its title (Sphinx's `<div class="admonition-geos-related-errors admonition">` titled "GEOS-related
    errors"), where a theme's `<div class="comments-area">` titled "2 thoughts on ..." is named for its role."""
    title = _opening_title(el)
    word = _CHROME_WORDS.search(el.get("class") or "")
    return title is not None and word is not None and bool(word.group(1)) and (
        word.group(1).lower() in _text(title).lower())


def _named_for_its_role(el) -> bool:
    """An id that is the chrome word alone, not in the element's title: Apache's `<div id="quickview">`
    titled "Directives" (a generated id holds more: `PLPYTHON-SHARING`; Sphinx's section `id="comments"`
    is titled "Comments")."""
    ident = (el.get("id") or "").lower()
    word = _CHROME_WORDS.search(ident)
    if word is None or word.group(1) != ident:
        return False
    title = _opening_title(el)
    return title is None or ident not in _text(title).lower()


def _is_document_head(el) -> bool:
    """asciidoc's `<div id="header">`: the page's title, then a section heading ("NAME") with its text
    (git-show - Show various types of objects). A site's masthead has one heading, if any."""
    headings = [h for h in el.iter(*HEADINGS)]
    if len(headings) < 2:
        return False
    chars, link_chars = _text_and_link_chars(el)
    return chars > sum(_chars(h) for h in headings) and link_chars < _LINK_LIST_SHARE * chars


def _holds_most_text(el, main_chars: int) -> bool:
    chars, link_chars = _text_and_link_chars(el)
    return chars >= _MOST_OF_THE_TEXT * main_chars and link_chars < _LINK_LIST_SHARE * chars


class Pruned(NamedTuple):
    title: str
    main: object  # the main content's lxml element with chrome removed; None when the page has no body
    page_level: bool  # no <main>/<article>: the whole <body> is the content
    chars: int = 0  # characters of the main content's text, whitespace runs counted once (0: no links)
    link_chars: int = 0  # of which inside links: an index page is almost all links
    had_text: bool = False  # the main content held text before chrome was removed
    refresh: str = ""  # the target of `<meta http-equiv="refresh" content="0; URL=...">`: a redirect stub
    toc_chars: int = 0  # characters of the page's own table of contents (`class="toc"`), removed as chrome


def prune_to_main(text: str) -> Pruned:
    """The title and main-content element with chrome removed, using lxml alone (one parse: the page is
    rendered from this tree by `render_tree`; beautifulsoup4, which creates a Python object per node,
    only parses pages for `--map` selectors)."""
    from lxml import etree

    try:
        doc = etree.fromstring(_XML_DECL_TEXT.sub("", text, count=1).encode("utf-8"), _html_parser())
    except (etree.ParserError, etree.XMLSyntaxError, ValueError):
        return Pruned("", None, True)
    if doc is None:  # nothing but whitespace, or a comment
        return Pruned("", None, True)
    # Scripts, styles and comments go first, in C (their tails are text and stay); cheaper than a regex pass.
    etree.strip_elements(doc, *_NEVER_TEXT_TAGS, etree.Comment, etree.ProcessingInstruction, with_tail=False)
    # A code block's highlighting (a <span> per token: most of the elements of a Sphinx or gtk-doc page) is
    # no structure and no chrome: unwrapped in C first, so that every later pass visits a fraction of the
    # nodes. Links stay (they count as link text).
    for pre in doc.iter("pre"):
        if len(pre):  # most blocks hold text alone: nothing to unwrap
            etree.strip_tags(pre, *_INLINE_BUT_LINKS)
    refresh = ""
    for meta in doc.iter("meta"):  # ElementPath's `.//meta[@http-equiv]` runs in Python
        if meta.get("http-equiv", "").lower() == "refresh" and "url=" in meta.get("content", "").lower():
            refresh = meta.get("content").split("=", 1)[1].strip(" '\"") or "elsewhere"
    title_el = next(doc.iter("title"), None)
    title = _WS.sub(" ", _text(title_el)).strip() if title_el is not None else ""
    # `role="main"` means an XPath over every element; a page whose text never says "role" needs only <main>
    main = next(iter(_xpath(_MAIN_XPATH)(doc)), None) if _ROLE.search(text) else next(doc.iter("main"), None)
    if main is None:
        articles = doc.findall(".//article")
        main = articles[0] if len(articles) == 1 else doc.find("body")
    if main is None:
        return Pruned(title, None, True)
    page_level = main.tag == "body"
    had_text = any(text.strip(_XML_SPACE) for text in main.itertext())  # stops at the first text
    toc_chars = 0
    for el in _chrome_in(main, page_level):
        if el.getparent() is not None:
            if _TOC_NAME.search(el.get("class") or "") or _TOC_NAME.search(el.get("id") or ""):
                toc_chars += _chars(el)
            _drop(el)  # keeps the element's tail text
    # Measured before the links are unwrapped below, in C (a Python word count cost 15% of the page time);
    # the whole text only when there are links at all.
    link_chars = _link_chars(main)
    chars = _chars(main) if link_chars else 0
    # Inline formatting carries no structure we keep: unwrap it in C (text stays) so the walk visits fewer nodes.
    etree.strip_tags(main, *INLINE_TAGS)
    return Pruned(title, main, page_level, chars, link_chars, had_text, refresh, toc_chars)
