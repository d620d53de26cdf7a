"""The docs: every command shown in a code block is one the CLI accepts, the site builds with --strict,
and the example curves get the verdicts their captions give."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import GLOBAL_FLAGS, VERBS, verb_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INDENTED = re.compile(r"^ {4}(\$ )?(finetune|python3? -m finetune|accelerate launch)\b")  # indented code blocks
# `finetune VERB ...`, `python -m finetune.train ...`, `accelerate launch -m finetune.train ...`
LAUNCHERS = (("finetune",), ("python", "-m", "finetune.train"), ("python3", "-m", "finetune.train"),
             ("accelerate", "launch", "-m", "finetune.train"))


def shell_commands(block: str):
    """Each simple command in a shell code block: continuations joined, split at && || | ;, comments dropped."""
    text = block.replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        # usage synopses: `[--show N]` is checked as `--show N`; `[options]` is a placeholder, dropped
        line = re.sub(r"(?<=\s)\[([^\]]*)\]", lambda m: m.group(1) if m.group(1).startswith("-") else "", line)
        try:
            # posix=False keeps the quotes, so a quoted ';' stays an argument, not an operator
            lexer = shlex.shlex(line, posix=False, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
            words = [" ".join(shlex.split(token)) for token in tokens]
        except ValueError:
            continue  # not shell (a Python or YAML block)
        command: list[str] = []
        for token, word in zip(tokens + [";"], words + [";"]):
            if token and set(token) <= set(";&|"):
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def finetune_invocations() -> list[tuple[str, list[str]]]:
    """(where, argv after the verb's program) for every finetune command in the docs' code blocks."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        indented = "\n".join(line[4:] for line in text.splitlines() if INDENTED.match(line))
        for block in FENCE.findall(text) + [indented]:
            for command in shell_commands(block):
                for launcher in LAUNCHERS:
                    if tuple(command[:len(launcher)]) == launcher:
                        rest = command[len(launcher):]
                        argv = rest if launcher == ("finetune",) else ["train", *rest]
                        found.append((f"{page.name}: {' '.join(command)}", argv))
    return found


def parse(argv: list[str]) -> None:
    """Parse argv with the verb's own argparse parser (no run). Raises on an unknown verb or option."""
    if argv in ([], ["--help"], ["--version"]):
        return
    while argv and argv[0] in GLOBAL_FLAGS:  # `finetune --quiet train ...`
        argv = argv[1:]
    verb, args = argv[0], argv[1:]
    assert verb in VERBS, f"`{verb}` is not a finetune verb ({', '.join(VERBS)})"
    parser = verb_parser(VERBS[verb][0], f"finetune {verb}", exit_on_error=False)
    if "--help" in args or "-h" in args:
        args = [a for a in args if a not in ("--help", "-h")]
        _, unknown = parser.parse_known_args(args)  # options beside --help must still be known
        assert not unknown, f"unknown options {unknown}"
        return
    parser.parse_args(args)


def test_the_docs_show_finetune_commands():
    found = finetune_invocations()
    assert len(found) >= 20, found
    verbs = {argv[0] for _, argv in found if argv}
    assert {"validate", "ingest", "preprocess", "train", "lr", "plan", "merge", "curves"} <= verbs, verbs


@pytest.mark.parametrize("where,argv", finetune_invocations(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_command_in_the_docs_parses(where, argv):
    try:
        parse(argv)
    except (argparse.ArgumentError, SystemExit, AssertionError) as err:
        pytest.fail(f"{where}\n  -> {err}")


def test_the_checker_catches_a_wrong_verb_and_a_wrong_option():
    with pytest.raises(AssertionError):
        parse(["trian", "recipe.yml"])
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse(["train", "recipe.yml", "--learning-rate", "1e-4"])
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse(["plan", "recipe.yml", "--adapter", "dora"])
    commands = list(shell_commands("pip install x && finetune train r.yml --set a=1  # comment\nfinetune \\\n lr r.yml"))
    assert commands == [["pip", "install", "x"], ["finetune", "train", "r.yml", "--set", "a=1"],
                        ["finetune", "lr", "r.yml"]]


def test_the_example_curves_get_the_verdicts_in_their_captions():
    from finetune.train.curves import diagnose

    examples = runpy.run_path(str(ROOT / "docs" / "img" / "make_curves.py"))["histories"]()
    page = (ROOT / "docs" / "learning-curves.md").read_text()
    for name, (verdict, history) in examples.items():
        assert diagnose(history)["verdict"] == verdict, name
        assert f"img/curve-{name}.png" in page and (ROOT / "docs" / "img" / f"curve-{name}.png").is_file(), name


def test_every_page_is_in_the_mkdocs_nav():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {next(iter(item.values())) for item in nav}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    # a page another engineer is still writing (untracked) is not held against the nav
    tracked = subprocess.run(["git", "ls-files", "docs"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if tracked:
        pages &= {Path(p).name for p in tracked}
    assert pages <= listed, f"add {sorted(pages - listed)} to the nav in mkdocs.yml (and a line in docs/index.md)"
    assert listed <= {p.name for p in (ROOT / "docs").glob("*.md")}, "mkdocs.yml lists a page that does not exist"


@pytest.mark.skipif(shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs not installed (pip install -e '.[test]')")
def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()


def test_every_field_a_records_map_may_name_is_in_the_data_sources_table():
    """Issue 43, item 14: `map: {prompt: COLUMN}` worked but was missing from docs/data-sources.md's table."""
    from finetune.recipe.data import RECORDS_MAP_FIELDS

    table = (ROOT / "docs" / "data-sources.md").read_text().split("## Field mappings")[1].split("\n\n`roles:`")[0]
    named = {name for line in table.splitlines() if line.startswith("| `")
             for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert set(RECORDS_MAP_FIELDS) <= named, set(RECORDS_MAP_FIELDS) - named
