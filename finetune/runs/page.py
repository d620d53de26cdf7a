"""The runs page: one self-contained HTML file, written whole or not at all.

Safety: nothing that comes from a run (folder names, recipes, data, generated answers) is ever written into the
HTML as markup. The runs' data travels as JSON inside <script type="application/json">, with `<`, `>`, `&` and
U+2028/U+2029 escaped so that no string can close the tag, and page.js builds the DOM from it with textContent
only. A Content-Security-Policy lets run only the two inline scripts the page ships (by their SHA-256) and allows
no network at all, save the served page's own data.json.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from importlib.resources import files
from pathlib import Path

from finetune.atomic import write_text_atomic
from finetune.runs.folders import find_runs
from finetune.runs.read import finite, read_run

PAGE_FILE = "run.html"  # the page a run writes into its own output folder when it ends
UPLOT_VERSION = "1.6.32"  # finetune/runs/vendor/: npm `uplot`, uPlot.iife.min.js + uPlot.min.css, MIT (uPlot.LICENSE)
ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return files("finetune.runs").joinpath(name).read_text(encoding="utf-8")


def _names(folders: list[Path]) -> list[str]:
    """Each run's name: its path below the folder all the runs share (a lone run: its folder's name)."""
    if len(folders) == 1:
        return [folders[0].name or str(folders[0])]
    root = Path(os.path.commonpath([str(f) for f in folders]))
    return [str(f.relative_to(root)) for f in folders]


def page_data(folders: list[Path], refresh_s: float | None = None) -> dict:
    """What the page shows: every run's data, and when it was read."""
    names = _names(folders) if folders else []
    return finite({
        "generated": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
        "refresh_s": refresh_s,
        "uplot_version": UPLOT_VERSION,
        "runs": [read_run(folder, name) for folder, name in zip(folders, names)],
    })


def script_json(data: dict) -> str:
    """`data` as JSON that is safe inside <script type="application/json">: no `</script>`, no `<!--`."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escape in ESCAPES.items():
        text = text.replace(char, escape)
    return text


def _sha256(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


def render(data: dict) -> str:
    """The whole page: data, chart library, script and style inline; no request leaves it."""
    uplot_js, page_js = _asset("vendor/uPlot.iife.min.js"), _asset("page.js")
    css = _asset("vendor/uPlot.min.css") + "\n" + _asset("page.css")
    policy = (f"default-src 'none'; script-src {_sha256(uplot_js)} {_sha256(page_js)}; style-src 'unsafe-inline'; "
              "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        "<title>finetune runs</title>",
        f"<style>{css}</style>",
        "</head><body>",
        '<header><h1>finetune runs</h1><p id="generated"></p></header>',
        '<main id="page"><noscript>This page draws its tables and charts with JavaScript.</noscript></main>',
        f'<script type="application/json" id="runs-data">{script_json(data)}</script>',
        f"<script>{uplot_js}</script>",
        f"<script>{page_js}</script>",
        "</body></html>",
        "",
    ])


def write_page(folders: list[str | Path], out: str | Path) -> tuple[Path, dict]:
    """Find the runs under `folders` and write their page to `out`; (the page's path, its data)."""
    data = page_data(find_runs(folders))
    out = Path(out)
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, render(data))
    return out, data


def write_run_page(output_dir: str | Path) -> Path:
    """The page of one run, into its own output folder (run.html): written when the run ends."""
    output_dir = Path(output_dir)
    out = output_dir / PAGE_FILE
    write_text_atomic(out, render(page_data([output_dir.resolve()])))
    return out
