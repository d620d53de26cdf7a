"""HTML files -> records: one per page (`document`), one per heading section (`sections`), or fields
picked by CSS selectors (`map: {instruction: ".question h1", output: ".answer .body"}`), e.g. Q&A pages."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

from finetune.errors import DataError
from finetune.ingest.html_render import render_fragment, render_tree
from finetune.ingest.html_text import decode_html, is_binary, parse, prune_to_main
from finetune.ingest.mapping import mapping_shape, to_record
from finetune.ingest.options import PARALLEL_MIN_FILES, IngestOptions
from finetune.ingest.report import Reject
from finetune.ingest.site_template import page_title, sample_indices, site_template, strip_template, template_for
from finetune.ingest.textio import open_binary

# A page whose main content is at least this share link text (in characters) is an index, a sitemap or a
# table of contents: it teaches link titles, not prose. Content pages with many inline links stay under 0.2
# (the regression corpus: 0.04 to 0.18 with their navigation still in; its index page: 0.88).
LOW_TEXT_LINK_SHARE = 0.8
# A page at least half link text with little prose besides is a chapter's table of contents (Django's
# `ref/models/index.html`: a sentence and the list of the chapter's pages); measured on the Django, Apache,
# GLib and git manuals, content pages stay far above this much prose.
TOC_LINK_SHARE = 0.5
TOC_MAX_PROSE_CHARS = 300
# A stub that sends the reader elsewhere: `<meta http-equiv="refresh">`, or a few words saying the page moved
_MOVED = re.compile(r"\b(?:has|have|had|was|been) (?:been )?moved\b|\bredirect(?:ed|ing)? to\b", re.IGNORECASE)
STUB_MAX_WORDS = 40
MAX_HTML_BYTES = 64 << 20  # a single page larger than this is not a page; it is rejected, not parsed
_HEADING_LINE = re.compile(r"^(#{1,6}) ", re.MULTILINE)
_MAIN_TEXT = re.compile(r"^(?!#{1,6} )\S", re.MULTILINE)  # a line of text that is not a heading
_FENCE = re.compile(r"^```\n.*?\n```$", re.MULTILINE | re.DOTALL)
# The first level-1 heading, when at most 3 short lines (a byline, a breadcrumb) precede it
_FIRST_H1 = re.compile(r"(?:[^\n]{0,200}\n+){0,3}?# ([^\n]+)")


class Page(NamedTuple):
    """One page's text before it becomes records: the site template is not yet removed."""

    title: str
    body: str
    chars: int  # characters of the main content (0 when it holds no link)
    link_chars: int  # of which link text
    had_text: bool  # the main content held text before chrome was removed
    redirect: str = ""  # where a redirect stub sends the reader
    toc_chars: int = 0  # characters of its own table of contents, removed as chrome


def read_html(path: str, opts: IngestOptions, template: frozenset = frozenset()
              ) -> Iterator[tuple[str, dict] | Reject]:
    """The records of one page; `template` holds the site's repeated lines (`site_template`)."""
    page = read_page(path, opts)
    if isinstance(page, Page):
        yield from page_items(path, page, opts, template)
    else:
        yield from page


def read_page(path: str, opts: IngestOptions) -> Page | list:
    """The page's text, or the list of items to yield as they are (a reject, the records of --map)."""
    where = path
    try:
        with open_binary(path) as fh:
            data = fh.read(MAX_HTML_BYTES + 1)
    except (OSError, EOFError) as exc:
        return [Reject(where, "unreadable_file", f"cannot read it: {exc}")]
    if len(data) > MAX_HTML_BYTES:
        return [Reject(where, "unreadable_file", f"over {MAX_HTML_BYTES >> 20} MiB: not a web page")]
    if is_binary(data):
        return [Reject(where, "binary_file", "it contains NUL bytes: not HTML text")]
    text, _ = decode_html(data, opts.encoding)
    if opts.mapping:
        return list(_mapped(parse(text), where, opts))
    page = prune_to_main(text)
    body = render_tree(page.main, page.page_level) if page.main is not None else ""
    redirect = page.refresh
    # maxsplit: counting a page's words up to one past the limit, not all of them (3% of the CLI time)
    if not redirect and len(body.split(maxsplit=STUB_MAX_WORDS)) <= STUB_MAX_WORDS and _MOVED.search(body):
        redirect = "elsewhere"
    return Page(page.title, body, page.chars, page.link_chars, page.had_text, redirect, page.toc_chars)


