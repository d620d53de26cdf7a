"""The runs page: every run under some folders compared on one self-contained HTML page (`finetune runs`).

It reads only what runs already write (run.json, diagnosis.json, eval/report.json, completions.jsonl, the
checkpoints' trainer_state.json, stopped.json, recipe.resolved.yml): no logging format of its own, no database.

    folders.py   finding runs under folders, and each one's status: finished, crashed (stopped on an error or killed
                 before run.json), interrupted (Ctrl-C), training (its output lock is held by a live process)
    read.py      one run folder -> the page's data for it (summary, verdict, curves, settings, eval, samples);
                 an old or partial run.json gives what it has
    page.py      the HTML: the data as JSON in a <script type="application/json">, the vendored uPlot
                 (vendor/, npm uplot, MIT) and page.js / page.css inlined; a Content-Security-Policy that lets
                 only those scripts run
    server.py    `--serve`: the same page on 127.0.0.1, read-only, refreshing its data while a run trains

Nothing heavy is imported: no torch, no matplotlib.
"""
