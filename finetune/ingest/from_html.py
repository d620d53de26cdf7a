"""HTML files -> records: one per page (`document`), one per heading section (`sections`), or fields
picked by CSS selectors (`map: {instruction: ".question h1", output: ".answer .body"}`), e.g. Q&A pages."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator

from finetune.errors import DataError
from finetune.ingest.html_text import decode_html, is_binary, parse, prune_to_main, render
from finetune.ingest.mapping import mapping_shape, to_record
from finetune.ingest.options import PARALLEL_MIN_FILES, IngestOptions
from finetune.ingest.report import Reject
from finetune.ingest.textio import open_binary

# A page whose main content is at least this share link text (in characters) is an index, a sitemap or a
# table of contents: it teaches link titles, not prose. Content pages with many inline links stay under 0.2
# (the regression corpus: 0.04 to 0.18 with their navigation still in; its index page: 0.88).
LOW_TEXT_LINK_SHARE = 0.8
MAX_HTML_BYTES = 64 << 20  # a single page larger than this is not a page; it is rejected, not parsed
_HEADING_LINE = re.compile(r"^(#{1,6}) ", re.MULTILINE)
# The first level-1 heading, when at most 3 short lines (a byline, a breadcrumb) precede it
_FIRST_H1 = re.compile(r"(?:[^\n]{0,200}\n+){0,3}?# ([^\n]+)")


def read_html(path: str, opts: IngestOptions) -> Iterator[tuple[str, dict] | Reject]:
    where = path
    try:
        with open_binary(path) as fh:
            data = fh.read(MAX_HTML_BYTES + 1)
    except (OSError, EOFError) as exc:
        yield Reject(where, "unreadable_file", f"cannot read it: {exc}")
        return
    if len(data) > MAX_HTML_BYTES:
        yield Reject(where, "unreadable_file", f"over {MAX_HTML_BYTES >> 20} MiB: not a web page")
        return
    if is_binary(data):
        yield Reject(where, "binary_file", "it contains NUL bytes: not HTML text")
        return
    text, _ = decode_html(data, opts.encoding)
    if opts.mapping:
        yield from _mapped(parse(text), where, opts)
        return
    page = prune_to_main(text)
    title, body = page.title, ""
    if page.html is not None:
        soup = parse(page.html, prestrip=False)  # prune_to_main already removed scripts and styles
        body = render(soup.body or soup, page_level=page.page_level)
    if not body.strip():
        yield Reject(where, "empty_document", "no readable text in the page body")
        return
    if page.link_chars and page.link_chars >= LOW_TEXT_LINK_SHARE * page.chars:
        yield Reject(where, "low_text", f"{page.link_chars} of its {page.chars} characters are link text: an "
                                        "index or navigation page, not content")
        return
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
    cuts = [m.start() for m in _HEADING_LINE.finditer(body) if len(m.group(1)) <= level]
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
        out.append(render(tag, page_level=False))
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
    path, opts, prepare = args
    items = read_html(path, opts)
    return [prepare(item, opts) for item in items] if prepare else list(items)


def _read_batch(args: tuple) -> list[list]:
    paths, opts, prepare = args
    return [_read_all((path, opts, prepare)) for path in paths]


def read_html_files(paths: list[str], opts: IngestOptions, workers: int,
                    prepare: Callable | None = None) -> Iterator[tuple[str, list]]:
    """(path, items) for each page, in order; pages are parsed in `workers` processes when it pays.

    `prepare(item, opts)`, a module-level function, runs on each item inside the worker (the pipeline's
    stateless cleaning), so that the parent process is left with little more than writing. Pages travel
    in batches of PAGES_PER_TASK: one task per page cost the parent a wake-up and a pickle round per page."""
    if workers <= 1 or len(paths) < PARALLEL_MIN_FILES:
        for path in paths:
            yield path, _read_all((path, opts, None))
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    batches = [paths[i:i + PAGES_PER_TASK] for i in range(0, len(paths), PAGES_PER_TASK)]
    window = workers * WINDOW_PER_WORKER
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method())) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.submit(_read_batch, (batch, opts, prepare))))
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