def page_items(where: str, page: Page, opts: IngestOptions, template: frozenset = frozenset()
               ) -> Iterator[tuple[str, dict] | Reject]:
    body = strip_template(page.body, template)
    if page.redirect:
        yield Reject(where, "redirect_stub", f"it sends the reader on to {page.redirect!r}: a stub, not content")
        return
    if not _MAIN_TEXT.search(body):
        if page.had_text:
            yield Reject(where, "no_main_text", "nothing but headings, navigation or the site's template is "
                                                "left once chrome is removed")
        else:
            yield Reject(where, "empty_document", "no readable text in the page body")
        return
    if page.link_chars and page.link_chars >= LOW_TEXT_LINK_SHARE * page.chars:
        yield Reject(where, "low_text", f"{page.link_chars} of its {page.chars} characters are link text: an "
                                        "index or navigation page, not content")
        return
    prose = page.chars - page.link_chars
    # A DocBook / gtk-doc part or chapter page: its table of contents (removed as chrome) and an intro
    short = len(body) < TOC_MAX_PROSE_CHARS + 100  # the body holds headings too
    if page.toc_chars and short and page.toc_chars >= len(body) or (
            page.link_chars and page.link_chars >= TOC_LINK_SHARE * page.chars and prose < TOC_MAX_PROSE_CHARS):
        yield Reject(where, "toc_page", f"{max(page.link_chars, page.toc_chars)} characters of links or table "
                                        f"of contents and {len(body)} of text: a chapter's table of contents")
        return
    title = page_title(page.title, template)
    if opts.html_mode == "sections":
        yield from _sections(title, body, where, opts.html_split_level)
        return
    yield where, {"text": _with_title(title, body)}


def _with_title(title: str, body: str) -> str:
    """Keep the page title, unless the text already starts with it, or with an h1 the title holds:
    "json — JSON encoder — Python 3.12 documentation" over "# json — JSON encoder" adds only the site name.
    (Over a lower heading, "Café Müller – Über uns" over "## Über uns", the title says more: it stays.)"""
    if not title or title.lower() in body[: len(title) + 16].lower():
        return body
    first = _FIRST_H1.match(body)
    if first and _title_segment(first.group(1).strip().lower(), title.lower()):
        return body
    return f"# {title}\n\n{body}"


def _title_segment(heading: str, title: str) -> bool:
    """Whether `heading` is one end of `title` cut at a separator: "Install | Docs", "Docs - Install"."""
    sep = r"\s*[-—–|·:»]\s*"
    return bool(re.match(re.escape(heading) + sep, title) or re.search(sep + re.escape(heading) + "$", title))


def _sections(title: str, body: str, where: str, level: int) -> Iterator[tuple[str, dict] | Reject]:
    """Split at headings of `level` or higher; text before the first heading is its own section."""
    fences = [m.span() for m in _FENCE.finditer(body)]  # "# install it" in a shell block is no heading
    cuts = [m.start() for m in _HEADING_LINE.finditer(body)
            if len(m.group(1)) <= level and not any(a < m.start() < b for a, b in fences)]
    if not cuts or cuts[0] != 0:
        cuts.insert(0, 0)
    cuts.append(len(body))
    n = 0
    for start, end in zip(cuts, cuts[1:]):
        chunk = body[start:end].strip()
        if not chunk:
            continue
        lines = chunk.split("\n", 1)
        if len(lines) == 1 and _HEADING_LINE.match(chunk):
            continue  # a heading with no text under it
        n += 1
        yield f"{where} section {n}", {"text": _with_title(title, chunk)}


def _select(soup, selector: str, where: str) -> list[str]:
    try:
        found = soup.select(selector)
    except Exception as exc:  # soupsieve raises its own SelectorSyntaxError
        raise DataError(f"CSS selector {selector!r} is not valid ({exc}); fix it in --map / `map:`") from None
    out = []
    for tag in found:
        out.append(render_fragment(str(tag)))
    return out


