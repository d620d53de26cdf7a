"""Ingestion readers on the messy samples in tests/assets/ingest: HTML, CSV, SQL dumps, SQLite, databases."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.errors import DataError
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths

ASSETS = Path(__file__).parent / "assets" / "ingest"


def run(tmp_path, sources, **opts):
    """Ingest; return (records, rejects, report) and check the accounting identity on disk."""
    out = tmp_path / "out.jsonl"
    acct = ingest([str(s) for s in sources], out, IngestOptions(**opts))
    rejects_path, report_path = sidecar_paths(out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rejects = [json.loads(line) for line in rejects_path.read_text().splitlines()]
    report = json.loads(report_path.read_text())
    assert report["records_in"] == report["records_out"] + report["dropped_total"] == acct.records_in
    assert len(records) == report["records_out"] and len(rejects) == report["dropped_total"]
    return records, rejects, report


# --- HTML --------------------------------------------------------------------------------------------

def test_html_article_keeps_content_and_structure_drops_chrome(tmp_path):
    (rec,), _, _ = run(tmp_path, [ASSETS / "html" / "article.html"])
    text = rec["text"]
    assert text.startswith("# Tuning the learning rate for LoRA\n")
    assert "## A starting point" in text and "## Results" in text
    assert "- rank 8 or 16\n- alpha = 2 × rank" in text
    assert "```\nlr = 2e-4\nwarmup_steps = 10\n    indented_line = True\n```" in text  # code indentation kept
    assert "8 | 1.92" in text and "`lr_scheduler: cosine`" in text
    assert "so they tolerate a much higher" in text  # source line breaks inside <p> are spaces
    assert "cosine schedule & a short warmup" in text  # entities decoded
    for chrome in ("cookies", "Home", "About us", "Share on", "Related posts", "All rights reserved",
                   "Privacy", "dataLayer", "font-family", "Tags: lora", "tracking pixel"):
        assert chrome not in text, chrome


def test_html_declared_latin1_is_decoded_as_windows_1252_without_chrome(tmp_path):
    (rec,), _, _ = run(tmp_path, [ASSETS / "html" / "legacy_cp1252.html"])
    text = rec["text"]
    assert "# Café Müller – Über uns" in text
    assert "„Müller“" in text and "3,50 € pro Stück" in text and "Straße" in text
    assert "Ã" not in text and "\x80" not in text  # no mojibake, no C1 controls
    assert "Startseite" not in text and "Impressum" not in text


def test_html_folder_accounts_for_bad_pages(tmp_path):
    records, rejects, report = run(tmp_path, [ASSETS / "html"])
    assert report["records_in"] == 6 and report["records_out"] == 3
    # no_body.html is a redirect (meta refresh, a link in a <nav>): a stub, counted as one (issue 33)
    assert report["dropped"] == {"binary_file": 1, "redirect_stub": 1, "slop": 1}
    assert {Path(r["where"]).name for r in rejects} == {"binary.html", "no_body.html", "slop_post.html"}
    assert report["slop_phrases"] == {"as an ai language model": 1, "i do not have personal opinions": 1}


def test_html_glob_and_sections(tmp_path):
    records, _, _ = run(tmp_path, [str(ASSETS / "html" / "art*.html")], html_mode="sections")
    assert len(records) == 3
    # each section keeps the page title for context
    assert records[1]["text"].startswith("# Tuning the learning rate for LoRA\n\n## A starting point\n")
    assert "## Results" not in records[1]["text"] and "8 | 1.92" in records[2]["text"]


def test_html_css_selector_map_pairs_question_with_each_answer(tmp_path):
    mapping = (("instruction", ".question-title"), ("output", ".answer .post-body"))
    records, _, _ = run(tmp_path, [ASSETS / "html" / "qa.html"], mapping=mapping)
    assert [r["instruction"] for r in records] == ["How do I freeze the base model when training LoRA?"] * 2
    assert "get_peft_model" in records[0]["output"] and "modules_to_save" in records[1]["output"]


def test_html_css_selection_drops_chrome_inside_it_by_the_page_rules(tmp_path):
    page = tmp_path / "faq.html"
    page.write_text(
        "<html><body><h1 class='q'>How do I share a cache?</h1><div class='a'>"
        "<p>Point both runs at one <b>cache_dir</b>.</p><nav><a href='/prev'>Prev</a> | <a href='/next'>Next</a></nav>"
        "<div class='share-bar'><a href='/t'>Tweet this</a></div>"
        "<div class='sect2' id='cache-sharing'><h3>Sharing across machines</h3>"
        "<p>Use a network folder that every machine mounts at the same path.</p></div></div></body></html>")
    records, _, _ = run(tmp_path, [page], mapping=(("instruction", ".q"), ("output", ".a")))
    output = records[0]["output"]
    assert "Point both runs at one cache_dir." in output and "Prev" not in output and "Tweet" not in output
    # a titled section of prose whose id merely holds a chrome word stays, as on whole pages
    assert "### Sharing across machines" in output and "network folder" in output


def test_html_selector_matching_nothing_is_a_reject(tmp_path):
    mapping = (("instruction", "h1"), ("output", ".no-such-class"))
    out = tmp_path / "o.jsonl"
    with pytest.raises(DataError, match="nothing usable"):
        ingest([str(ASSETS / "html" / "qa.html")], out, IngestOptions(mapping=mapping))
    rejects = sidecar_paths(out)[0].read_text()
    assert "no element matches output" in rejects and not out.exists()


# --- CSV ---------------------------------------------------------------------------------------------

FAQ_MAP = (("instruction", "question"), ("output", "answer"))


def test_csv_mapping_multiline_fields_ragged_rows_and_exact_accounting(tmp_path):
    records, rejects, report = run(tmp_path, [ASSETS / "csv" / "faq.csv"], mapping=FAQ_MAP, unescape_html=True)
    assert report["records_in"] == 8 and report["records_out"] == 4
    assert report["dropped"] == {"duplicate": 1, "empty_field": 1, "ragged_row": 1, "slop": 1}
    assert records[0]["output"].endswith("frozen weights.\nIt cuts optimizer memory by orders of magnitude.")
    assert records[2]["instruction"] == 'What does "alpha" do?' and "r & keeps" in records[2]["output"]
    assert records[3] == {"instruction": 'How do I read a "quoted" value?', "input": "",
                          "output": 'Double the quote: "like this".'}
    ragged = next(r for r in rejects if r["reason"] == "ragged_row")
    assert ragged["where"].endswith("faq.csv line 5") and "expected 4 fields, saw 6" in ragged["detail"]


def test_csv_chunked_reading_gives_the_same_records(tmp_path):
    whole, _, _ = run(tmp_path / "a", [ASSETS / "csv" / "faq.csv"], mapping=FAQ_MAP)
    chunked, _, _ = run(tmp_path / "b", [ASSETS / "csv" / "faq.csv"], mapping=FAQ_MAP, chunk_rows=2)
    assert chunked == whole


def test_tsv_gz_with_template_and_latin1_csv(tmp_path):
    records, _, _ = run(tmp_path / "a", [ASSETS / "csv" / "notes.tsv.gz"], template="{title}\n\n{body}")
    assert records[0] == {"text": "Gradient checkpointing\n\nRecompute activations in the backward pass."}
    records, _, _ = run(tmp_path / "b", [ASSETS / "csv" / "recettes_latin1.csv"], delimiter=";",
                        mapping=(("instruction", "titre"), ("output", "texte")))
    assert records[0]["instruction"] == "Crème brûlée" and records[1]["output"].startswith("Pâte à choux")


def test_a_template_typed_on_the_command_line_gets_the_newlines_the_docs_show(tmp_path):
    # the shell passes `"{title}\n\n{body}"` with a backslash and an n; the same template in a recipe gives
    # newlines, and docs/ingestion.md shows the command-line form: both must write the same records
    from finetune.cli import main as cli_main

    out = tmp_path / "cli.jsonl"
    assert cli_main(["ingest", str(ASSETS / "csv" / "notes.tsv.gz"), "--template", r"{title}\n\n{body}",
                     "--map", "x=y", "-o", str(out), "--quiet"]) == 2  # (map and template: one or the other)
    assert cli_main(["ingest", str(ASSETS / "csv" / "notes.tsv.gz"), "--template", r"{title}\n\n{body}",
                     "-o", str(out), "--quiet"]) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first == {"text": "Gradient checkpointing\n\nRecompute activations in the backward pass."}
    assert cli_main(["ingest", str(ASSETS / "csv" / "notes.tsv.gz"), "--map", r"text={title}\n{body}",
                     "-o", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text().splitlines()[0])["text"].startswith("Gradient checkpointing\nRecompute")
    assert cli_main(["ingest", str(ASSETS / "csv" / "notes.tsv.gz"), "--template", r"{title}\\n{body}",
                     "-o", str(out), "--quiet"]) == 0  # an escaped backslash stays one backslash
    assert json.loads(out.read_text().splitlines()[0])["text"].startswith("Gradient checkpointing\\nRecompute")


def test_csv_missing_mapped_column_names_the_file_and_the_columns(tmp_path):
    with pytest.raises(DataError) as err:
        ingest([str(ASSETS / "csv" / "faq.csv")], tmp_path / "o.jsonl",
               IngestOptions(mapping=(("instruction", "question"), ("output", "reply"))))
    assert "faq.csv" in str(err.value) and "`reply`" in str(err.value) and "question, answer" in str(err.value)


def test_csv_without_mapping_suggests_one(tmp_path):
    with pytest.raises(DataError, match=r"--map instruction=id"):
        ingest([str(ASSETS / "csv" / "faq.csv")], tmp_path / "o.jsonl", IngestOptions())


def test_csv_empty_and_binary_files_are_clear_errors(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty.csv` is empty"):
        ingest([str(tmp_path / "empty.csv")], tmp_path / "o.jsonl", IngestOptions(template="{a}"))
    shutil.copy(ASSETS / "html" / "binary.html", tmp_path / "img.csv")
    with pytest.raises(DataError, match="img.csv` looks binary"):
        ingest([str(tmp_path / "img.csv")], tmp_path / "o.jsonl", IngestOptions(template="{a}"))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_csv_in_utf16_without_bom_is_text_not_binary(tmp_path, encoding):
    text = 'question,answer\n"Où est le café ?","Rue de l’Église — à gauche."\n"2+2?","4"\n'
    (tmp_path / "export.csv").write_bytes(text.encode(encoding))  # no BOM, as some Windows tools write
    records, _, report = run(tmp_path, [tmp_path / "export.csv"], mapping=(("instruction", "question"),
                                                                          ("output", "answer")))
    assert records[0] == {"instruction": "Où est le café ?", "input": "", "output": "Rue de l’Église — à gauche."}
    assert report["records_out"] == 2


def test_truncated_gzip_is_a_clear_error(tmp_path):
    data = (ASSETS / "csv" / "notes.tsv.gz").read_bytes()
    (tmp_path / "cut.tsv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut.tsv.gz"):
        ingest([str(tmp_path / "cut.tsv.gz")], tmp_path / "o.jsonl", IngestOptions(template="{title}"))


# --- SQL dumps ---------------------------------------------------------------------------------------

POSTS_MAP = (("instruction", "title"), ("output", "body"))


def test_mysql_dump_escapes_comments_and_create_table_columns(tmp_path):
    records, rejects, report = run(tmp_path, [ASSETS / "sql" / "mysql_dump.sql"], table="posts", mapping=POSTS_MAP)
    by_title = {r["instruction"]: r["output"] for r in records}
    assert by_title["Why warm up?"] == "Warmup keeps Adam's early steps small;\nwithout it the loss can spike."
    assert by_title["Semicolons; in text"] == 'A body with a semicolon; and a "quote" and a backslash \\\\ too.'
    assert by_title["Doubled quotes"] == "It's fine either way -- not a comment."
    assert "日本語" in by_title["Unicode"]
    assert report["dropped"] == {"empty_field": 1}  # `Empty body` has a NULL body
    assert "line 31" in rejects[0]["where"]


def test_mysql_dump_with_two_tables_needs_a_table(tmp_path):
    with pytest.raises(DataError) as err:
        ingest([str(ASSETS / "sql" / "mysql_dump.sql")], tmp_path / "o.jsonl", IngestOptions(mapping=POSTS_MAP))
    # every table with its row count (the whole dump is read), most rows first; nothing written
    assert str(err.value).endswith("has rows for 2 tables; choose one with --table (recipe: `table:`), e.g. "
                                   "--table posts:\n  posts  5 rows\n  users  2 rows")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DataError, match="no rows for table `post`; tables with rows: posts, users"):
        ingest([str(ASSETS / "sql" / "mysql_dump.sql")], tmp_path / "o.jsonl",
               IngestOptions(mapping=POSTS_MAP, table="post"))
    records, _, _ = run(tmp_path, [ASSETS / "sql" / "mysql_dump.sql"], table="users", template="{id}: {name}")
    assert records == [{"text": "1: ada"}, {"text": "2: linus"}]


def test_postgres_dump_copy_blocks_nulls_and_dollar_quotes(tmp_path):
    records, rejects, _ = run(tmp_path, [ASSETS / "sql" / "postgres_dump.sql"], normalize=False,
                              mapping=(("instruction", "question"), ("output", "answer"), ("input", "Tags")))
    assert [r["instruction"] for r in records] == ["What is a tokenizer?", "Tabs?", "Old question", "Inserted row"]
    assert records[0]["output"] == "It maps text to integer ids.\nSubword tokenizers split rare words."
    assert records[1]["output"] == "A tab\there and a backslash \\ here." and records[1]["input"] == ""
    assert records[3]["output"] == "It's standard SQL: ' doubles a quote, \\n is literal."
    assert [r["reason"] for r in rejects] == ["empty_field"]  # the \N answer


def test_sqlite_dump_multiline_strings(tmp_path):
    records, _, _ = run(tmp_path, [ASSETS / "sql" / "sqlite_dump.sql"], mapping=POSTS_MAP)
    assert records[1]["output"] == "She said 'hi'; then left."
    assert records[2] == {"instruction": "Multi\nline title", "input": "", "output": "Line one\nline two"}


def test_broken_dump_rejects_bad_statements_and_keeps_the_rest(tmp_path):
    records, rejects, report = run(tmp_path, [ASSETS / "sql" / "broken_dump.sql"], template="{txt}")
    assert records == [{"text": "good row one"}, {"text": "good row three"}]
    assert [(r["reason"], r["where"].split("broken_dump.sql ")[1]) for r in rejects] == [
        ("sql_syntax_error", "line 3"), ("ragged_row", "line 4 row 3"), ("sql_syntax_error", "line 5")]
    assert "truncated" in rejects[-1]["detail"]


def test_big_multi_row_insert_streams(tmp_path):
    rows = ",".join(f"({i},'title {i}','body with \\'quotes\\' and; semicolons {i}')" for i in range(3000))
    dump = tmp_path / "big.sql.gz"
    import gzip

    with gzip.open(dump, "wt") as fh:
        fh.write("-- MySQL dump\nCREATE TABLE `p` (`id` int, `title` text, `body` text);\n")
        fh.write(f"INSERT INTO `p` VALUES {rows};\nINSERT INTO `p` VALUES {rows};\n")
    records, _, report = run(tmp_path, [dump], mapping=POSTS_MAP)
    assert report["records_in"] == 6000 and report["dropped"] == {"duplicate": 3000}
    assert records[7]["output"] == "body with 'quotes' and; semicolons 7"


# --- SQLite files and database URLs ------------------------------------------------------------------

def make_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE qa (id INTEGER PRIMARY KEY, q TEXT, a TEXT, lang TEXT)")
    conn.execute("CREATE TABLE other (x)")
    conn.executemany("INSERT INTO qa (q, a, lang) VALUES (?, ?, ?)",
                     [("What is SFT?", "Supervised fine-tuning on demonstrations.", "en"),
                      ("Qu'est-ce que le RLHF ?", "Un apprentissage par renforcement guidé par des humains.", "fr"),
                      ("Empty?", None, "en")])
    conn.commit()
    conn.close()
    return path


def test_sqlite_file_with_query_and_table(tmp_path):
    db = make_sqlite(tmp_path / "data.db")
    qa = (("user", "q"), ("assistant", "a"))
    records, _, report = run(tmp_path, [db], table="qa", mapping=qa)
    assert report["records_in"] == 3 and report["dropped"] == {"empty_field": 1}
    assert records[0] == {"messages": [{"role": "user", "content": "What is SFT?"},
                                       {"role": "assistant", "content": "Supervised fine-tuning on demonstrations."}]}
    records, _, _ = run(tmp_path, [db], query="SELECT q, a FROM qa WHERE lang = 'fr'", mapping=qa)
    assert len(records) == 1 and records[0]["messages"][0]["content"].startswith("Qu'est-ce")


def test_sqlite_file_errors_and_read_only(tmp_path):
    db = make_sqlite(tmp_path / "data.db")
    with pytest.raises(DataError, match=r"2 tables \(other, qa\)"):
        ingest([str(db)], tmp_path / "o.jsonl", IngestOptions())
    with pytest.raises(DataError, match="query failed"):
        ingest([str(db)], tmp_path / "o.jsonl", IngestOptions(query="DELETE FROM qa", template="{q}"))
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM qa").fetchone()[0] == 3
    with pytest.raises(DataError, match="not a SQLite database"):
        ingest([str(ASSETS / "sql" / "sqlite_dump.sql")], tmp_path / "o.jsonl", IngestOptions(type="sqlite"))


def test_database_url_through_sqlalchemy(tmp_path):
    db = make_sqlite(tmp_path / "data.db")
    url = f"sqlite:///{db}"
    records, _, _ = run(tmp_path, [url], query="SELECT q, a FROM qa ORDER BY id",
                        mapping=(("instruction", "q"), ("output", "a")))
    assert [r["instruction"] for r in records] == ["What is SFT?", "Qu'est-ce que le RLHF ?"]
    with pytest.raises(DataError, match="query failed"):
        ingest([url], tmp_path / "o.jsonl", IngestOptions(query="DELETE FROM qa", template="{q}"))
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM qa").fetchone()[0] == 3


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_html_pages_parsed_in_worker_processes_come_back_in_order(tmp_path, monkeypatch, method):
    if method == "fork" and sys.platform != "linux":
        pytest.skip("fork workers are used on Linux only")
    monkeypatch.setattr("finetune.ingest.from_html.start_method", lambda: method)
    pages = tmp_path / "pages"
    pages.mkdir()
    template = (ASSETS / "html" / "article.html").read_text()
    for i in range(18):  # over PARALLEL_MIN_FILES
        (pages / f"p{i:02d}.html").write_text(template.replace("LoRA</h1>", f"LoRA, part {i}</h1>"))
    shutil.copy(pages / "p03.html", pages / "p03_copy.html")  # a duplicate: dedup stays in the parent
    shutil.copy(ASSETS / "html" / "slop_post.html", pages / "p99_slop.html")  # cleaned inside a worker
    shutil.copy(ASSETS / "html" / "binary.html", pages / "p98_binary.html")
    one, one_rejects, one_report = run(tmp_path / "one", [pages], workers=1)
    two, two_rejects, two_report = run(tmp_path / "two", [pages], workers=2)
    assert two == one and len(two) == 18 and "part 17" in two[-1]["text"]
    assert two_rejects == one_rejects and two_report == one_report
    assert two_report["dropped"] == {"duplicate": 1, "slop": 1, "binary_file": 1}
    assert sum(two_report["slop_phrases"].values()) >= 1


def test_html_worker_start_method_is_fork_only_when_safe():
    import subprocess

    probe = "import finetune.ingest.from_html as f; {}print(f.start_method())"
    plain = subprocess.run([sys.executable, "-c", probe.format("")], capture_output=True, text=True, check=True)
    with_torch = subprocess.run([sys.executable, "-c", probe.format("import torch; ")], capture_output=True,
                                text=True, check=True)
    assert plain.stdout.strip() == ("fork" if sys.platform == "linux" else "spawn")
    assert with_torch.stdout.strip() == "spawn"  # a training process: no fork under CUDA / OpenMP threads


def test_html_indentation_and_attributes_do_not_change_the_text(tmp_path):
    compact = ("<html><head><title>T</title></head><body><main><h1>Title</h1><p class='lead'>One <b>bold</b>"
               " word.</p><ul><li>a</li><li>b <code>x</code> <code>y</code></li></ul><pre>  keep\n    this</pre>"
               "<table><tr><td>1</td><td>2</td></tr></table><p>Tail<br>line</p></main></body></html>")
    pretty = ("<html>\n <head>\n  <title>T</title>\n </head>\n <body>\n  <main id='m'>\n   <h1>Title</h1>\n"
              "   <p class='lead'>One <b>bold</b> word.</p>\n   <ul>\n    <li>a</li>\n    <li>b <code>x</code> "
              "<code>y</code></li>\n   </ul>\n   <pre>  keep\n    this</pre>\n   <table>\n    <tr>\n     "
              "<td>1</td>\n     <td>2</td>\n    </tr>\n   </table>\n   <p>Tail<br>\n line</p>\n  </main>\n"
              " </body>\n</html>")
    (tmp_path / "a.html").write_text(compact)
    (tmp_path / "b.html").write_text(pretty)
    (a,), _, _ = run(tmp_path / "a", [tmp_path / "a.html"], dedup=False)
    (b,), _, _ = run(tmp_path / "b", [tmp_path / "b.html"], dedup=False)
    assert a == b
    assert a["text"] == "# Title\n\nOne bold word.\n\n- a\n- b `x` `y`\n\n```\n  keep\n    this\n```\n\n1 | 2\n\nTail\nline"


@pytest.mark.parametrize("paragraph, expected", [
    ("<p><b>A</b> <i>B</i> tail</p>", "A B tail"),
    ("<p> <b>A</b></p>", "A"),
    ("<p>\n<b>A</b></p>", "A"),
    ("<p><b>A</b><i>B</i></p>", "AB"),
    ("<div><p>x</p> <em>y</em> z</div>", "x\n\ny z"),
    ("<ul>\n <li> <a href='#'>f</a>(<em>x</em>) <span>returns</span> y</li>\n</ul>", "- f(x) returns y"),
])
def test_html_text_after_inline_markup_and_whitespace_survives(tmp_path, paragraph, expected):
    # strip_tags leaves unwrapped inline text as adjacent text nodes; clearing a blank one lost them all
    (tmp_path / "p.html").write_text(f"<html><body><main>{paragraph}</main></body></html>")
    (rec,), _, _ = run(tmp_path, [tmp_path / "p.html"])
    assert rec["text"] == expected


def make_site(root: Path) -> Path:
    """A documentation site as it is downloaded: pages (one gzipped) among its assets."""
    import gzip

    site = root / "site"
    (site / "api").mkdir(parents=True)
    page = ("<html><head><title>{0}</title></head><body><main><h1>{0}</h1><p>About {0}, in words.</p></main>"
            "</body></html>")
    (site / "index.html").write_text(page.format("Home page"))
    (site / "api" / "codec.htm").write_text(page.format("Codec reference"))
    (site / "api" / "old.html.gz").write_bytes(gzip.compress(page.format("Old reference").encode()))
    (site / "search_index.json").write_text('{"docs": [{"location": "index.html"}]}')
    (site / "theme.js").write_text("document.querySelector('p').innerHTML = '<p>not a page</p>';")
    (site / "theme.css").write_text("p { color: red }")
    (site / "conf.py").write_text("project = 'x'")
    (site / "robots.txt").write_text("User-agent: *")
    (site / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (site / ".git" / "objects").mkdir(parents=True)  # hidden: neither read nor listed
    (site / ".git" / "objects" / "ab12").write_bytes(b"x\x01")
    (site / ".git" / "page.html").write_text("<p>not part of the site</p>")
    return site


@pytest.mark.parametrize("forced", [[], ["--type", "html"]])
def test_html_folder_takes_its_pages_and_lists_the_skipped_assets(tmp_path, capsys, forced):
    from finetune.cli import main

    site = make_site(tmp_path)
    out = tmp_path / "out.jsonl"
    assert main(["ingest", str(site), "-o", str(out), "--quiet", *forced]) == 0
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert sorted(t.split("\n")[0] for t in texts) == ["# Codec reference", "# Home page", "# Old reference"]
    report = json.loads(sidecar_paths(out)[1].read_text())
    assert report["records_in"] == 3 and report["dropped_total"] == 0
    skipped = report["skipped_files"]
    assert skipped["total"] == 6
    assert {Path(f["path"]).name: f["why"] for f in skipped["files"]} == {
        "search_index.json": "not html (.json)", "theme.js": "not html (.js)", "theme.css": "not html (.css)",
        "conf.py": "not html (.py)", "robots.txt": "not html (.txt)", "logo.png": "not html (.png)"}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("skipped 6 files that are not of the source's type: ")
    assert "1 not html (.json)" in err[0] and str(sidecar_paths(out)[1]) in err[0]


def test_folder_without_pages_takes_every_known_type_and_names_what_it_cannot_read(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "one record"}\n')
    (folder / "b.csv").write_text("text\nanother record\n")
    (folder / "README.md").write_text("# notes")
    records, _, report = run(tmp_path, [folder])
    assert records == [{"text": "one record"}, {"text": "another record"}]
    assert report["skipped_files"]["by_reason"] == {"unknown type (.md)": 1}
    with pytest.raises(DataError, match=r"holds no files named like sql \(\.sql, compressed too"):
        ingest([str(folder)], tmp_path / "o.jsonl", IngestOptions(type="sql"))


def test_dump_without_table_lists_every_table_and_its_rows_at_the_cli(tmp_path):
    lines = ["CREATE TABLE a (id int, t text);", "INSERT INTO a VALUES (1,'x'),(2,'y');"]
    lines += [f"INSERT INTO t{i} VALUES " + ",".join(f"({j},'r')" for j in range(i)) + ";" for i in range(1, 13)]
    lines += ["COPY c (id, t) FROM stdin;", "1\tone", "2\ttwo", "3\tthree", "\\.", "INSERT INTO a VALUES (3,'z');"]
    (tmp_path / "dump.sql").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "finetune.cli", "ingest", str(tmp_path / "dump.sql"),
                           "--template", "{t}", "-o", str(tmp_path / "o.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "has rows for 14 tables; choose one with --table" in proc.stderr and "e.g. --table t12:" in proc.stderr
    assert "\n  t12  12 rows\n" in proc.stderr and "\n  a     3 rows\n" in proc.stderr  # a: rows at both ends
    assert "\n  c     3 rows\n" in proc.stderr and proc.stderr.rstrip().endswith("\n  t1    1 row")
    assert not (tmp_path / "o.jsonl").exists()


def test_dump_without_table_lists_the_tables_even_when_the_first_ones_columns_do_not_map(tmp_path):
    """A real dump's first table is rarely the data (users, migrations...): with no mapping that fits its columns,
    the answer is still the list of tables with their rows, not that one table's columns (issue 22 item 5)."""
    lines = ["CREATE TABLE migrations (id int, version text);", "INSERT INTO migrations VALUES (1,'v1');"]
    lines += ["CREATE TABLE posts (instruction text, output text);",
              "INSERT INTO posts VALUES ('q1','a1'),('q2','a2');"]
    lines += [f"INSERT INTO t{i} VALUES " + ",".join(f"({j},'r')" for j in range(i)) + ";" for i in range(1, 4)]
    (tmp_path / "dump.sql").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "finetune.cli", "ingest", str(tmp_path / "dump.sql"),
                           "-o", str(tmp_path / "o.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "has rows for 5 tables; choose one with --table" in proc.stderr, proc.stderr
    assert "\n  posts       2 rows\n" in proc.stderr and "\n  migrations  1 row" in proc.stderr
    assert "version" not in proc.stderr  # not the first table's columns
    assert not (tmp_path / "o.jsonl").exists()
    # one table whose columns do not map: that table's columns, as before
    (tmp_path / "one.sql").write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(DataError, match="has columns id, version; say which become the record"):
        ingest([str(tmp_path / "one.sql")], tmp_path / "o.jsonl", IngestOptions())
