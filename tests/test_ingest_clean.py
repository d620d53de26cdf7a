"""Cleaning, accounting, atomic outputs, the `finetune ingest` CLI, and the recipe integration."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.errors import DataError
from finetune.ingest import pipeline
from finetune.ingest.clean import Cleaner, normalize_text
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths
from finetune.ingest.slop import DEFAULT_PHRASES, SlopMatcher

ASSETS = Path(__file__).parent / "assets" / "ingest"
REPO = Path(__file__).parent.parent


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- slop --------------------------------------------------------------------------------------------

def test_slop_matching_ignores_case_spacing_and_curly_apostrophes():
    matcher = SlopMatcher.build()
    assert matcher.find("AS AN AI\n   LANGUAGE    MODEL, I think") == ["as an ai language model"]
    assert matcher.find("Sorry. I don\u2019t have personal opinions.") == ["i don't have personal opinions"]
    assert matcher.find("A course on AI ethics and bias in language models.") == []  # narrow on purpose
    assert matcher.find("The model was trained by OpenAIsh folks") == []  # word boundaries


@pytest.mark.parametrize("text", [
    "I'm an AI Assistant, so unable to help with that.",
    "I am an AI and do not have personal preferences, but many people enjoy hiking.",
    "As an AI assistant, here are some general tips.",
    "Sorry, as an AI I cannot do that.",
    "I don\u2019t have any personal opinions on this.",
    "I'm not able to access the internet, so I can't check the weather.",
    "My training data only goes up to 2021.",
    "I am ChatGPT, a large language model trained by OpenAI.",
    "I'm an assistant developed by OpenAI, here to help.",
    "I was created by OpenAI to answer questions.",
])
def test_slop_patterns_catch_the_variants_a_phrase_list_misses(text):
    assert SlopMatcher.build().find(text), text
    assert SlopMatcher.build(builtin=False, extra=("delve into",)).find(text) == []  # patterns are built-in


@pytest.mark.parametrize("text", [
    "AI assistants are useful for quizzing yourself.",
    "She works as an assistant professor in Lyon.",
    "As an AI researcher, you will own a benchmark.",
    "Being an AI, it had no need for coffee.",
    "I don't have a preference; pick either.",
    "\"I don't have feelings for him,\" Mara said.",
    "My laptop cannot access the internet after the update.",
    "I am an AI student. Which courses should I take?",
    "Meet Ada, our new AI assistant: ask her about your invoices.",
    # facts about a company's products are not the assistant's identity
    "Whisper is a speech recognition model developed by OpenAI and released in 2022.",
    "GPT-2 was trained by OpenAI on 40 GB of web text. I think it is a good baseline.",
    "The API, created by OpenAI, charges per token.",
    "I was reading that GPT-2 was trained by OpenAI.",
])
def test_slop_patterns_leave_near_misses_alone(text):
    assert SlopMatcher.build().find(text) == []


def test_slop_recall_and_false_positives_on_the_samples():
    samples = ASSETS / "slop"
    variants = [line for line in (samples / "slop_variants.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    clean = [json.loads(line)["output"] for line in (samples / "clean_instructions.jsonl").open()]
    matcher = SlopMatcher.build()
    assert [text for text in variants if not matcher.find(text)] == []
    assert len(clean) == 300 and [text for text in clean if matcher.find(text)] == []


def test_slop_strip_removes_a_sentence_only_a_pattern_matches():
    text, found = SlopMatcher.build().strip("I am an AI and cannot taste food. Salt it at the end.")
    assert text == "Salt it at the end." and found == ["as / i am an ai [assistant|model], ..."]


def test_default_list_is_narrow_and_canonical():
    assert len(DEFAULT_PHRASES) < 80
    for word in ("ethics", "bias", "sorry", "language model", "important"):
        assert word not in DEFAULT_PHRASES


def test_slop_strip_mode_removes_only_the_offending_sentences(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"instruction": "Joke?", "output": "As an AI language model, I can't laugh. Why did the GPU overheat? Too many layers."},
        {"instruction": "Opinion?", "output": "I don't have personal opinions."},
        {"instruction": "Who are you?", "output": "As an AI language model, I have no name."},
    ])
    out = tmp_path / "out.jsonl"
    acct = ingest([str(src)], out, IngestOptions(slop="strip"))
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert records == [{"instruction": "Joke?", "output": "Why did the GPU overheat? Too many layers."}]
    assert acct.dropped == {"slop": 2} and acct.slop_stripped == 1
    assert acct.slop_phrases["as an ai language model"] == 2


def test_user_phrase_file_and_no_builtin(tmp_path):
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("# house list\ndelve into\n\n")
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "Let us DELVE   into tensors."},
                                              {"text": "As an AI language model, fine."}])
    acct = ingest([str(src)], tmp_path / "o.jsonl", IngestOptions(slop_files=(str(phrases),), slop_builtin=False))
    assert acct.slop_phrases == {"delve into": 1} and acct.records_out == 1


def test_slop_only_checks_supervised_text():
    cleaner = Cleaner(IngestOptions())
    rec = {"messages": [{"role": "user", "content": "As an AI language model, what would you say?"},
                        {"role": "assistant", "content": "I would say hello."}]}
    assert cleaner.apply(rec) == (rec, None)


# --- normalization, length, dedup --------------------------------------------------------------------

def test_normalize_text():
    assert normalize_text("Cafe\u0301\u200b  au\u00a0lait \r\n\r\n\r\n\nfin\x07 ") == "Café au lait\n\nfin"
    assert normalize_text("x\n```\n  code\t= 1\n```") == "x\n```\n  code\t= 1\n```"


def test_length_bounds_and_exact_and_near_dedup(tmp_path):
    base = "the quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly " * 3
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"text": base}, {"text": base.upper()}, {"text": base.replace("slowly", "quickly", 1)},
        {"text": "tiny"}, {"text": "x" * 500}, {"text": "a different sentence about gradient descent and loss " * 3},
    ])
    acct = ingest([str(src)], tmp_path / "o.jsonl", IngestOptions(near_dedup=0.8, min_chars=10, max_chars=400))
    assert acct.dropped == {"duplicate": 1, "near_duplicate": 1, "too_short": 1, "too_long": 1}
    assert acct.records_out == 2
    acct = ingest([str(src)], tmp_path / "o.jsonl", IngestOptions(dedup=False))
    assert acct.records_out == 6


# --- records files, accounting, atomicity ------------------------------------------------------------

def test_record_file_source_accounting(tmp_path):
    out = tmp_path / "out.jsonl"
    acct = ingest([str(ASSETS / "records" / "synthetic.jsonl")], out, IngestOptions())
    assert acct.records_in == 8 and acct.records_out == 2
    assert acct.dropped == {"slop": 2, "invalid_record": 2, "invalid_json": 1, "duplicate": 1}
    rejects = [json.loads(x) for x in sidecar_paths(out)[0].read_text().splitlines()]
    assert [r["where"].rsplit(" ", 1)[1] for r in rejects] == ["2", "3", "5", "6", "7", "8"]
    (broken,) = [r for r in rejects if r["reason"] == "invalid_json"]
    assert broken["detail"] == 'line 5, column 36: not valid JSON (expecting value, near `"Broken", "output":`)'
    report = json.loads(sidecar_paths(out)[1].read_text())
    assert report["sources"][str(ASSETS / "records" / "synthetic.jsonl")] == {"in": 8, "out": 2, "dropped": 6}


def test_interrupted_run_leaves_no_partial_output(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_text('{"text": "previous complete run"}\n')
    real = pipeline.read_unit

    def crash_midway(kind, source, opts):
        for i, item in enumerate(real(kind, source, opts)):
            if i == 3:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(pipeline, "read_unit", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        ingest([str(ASSETS / "records" / "synthetic.jsonl")], out, IngestOptions())
    assert out.read_text() == '{"text": "previous complete run"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp files, no sidecars


def test_nothing_usable_and_strict_mode(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "As an AI language model, no."}])
    with pytest.raises(DataError, match="nothing usable came out: 1 records in, all dropped \\(1 slop\\)"):
        ingest([str(src)], tmp_path / "o.jsonl", IngestOptions())
    assert not (tmp_path / "o.jsonl").exists() and (tmp_path / "o.report.json").exists()
    with pytest.raises(DataError, match=r"strict mode: 2 input records were unusable \(1 ragged_row, 1 empty_field\)"):
        ingest([str(ASSETS / "csv" / "faq.csv")], tmp_path / "f.jsonl",
               IngestOptions(mapping=(("instruction", "question"), ("output", "answer")), strict=True))


def test_missing_source_and_unknown_type(tmp_path):
    with pytest.raises(DataError, match="no such file or folder: `nope.csv`"):
        ingest(["nope.csv"], tmp_path / "o.jsonl", IngestOptions())
    (tmp_path / "data.xyz").write_text("hello")
    with pytest.raises(DataError, match="force it with --type"):
        ingest([str(tmp_path / "data.xyz")], tmp_path / "o.jsonl", IngestOptions())


# --- CLI ---------------------------------------------------------------------------------------------

def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "finetune.cli", "ingest", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cli_writes_output_report_and_rejects(tmp_path):
    out = tmp_path / "faq.jsonl"
    proc = cli(ASSETS / "csv" / "faq.csv", "--map", "instruction=question", "--map", "output=answer",
               "--unescape-html", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "records in" in proc.stderr and "dropped: ragged_row" in proc.stderr
    assert len(out.read_text().splitlines()) == 4
    assert json.loads((tmp_path / "faq.report.json").read_text())["records_in"] == 8
    assert len((tmp_path / "faq.rejects.jsonl").read_text().splitlines()) == 4


def test_cli_user_error_is_one_paragraph_exit_2(tmp_path):
    proc = cli(ASSETS / "csv" / "faq.csv", "--map", "output=nope", "--map", "instruction=question",
               "-o", tmp_path / "o.jsonl")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: `") and "column `nope`" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli(ASSETS / "csv" / "faq.csv", "--map", "instruction", "-o", tmp_path / "o.jsonl")
    assert proc.returncode == 2 and "is not FIELD=COLUMN" in proc.stderr


def test_ingestion_never_imports_torch():
    code = ("import sys, finetune.commands.ingest, finetune.ingest.pipeline, finetune.ingest.source;"
            "from finetune.ingest.pipeline import read_unit;"
            "import finetune.ingest.from_html, finetune.ingest.from_csv, finetune.ingest.from_sql;"
            "import finetune.ingest.from_db, finetune.ingest.clean;"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- recipe integration ------------------------------------------------------------------------------

def test_dataset_spec_cross_field_checks():
    from pydantic import ValidationError

    from finetune.recipe.data import DatasetSpec

    DatasetSpec(path="d.sql", type="sql", table="posts", map={"instruction": "title", "output": "body"})
    for kwargs, message in [
        ({"type": "csv", "table": "t"}, "`table` does not apply to `type: csv`"),
        ({"type": "chat", "slop": "strip"}, "`slop` applies to raw sources only"),
        ({"type": "database"}, "needs `query: SELECT ...` or `table: NAME`"),
        ({"type": "csv", "map": {"text": "a"}, "template": "{a}"}, "either `map` or `template`"),
    ]:
        with pytest.raises(ValidationError, match=message):
            DatasetSpec(path="x", **kwargs)


def test_materialize_caches_by_content_and_options(tmp_path, capsys):
    from finetune.ingest.source import materialize
    from finetune.recipe.data import DatasetSpec

    csv = tmp_path / "faq.csv"
    shutil.copy(ASSETS / "csv" / "faq.csv", csv)
    spec = DatasetSpec(path=str(csv), type="csv", map={"instruction": "question", "output": "answer"})
    first = materialize(spec, str(tmp_path / "cache"))
    assert first.parent == tmp_path / "cache" / "ingested" and first.name.endswith(".jsonl")
    mtime = first.stat().st_mtime_ns
    assert materialize(spec, str(tmp_path / "cache")) == first and first.stat().st_mtime_ns == mtime  # reused
    first_err, reused_err = capsys.readouterr().err.strip().splitlines()
    counts = "8 records in, 4 kept, 4 dropped (1 duplicate, 1 empty_field, 1 ragged_row, 1 slop); rejects: "
    assert first_err.startswith(f"ingest {csv}: {counts}") and reused_err.startswith(f"ingest {csv} (cached): {counts}")
    stripped = materialize(spec.model_copy(update={"slop": "off"}), str(tmp_path / "cache"))
    assert stripped != first and len(stripped.read_text().splitlines()) == 5  # slop row kept
    csv.write_text(csv.read_text() + '9,New question?,"A new answer.",docs\n')
    edited = materialize(spec, str(tmp_path / "cache"))
    assert edited != first and "New question?" in edited.read_text()
    assert (edited.parent / (edited.name[: -len(".jsonl")] + ".report.json")).is_file()


def test_recipe_builds_a_dataset_from_html_csv_and_sql(tmp_path, make_recipe, tiny_tokenizer, capsys):
    from finetune.data import build_dataset
    from finetune.recipe import load_recipe

    for sub in ("html", "csv", "sql"):
        shutil.copytree(ASSETS / sub, tmp_path / sub)
    datasets = [
        {"path": "html", "type": "html"},
        {"path": "csv/faq.csv", "type": "csv", "map": {"instruction": "question", "output": "answer"}},
        {"path": "sql/mysql_dump.sql", "type": "sql", "table": "posts", "template": "{title}\n\n{body}"},
    ]
    recipe = load_recipe(make_recipe("instruction", datasets=datasets))
    prepared = build_dataset(recipe, tiny_tokenizer)
    # 3 HTML pages + 4 FAQ rows + 5 posts (the NULL body still makes "Empty body" text)
    assert prepared.stats["records"] == 12
    # what ingestion dropped is said, by reason, with the rejects file: not only the records left
    err = capsys.readouterr().err
    html_line = f"ingest {tmp_path / 'html'}: 6 records in, 3 kept, 3 dropped (1 binary_file, 1 redirect_stub, 1 slop)"
    assert f"{html_line}; rejects: " in err
    rejects = err.split(html_line)[1].split("rejects: ")[1].split("\n")[0]
    assert len(Path(rejects).read_text().splitlines()) == 3
    assert "faq.csv: 8 records in, 4 kept, 4 dropped (1 duplicate, 1 empty_field, 1 ragged_row, 1 slop)" in err
    assert prepared.stats["train"]["supervised_tokens"] > 0