def _mapped(soup, where: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    """Fields from CSS selectors. Each selector may match once (shared by every record) or N times."""
    fields = [f for f, _ in opts.mapping]
    shape = mapping_shape(fields)
    picked = {field: _select(soup, selector, where) for field, selector in opts.mapping}
    counts = {len(v) for v in picked.values() if len(v) != 1}
    if not picked or any(len(v) == 0 for v in picked.values()):
        missing = [f"{f} ({s!r})" for f, s in opts.mapping if not picked[f]]
        yield Reject(where, "empty_document", f"no element matches {', '.join(missing)}")
        return
    if len(counts) > 1:
        shown = ", ".join(f"{f}: {len(v)}" for f, v in picked.items())
        yield Reject(where, "pair_mismatch", f"selectors match different numbers of elements ({shown})")
        return
    n = counts.pop() if counts else 1
    for i in range(n):
        values = {f: (v[0] if len(v) == 1 else v[i]) for f, v in picked.items()}
        yield f"{where} match {i + 1}", to_record(shape, values)


PAGES_PER_TASK = 4
WINDOW_PER_WORKER = 2  # tasks in flight per worker (8 pages): bounds memory whatever the folder's size


def _read_all(args: tuple) -> list:
    path, opts, prepare, templates = args
    items = read_html(path, opts, template_for(templates, path))
    return [prepare(item, opts) for item in items] if prepare else list(items)


def _read_batch(args: tuple) -> list[list]:
    paths, opts, prepare, templates = args
    return [_read_all((path, opts, prepare, templates)) for path in paths]


def _read_pages(args: tuple) -> list:
    paths, opts = args
    return [read_page(path, opts) for path in paths]


def read_html_files(paths: list[str], opts: IngestOptions, workers: int,
                    prepare: Callable | None = None) -> Iterator[tuple[str, list]]:
    """(path, items) for each page, in order; pages are parsed in `workers` processes when it pays.

    A sample of the site's and of each folder's pages is read first to learn the templates (site_template.py);
    those pages
    are not read twice. `prepare(item, opts)`, a module-level function, runs on each item inside the
    worker (the pipeline's stateless cleaning), so that the parent process is left with little more than
    writing. Pages travel in batches of PAGES_PER_TASK: one task per page cost the parent a wake-up and a
    pickle round per page."""
    samples = {} if opts.mapping else sample_indices(paths)
    sampled = list(dict.fromkeys(i for indices in samples.values() for i in indices))  # the site's and a folder's
    in_sample = set(sampled)
    rest = [path for i, path in enumerate(paths) if i not in in_sample]
    parallel = workers > 1 and len(paths) >= PARALLEL_MIN_FILES
    pool = _pool(workers) if parallel else None
    try:
        if pool is None:
            pages = _read_pages(([paths[i] for i in sampled], opts))
        else:
            tasks = [([paths[i] for i in sampled[k:k + PAGES_PER_TASK]], opts)
                     for k in range(0, len(sampled), PAGES_PER_TASK)]
            pages = [page for batch in pool.map(_read_pages, tasks) for page in batch]
        learned = dict(zip(sampled, pages))
        templates = {folder: site_template([learned[i].body for i in indices if isinstance(learned[i], Page)],
                                           [learned[i].title for i in indices if isinstance(learned[i], Page)])
                     for folder, indices in samples.items()}
        if pool is None:
            results = ((path, _read_all((path, opts, None, templates))) for path in rest)
        else:
            results = _in_pool(pool, rest, opts, prepare, templates, workers * WINDOW_PER_WORKER)
        for i, path in enumerate(paths):
            if i in learned:
                template = template_for(templates, path)
                items = learned.pop(i)
                items = page_items(path, items, opts, template) if isinstance(items, Page) else items
                yield path, [prepare(item, opts) for item in items] if prepare and pool else list(items)
            else:
                yield next(results)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _pool(workers: int):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method()))


def _in_pool(pool, paths: list[str], opts: IngestOptions, prepare: Callable | None, templates: dict,
             window: int) -> Iterator[tuple[str, list]]:
    """(path, items) in order, read in batches by the pool, at most `window` batches in flight."""
    from collections import deque

    pending: deque = deque()
    for i in range(0, len(paths), PAGES_PER_TASK):
        batch = paths[i:i + PAGES_PER_TASK]
        pending.append((batch, pool.submit(_read_batch, (batch, opts, prepare, templates))))
        if len(pending) >= window:
            yield from _done(*pending.popleft())
    while pending:
        yield from _done(*pending.popleft())


def _done(batch: list[str], future) -> Iterator[tuple[str, list]]:
    yield from zip(batch, future.result())


def start_method() -> str:
    """How worker processes start: fork where that is safe, else spawn.

    fork starts a worker in milliseconds with bs4 and lxml already imported; spawn re-imports them (and
    the caller's main module), which cost as much as the parallelism saved on a few hundred pages. fork is
    only safe on Linux in a process with one thread and no torch loaded (the `finetune ingest` command);
    a training process holding CUDA or OpenMP threads gets spawn."""
    if sys.platform == "linux" and threading.active_count() == 1 and "torch" not in sys.modules:
        return "fork"
    return "spawn"
