"""The report people read: report.json (everything), report.md (tables and the answers side by side),
report.png (base vs tuned per metric; a reward run's score histograms in scores.png), each written whole or not at
all; and the one-line verdict.

`--compare OTHER`: the other run's report.json (written by its own `finetune eval`) beside this one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from finetune.atomic import temp_file, write_text_atomic
from finetune.errors import FinetuneError

REPORT_DIR = "eval"  # under the run's output folder
LOWER_IS_BETTER = ("loss", "perplexity")


def headline(report: dict) -> list[tuple[str, dict, bool]]:
    """(metric, {side: value}, higher is better) for every number worth a bar."""
    rows = []
    heldout = report.get("heldout") or {}
    for metric in ("loss", "perplexity"):
        values = {side: v[metric] for side, v in heldout.get("sides", {}).items()}
        if values:
            rows.append((f"held-out {metric}", values, False))
    if report.get("grpo"):
        from finetune.evaluation.grpo import headline_rows

        rows += headline_rows(report["grpo"])
    if (report.get("reward") or {}).get("sides"):
        from finetune.evaluation.reward import headline_rows as reward_rows

        rows += reward_rows(report["reward"])
    pref = report.get("preference") or {}
    if pref.get("log_prob"):
        rows.append(("chosen preferred", {s: v["chosen_preferred"] for s, v in pref["log_prob"].items()}, True))
    if pref.get("reward"):
        rows.append(("reward accuracy", {"tuned": pref["reward"]["reward_accuracy"]}, True))
    gen = (report.get("generation") or {}).get("summary") or {}
    if gen:
        rows.append(("answers that ended", {s: v["answers"] - v["never_ended"] for s, v in gen.items()}, True))
    for task, sides in ((report.get("benchmarks") or {}).get("tasks") or {}).items():
        metrics = sorted({m for values in sides.values() for m in values})
        for metric in metrics:
            rows.append((f"{task} {metric}", {s: v[metric] for s, v in sides.items() if metric in v}, True))
    return rows


def _fmt(value) -> str:
    """4 significant digits (0.625, 1.43, 0.8583): a table's numbers, never rounded to two places."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def differences(report: dict) -> dict[str, dict]:
    """{headline metric: its tuned - base interval} for every base-vs-tuned claim that has one
    (finetune/evaluation/uncertainty.py)."""
    out = {}
    if (report.get("heldout") or {}).get("difference"):
        out["held-out loss"] = report["heldout"]["difference"]
    for metric, interval in ((report.get("grpo") or {}).get("differences") or {}).items():
        out[f"held-out {metric}"] = interval
    if (report.get("preference") or {}).get("difference"):
        out["chosen preferred"] = report["preference"]["difference"]
    if (report.get("reward") or {}).get("difference"):
        out["pair accuracy"] = report["reward"]["difference"]
    return out


def verdict(report: dict) -> str:
    """One line: is the tuned model better on held-out loss (or reward accuracy), and did its answers end."""
    parts = []
    sides = (report.get("heldout") or {}).get("sides") or {}
    if "base" in sides and "tuned" in sides:
        from finetune.evaluation.uncertainty import claim

        before, after = sides["base"]["loss"], sides["tuned"]["loss"]
        parts.append(claim("held-out loss", before, after, report["heldout"]["difference"], higher_is_better=False))
    if report.get("grpo"):
        from finetune.evaluation.grpo import verdict_part

        parts.append(verdict_part(report["grpo"]))
    if (report.get("preference") or {}).get("reward"):
        from finetune.evaluation.preference import verdict_part as preference_part

        parts.append(preference_part(report["preference"]))
    if (report.get("reward") or {}).get("sides"):
        from finetune.evaluation.reward import verdict_part as reward_part

        parts.append(reward_part(report["reward"]))
    if "gguf" in sides and "tuned" in sides:
        prompts = (report.get("generation") or {}).get("prompts") or []
        same = sum(row["gguf"]["answer"] == row["tuned"]["answer"] for row in prompts if "gguf" in row)
        answers = f", {same} of {len(prompts)} answers the same as the tuned model's" if prompts else ""
        parts.append(f"GGUF drift {sides['gguf']['loss'] - sides['tuned']['loss']:+.4f} in held-out loss{answers}")
    gen = (report.get("generation") or {}).get("summary", {}).get("tuned")
    if gen:
        bad = [f"{gen['never_ended']} of {gen['answers']} tuned answers never ended" if gen["never_ended"] else "",
               f"{gen['empty']} empty" if gen["empty"] else "", f"{gen['looping']} looping" if gen["looping"] else ""]
        bad = [b for b in bad if b]
        parts.append("; ".join(bad) if bad else f"all {gen['answers']} tuned answers ended")
    for task, values in ((report.get("benchmarks") or {}).get("tasks") or {}).items():
        if "acc" in values.get("tuned", {}) and "acc" in values.get("base", {}):
            parts.append(f"{task} acc {values['base']['acc']:.3f} -> {values['tuned']['acc']:.3f}")
    return "; ".join(parts) if parts else "nothing was evaluated"


