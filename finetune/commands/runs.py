"""Compare runs on one page: curves overlaid, settings that differ, verdicts and evaluations side by side.

    finetune runs [FOLDER ...] [-o runs.html]     one self-contained HTML file (opens from file://, no network)
    finetune runs [FOLDER ...] --serve [--port N] the same page on http://127.0.0.1:N, refreshing while runs train

Every run folder at or under the FOLDERs (default: the current folder) is listed: finished (run.json), crashed or
stopped (checkpoints, no run.json), training now (its output lock is held). docs/runs.md says what the page shows.
"""

from __future__ import annotations

import argparse

from finetune.log import get_logger


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", nargs="*", default=["."], metavar="FOLDER",
                        help="folders that hold runs (a run's output_dir, or any folder above several); default: .")
    parser.add_argument("-o", "--output", default="runs.html", help="the page to write (default: runs.html)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the page on 127.0.0.1 instead (read-only; it refreshes while runs train)")
    parser.add_argument("--port", type=int, default=8765, help="the --serve port (default: 8765; 0: any free port)")


def run(args: argparse.Namespace) -> int:
    from finetune.errors import FinetuneError

    log = get_logger(__name__)
    if args.serve:
        from finetune.runs.server import make_server

        if not 0 <= args.port <= 65535:
            raise FinetuneError(f"--port {args.port}: a port is 0-65535 (0: any free port)")

        try:
            server = make_server(args.folders, port=args.port)
        except OSError as err:
            raise FinetuneError(f"--serve: cannot listen on 127.0.0.1:{args.port} ({err.strerror or err}); "
                                "pick another with --port N (0: any free port)") from None
        print(f"serving the runs page on http://127.0.0.1:{server.server_port}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        finally:
            server.server_close()
        return 0
    from finetune.runs.page import write_page

    try:
        out, data = write_page(args.folders, args.output)
    except IsADirectoryError:
        raise FinetuneError(f"-o `{args.output}` is a folder; give the page's file name, e.g. -o runs.html") from None
    except OSError as err:
        raise FinetuneError(f"cannot write `{args.output}`: {err.strerror or err}; pick another -o path") from None
    counts = {}
    for run_data in data["runs"]:
        counts[run_data["status"]] = counts.get(run_data["status"], 0) + 1
    found = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no runs found"
    log.info(f"runs: {found}")
    print(out)
    return 0
