"""A site's template: the lines every page of a site repeats at its top or bottom, outside any element a
chrome rule can name (SQLite's "Small. Fast. Reliable. Choose any three." tagline, its "This page last
modified on 2022-10-26 20:02:18 UTC" footer).

Learned for the whole site (all the pages of one ingest) and per folder, each from a sample of its pages
(a site's sections often differ: SQLite's release notes have a footer of their own, its C reference
another; a folder of a few pages, Apache's `ssl/`, has too few to learn from and gets the site's): a line
(digits ignored, so dates and version numbers match) that opens or closes at least half of them is the
template; a page's template is its site's and its folder's. A line that extends a template line after a
separator is template too: Apache's breadcrumb "Apache > HTTP Server > Documentation > Version 2.4 >
Modules" in `mod/` extends the site's. Headings are never template ("## Synopsis" opens most reference
pages), except a level-1 heading that opens most pages of the site before the page's own level-1 heading:
Sphinx's site name ("# Django 3.2.25 documentation"). Only a page's leading and trailing runs of template
lines are removed, never a line in the middle of its text; a page that is nothing but template is left
empty (the reader rejects it as `no_main_text`).
"""

from __future__ import annotations

import os
import re
from collections import Counter

TEMPLATE_SAMPLE = 40  # pages read to learn the template, spread evenly over the folder
TEMPLATE_MIN_PAGES = 8  # fewer pages than this: no template is learned
# Sampled pages' text is held until their turn to be written: past this many, later folders learn no template
MAX_SAMPLED_PAGES = 1000
TEMPLATE_SHARE = 0.5  # a line is the template when it opens or closes at least this share of the sample
MAX_TEMPLATE_SHARE_OF_PAGE = 0.5  # of the median sampled page's characters; more: no template
MIN_WORDS = 3  # in a template line
EDGE_LINES = 3  # the lines at each end of a page that may be template
_DIGITS = re.compile(r"\d+")
_FENCE_MARK = "```"
_NOT_TEMPLATE = (_FENCE_MARK, "#")  # a code fence; a heading ("## Synopsis" opens most reference pages)
SITE = ""  # the key of the site-wide sample and template (a folder's key is its path, never empty)
_EXTENSION = re.compile(r"\s*[>»/|:›·-]\s*\S")  # what follows a template line in a line that extends it
MAX_EXTENSION_CHARS = 60


def sample_indices(paths: list[str]) -> dict[str, list[int]]:
    """Folder (and SITE) -> the indices of its pages to learn from: all of a small folder, else
    TEMPLATE_SAMPLE spread evenly; no folder with fewer than TEMPLATE_MIN_PAGES pages. The site's sample
    is TEMPLATE_SAMPLE spread over all the pages, when the pages are in more than one folder."""
    folders: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        folders.setdefault(os.path.dirname(path) or ".", []).append(i)
    out, sampled = {}, 0
    groups = list(folders.items())
    if len(folders) > 1:
        groups.insert(0, (SITE, list(range(len(paths)))))
    for folder, indices in groups:
        if len(indices) < TEMPLATE_MIN_PAGES or sampled + TEMPLATE_SAMPLE > MAX_SAMPLED_PAGES:
            continue
        step = max(1.0, (len(indices) - 1) / (TEMPLATE_SAMPLE - 1))
        out[folder] = sorted({indices[round(k * step)] for k in range(min(len(indices), TEMPLATE_SAMPLE))})
        sampled += len(out[folder])
    return out


def template_for(templates: dict, path: str) -> frozenset:
    """The template of the page at `path`: its site's and its folder's."""
    return templates.get(SITE, frozenset()) | templates.get(os.path.dirname(path) or ".", frozenset())


def _key(line: str) -> str:
    return _DIGITS.sub("0", " ".join(line.split()))