def markdown(report: dict, other: dict | None = None) -> str:
    lines = [f"# Evaluation of `{report['run']}`", "", f"**Verdict:** {report['verdict']}", ""]
    lines += [f"- model: {report['model']}", *([f"- base: {report['base']}"] if report.get("base") else []),
              f"- prompt format: {report['prompt_format']}",
              *([f"- held-out data: {report['data_source']}"] if report.get("data_source") else []), ""]
    rows = headline(report)
    if rows:
        lines += _numbers(report, rows, other)
    if report.get("grpo"):
        from finetune.evaluation.grpo import markdown_lines as grpo_lines

        lines += grpo_lines(report["grpo"])
    if (report.get("preference") or {}).get("log_prob"):
        from finetune.evaluation.preference import markdown_lines as preference_lines

        lines += preference_lines(report["preference"])
    if (report.get("reward") or {}).get("sides"):
        from finetune.evaluation.reward import markdown_lines as reward_lines

        lines += reward_lines(report["reward"])
    bench = report.get("benchmarks")
    if bench:
        limit = "all examples" if bench["limit"] is None else f"{bench['limit']} examples per task"
        how = "the adapter without merging" if report.get("adapter") else "the model"
        lines += [f"lm-eval: chat template {'on' if bench['chat_template'] else 'off'}, {limit}, {how}.", ""]
    gen = report.get("generation")
    if gen:
        lines += ["## Answers", "", f"Greedy, at most {gen['max_new_tokens']} new tokens, {gen['prompt_format']} "
                  "format. ended / empty / loops are the checks (docs/evaluation.md).", ""]
        for i, row in enumerate(gen["prompts"], 1):
            lines += [f"### Prompt {i}", "", "```text", row["prompt"], "```", "", f"reference: {row['reference']}", ""]
            for side in ("base", "tuned", "gguf"):
                if side in row:
                    c = row[side]
                    flags = ", ".join(f for f, on in (("never ended", not c["ended"]), ("empty", c["empty"]),
                                                      ("loops", c["loops"])) if on) or "ok"
                    lines += [f"**{side}** ({c['tokens']} tokens, {flags}):", "", "```text", c["answer"], "```", ""]
    return "\n".join(lines)


def _numbers(report: dict, rows: list, other: dict | None) -> list[str]:
    """The numbers table: a column per side, tuned - base with its interval where the claim has one, the other run."""
    from finetune.evaluation.uncertainty import LEVEL, compared, span

    sides = sorted({s for _, values, _ in rows for s in values}, key=["base", "tuned", "gguf"].index)
    intervals = differences(report)
    head = ["metric", *sides] + ([f"tuned - base ({LEVEL:.0%} interval)"] if intervals else []) + \
        ([f"other run: {other['run']} (tuned)"] if other else [])
    lines = ["## Numbers", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    theirs = {name: values for name, values, _ in headline(other)} if other else {}
    for name, values, higher in rows:
        cells = [name] + [_fmt(values.get(s, "-")) for s in sides]
        if intervals:
            interval = intervals.get(name)
            cells.append(f"{span(interval)}: {compared(interval, higher)}" if interval else "")
        if other:
            cells.append(_fmt(theirs.get(name, {}).get("tuned", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot(report: dict, path: Path) -> None:
    """One panel per metric, a bar per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = headline(report)
    if not rows:
        return
    colors = {"base": "#9e9e9e", "tuned": "#1f77b4", "gguf": "#ff7f0e"}
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), squeeze=False)
    for ax, (name, values, higher) in zip(axes[0], rows):
        sides = [s for s in ("base", "tuned", "gguf") if s in values]
        bars = ax.bar(sides, [values[s] for s in sides], color=[colors[s] for s in sides])
        ax.bar_label(bars, labels=[_fmt(values[s]) for s in sides], fontsize=8)
        ax.set_title(f"{name}\n({'higher' if higher else 'lower'} is better)", fontsize=9)
        ax.margins(y=0.2)
    fig.tight_layout()
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)


def save_png(fig, path: Path) -> None:
    """A matplotlib figure written whole or not at all."""
    fd, tmp = temp_file(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=100)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_other(folder: str) -> dict:
    """The report.json another run's `finetune eval` wrote."""
    path = Path(folder) / REPORT_DIR / "report.json"
    if not path.is_file():
        path = Path(folder) / "report.json" if (Path(folder) / "report.json").is_file() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise FinetuneError(f"--compare: no evaluation report at `{path}`; run `finetune eval {folder}` first") from None


def write_report(report: dict, out_dir: Path, other: dict | None = None) -> Path:
    """report.json, report.md and report.png into out_dir, each atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if other is not None:
        report = {**report, "compared_with": other.get("run")}
    plot(report, out_dir / "report.png")
    if (report.get("reward") or {}).get("histograms"):  # a reward run's score histograms, base and tuned
        from finetune.evaluation.reward import plot_histograms

        save_png(plot_histograms(report["reward"]), out_dir / "scores.png")
    write_text_atomic(out_dir / "report.md", markdown(report, other))
    write_text_atomic(out_dir / "report.json", json.dumps(report, indent=2, default=str))
    return out_dir
