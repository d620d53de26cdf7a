"""HTML files -> records: one per page (`document`), one per heading section (`sections`), or fields
picked by CSS selectors (`map: {instruction: ".question h1", output: ".answer .body"}`), e.g. Q&A pages."""

from __future__ import annotations

import re
from collections.abc import Iterator

from finetune.errors import DataError
from finetune.ingest.html_text import decode_html, is_binary, parse, prune_to_main, render
from finetune.ingest.mapping import mapping_shape, to_record
from finetune.ingest.options import IngestOptions
from finetune.ingest.report import Reject
from finetune.ingest.textio import open_binary

MAX_HTML_BYTES = 64 << 20  # a single page larger than this is not a page; it is rejected, not parsed
_HEADING_LINE = re.compile(r"^(#{1,6}) ", re.MULTILINE)


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
    title, main_html, page_level = prune_to_main(text)
    body = ""
    if main_html is not None:
        soup = parse(main_html, prestrip=False)  # prune_to_main already removed scripts and styles
        body = render(soup.body or soup, page_level=page_level)
    if not body.strip():
        yield Reject(where, "empty_document", "no readable text in the page body")
        return
    if opts.html_mode == "sections":
        yield from _sections(title, body, where, opts.html_split_level)
        return
    yield where, {"text": _with_title(title, body)}


def _with_title(title: str, body: str) -> str:
    """Keep the page title, unless the text already starts with it as a heading."""
    if not title or title.lower() in body[: len(title) + 16].lower():
        return body
    return f"# {title}\n\n{body}"


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


PARALLEL_MIN_FILES = 16  # below this, starting worker processes costs more than it saves
WINDOW_PER_WORKER = 8  # pages in flight per worker: bounds memory whatever the folder's size


def _read_all(args: tuple[str, IngestOptions]) -> list:
    return list(read_html(*args))


def read_html_files(paths: list[str], opts: IngestOptions, workers: int) -> Iterator[tuple[str, list]]:
    """(path, items) for each page, in order; pages are parsed in `workers` processes when it pays.

    Workers are spawned, not forked: the caller may be a training process holding CUDA or threads."""
    if workers <= 1 or len(paths) < PARALLEL_MIN_FILES:
        for path in paths:
            yield path, _read_all((path, opts))
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    window = workers * WINDOW_PER_WORKER
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque = deque()
        for path in paths:
            pending.append((path, pool.submit(_read_all, (path, opts))))
            if len(pending) >= window:
                done_path, future = pending.popleft()
                yield done_path, future.result()
        while pending:
            done_path, future = pending.popleft()
            yield done_path, future.result()
