"""`finetune runs --serve`: the runs page on 127.0.0.1, read-only, fresh on every request.

Two paths answer: `/` (the page, its data read from the folders now) and `/data.json` (the same data, which the
page fetches every REFRESH_S seconds and redraws when a run moved on). Anything else is 404; only GET and HEAD
are served (http.server answers 501 to the rest). The server binds the loopback interface only, and answers only
requests whose Host header names it (a web page elsewhere cannot reach it through DNS rebinding).
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.runs.folders import find_runs
from finetune.runs.page import page_data, render, script_json

HOST = "127.0.0.1"
REFRESH_S = 5


def _handler(folders: list[Path], refresh_s: float):
    class RunsHandler(BaseHTTPRequestHandler):
        server_version = "finetune-runs"

        def _body(self) -> tuple[int, str, bytes]:
            allowed = {f"{HOST}:{self.server.server_port}", f"localhost:{self.server.server_port}"}
            if self.headers.get("Host") not in allowed:
                return 403, "text/plain; charset=utf-8", b"forbidden: this server answers 127.0.0.1 only\n"
            path = self.path.split("?", 1)[0]
            if path not in ("/", "/index.html", "/data.json"):
                return 404, "text/plain; charset=utf-8", b"not found\n"
            try:
                data = page_data(find_runs(folders), refresh_s=refresh_s)
            except FinetuneError as err:  # a folder removed while serving
                return 404, "text/plain; charset=utf-8", f"{err}\n".encode("utf-8")
            if path == "/data.json":
                return 200, "application/json; charset=utf-8", script_json(data).encode("utf-8")
            return 200, "text/html; charset=utf-8", render(data).encode("utf-8")

        def _send(self, with_body: bool) -> None:
            code, kind, body = self._body()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._send(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(False)

        def log_message(self, format, *args) -> None:  # noqa: A002 quiet: the command prints its address once
            pass

    return RunsHandler


def make_server(folders: list[str | Path], port: int = 0, refresh_s: float = REFRESH_S) -> ThreadingHTTPServer:
    """A server for the runs under `folders` on 127.0.0.1:`port` (0: any free port); call serve_forever()."""
    resolved = [Path(f).resolve() for f in folders]
    find_runs(resolved)  # a missing folder is refused now, not at the first request
    return ThreadingHTTPServer((HOST, port), _handler(resolved, refresh_s))