def _edge_keys(body: str) -> set[str]:
    lines = [line for line in body.split("\n") if line.strip()]
    if len(lines) > 2 * EDGE_LINES:
        lines = lines[:EDGE_LINES] + lines[-EDGE_LINES:]
    edges = lines = [_key(line) for line in lines]  # only the edges are keyed: _key is a regex pass
    # A line of one or two words ("Note", "Footnotes", "Author:") is a label of the text, not a template
    keys = {line for line in edges if not line.startswith(_NOT_TEMPLATE) and line.count(" ") >= MIN_WORDS - 1}
    # A breadcrumb counts for each of its trails: "A > B > C > Modules" for "A > B > C" too, which every
    # folder's breadcrumb starts with
    keys.update(trail for line in list(keys) for trail in _trails(line) if trail.count(" ") >= MIN_WORDS - 1)
    if lines and _is_site_heading(lines[0], body):
        keys.add(lines[0])
    return keys


_SPACED_SEPARATOR = re.compile(r" (?:>|»|›|\||/) ")


def _trails(line: str) -> list[str]:
    return [line[:m.start()] for m in _SPACED_SEPARATOR.finditer(line)]


def _is_site_heading(first_line: str, body: str) -> bool:
    """A level-1 heading opening the page, with the page's own level-1 heading after it."""
    return first_line.startswith("# ") and "\n# " in body


_TITLE_SEPARATOR = re.compile(r"\s+[-—–|·:»]\s+")
_TITLE_KEY = "\x00title "  # a template key holding the site's name as its page titles end with it


def site_template(bodies: list[str], titles: list[str] = ()) -> frozenset:
    """The lines that open or close at least TEMPLATE_SHARE of `bodies` (none under TEMPLATE_MIN_PAGES), and
    the last segment of the `titles` when at least TEMPLATE_SHARE of them end with it (the site's name:
    "mod_alias - Apache HTTP Server Version 2.4"), which `page_title` removes."""
    if len(bodies) < TEMPLATE_MIN_PAGES:
        return frozenset()
    counts: Counter = Counter()
    for body in bodies:
        counts.update(_edge_keys(body))
    need = TEMPLATE_SHARE * len(bodies)
    template = frozenset(line for line, n in counts.items() if n >= need)
    ends = Counter(_title_end(title) for title in titles)
    ends.pop("", None)
    if ends and ends.most_common(1)[0][1] >= TEMPLATE_SHARE * len(titles):
        template |= {_TITLE_KEY + ends.most_common(1)[0][0]}
    # Pages that are copies of one page with a word changed share nearly all their lines: that is not a
    # template around the text but the text itself (dedup's business). A template is a small part of a page.
    removed = sorted(1 - len(strip_template(body, template)) / max(len(body), 1) for body in bodies)
    return template if removed[len(removed) // 2] <= MAX_TEMPLATE_SHARE_OF_PAGE else frozenset()


def _title_end(title: str) -> str:
    parts = _TITLE_SEPARATOR.split(title.strip())
    return _key(parts[-1]) if len(parts) > 1 else ""


def page_title(title: str, template: frozenset) -> str:
    """`title` without the site's name at its end ("mod_alias - Apache HTTP Server Version 2.4": mod_alias)."""
    end = _title_end(title)
    if end and _TITLE_KEY + end in template:
        cut = list(_TITLE_SEPARATOR.finditer(title.strip()))[-1]
        return title.strip()[:cut.start()]
    return title


def strip_template(body: str, template: frozenset) -> str:
    """`body` without its leading and trailing runs of template lines."""
    if not template:
        return body
    lines = body.split("\n")
    start, end = 0, len(lines)
    if lines[0].startswith("# ") and _key(lines[0]) in template and _is_site_heading(lines[0], body):
        start = 1
    while start < end and _removable(lines[start], template):
        start += 1
    while end > start and _removable(lines[end - 1], template):
        end -= 1
    if start == 0 and end == len(lines):
        return body
    return "\n".join(lines[start:end]).strip()


def _removable(line: str, template: frozenset) -> bool:
    if not line.strip():
        return True
    if line.startswith(_NOT_TEMPLATE):
        return False
    key = _key(line)
    return key in template or any(
        key.startswith(t) and len(key) - len(t) <= MAX_EXTENSION_CHARS and _EXTENSION.match(key, len(t))
        for t in template if not t.startswith(("#", _TITLE_KEY)))
