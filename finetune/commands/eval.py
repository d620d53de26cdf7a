"""Evaluate a trained run: base and tuned side by side (held-out loss, generation checks, lm-eval tasks).

    finetune eval recipe.yml
    finetune eval outputs/run --generations 8 --max-new-tokens 96
    finetune eval outputs/run --data held_out.jsonl --tasks tiny_facts
    finetune eval outputs/run --tasks-dir my_tasks/ --chat-template --compare outputs/other_run

Writes OUTPUT_DIR/eval/report.json, report.md and report.png; prints the one-line verdict.
Options left out take the recipe's `eval:` section, else the schema's defaults (docs/recipe.md).
"""

from __future__ import annotations

import argparse

from finetune.commands.args import add_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RECIPE_OR_OUTPUT_DIR",
                        help="a recipe (uses its output_dir) or a run's output folder (reads its run.json)")
    parser.add_argument("--data", default=None, metavar="RECORDS.jsonl",
                        help="evaluate on every record of this file (the run's record shape) instead of the eval split")
    parser.add_argument("--generations", type=int, default=None, metavar="N",
                        help="held-out prompts answered greedily by base and tuned, then checked (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="longest answer, in tokens")
    parser.add_argument("--no-heldout-loss", dest="heldout_loss", action="store_false", default=None,
                        help="skip the held-out loss (and preference accuracy)")
    parser.add_argument("--tasks", default=None, metavar="NAME[,NAME]",
                        help="lm-eval tasks, e.g. tiny_facts (the example finetune ships), comma-separated")
    parser.add_argument("--tasks-dir", default=None, metavar="DIR", help="a folder of local lm-eval task YAML files")
    parser.add_argument("--task-limit", type=int, default=None, metavar="N", help="examples per lm-eval task")
    parser.add_argument("--chat-template", dest="apply_chat_template", action=argparse.BooleanOptionalAction,
                        default=None, help="lm-eval: wrap the task prompts in the chat template (default off)")
    parser.add_argument("--gguf", default=None, metavar="FILE.gguf",
                        help="also evaluate this GGUF export (default: one `finetune export` wrote into the run)")
    parser.add_argument("--compare", default=None, metavar="OTHER_OUTPUT_DIR",
                        help="put another run's evaluation (its eval/report.json) beside this one")
    parser.add_argument("--out", default=None, metavar="DIR", help="where the report goes (default OUTPUT_DIR/eval)")
    add_overrides(parser)


def run(args: argparse.Namespace) -> int:
    from finetune.evaluation import evaluate

    changes = {"data": args.data, "generations": args.generations, "max_new_tokens": args.max_new_tokens,
               "heldout_loss": args.heldout_loss, "tasks_dir": args.tasks_dir, "task_limit": args.task_limit,
               "apply_chat_template": args.apply_chat_template, "gguf": args.gguf,
               "tasks": [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None}
    report = evaluate(args.target, args.overrides, changes, compare=args.compare, out_dir=args.out)
    print(report["verdict"])
    print(f"report: {report['report_dir']}/report.md")
    _refresh_run_page(report.get("run"))
    return 0


def _refresh_run_page(folder) -> None:
    """A run that wrote its own page (run.html, when training ended) shows this evaluation too."""
    from pathlib import Path

    from finetune.runs.page import PAGE_FILE, write_run_page

    if folder and (Path(folder) / PAGE_FILE).is_file():
        try:
            write_run_page(folder)
        except OSError:
            pass  # the report is written; `finetune runs FOLDER` redraws the page
