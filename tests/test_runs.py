"""`finetune runs`: five real run folders (tests/runs_helpers.py: SFT with eval, DPO with eval under a folder name
carrying HTML, GRPO with a script-carrying sample, an SFT run that crashed at step 5, one stopped by Ctrl-C at step 3)
on one page, and twelve written by hand for what only the page shows.

The page's data and the server are checked here in Python; tests marked `browser` open the page in Debian's
headless Chromium and assert what a person sees (they skip when chromium / chromium-driver are absent:
`apt-get install chromium chromium-driver`). FINETUNE_SCREENSHOT=1 saves docs/img/runs.png from them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runs_helpers import CRASH_STEP, INTERRUPT_STEP, XSS_ANSWER, XSS_NAME, XSS_PROMPT, build_runs, synthetic_runs
from finetune.cli import main

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "runs.png"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    found = build_runs(root / "runs", tiny_model_dir)
    found["root"] = root / "runs"
    return found


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("page") / "runs.html"
    assert main(["runs", str(runs["root"]), "-o", str(out)]) == 0
    return out


def embedded(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="runs-data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def by_kind(data: dict, runs: dict) -> dict[str, dict]:
    paths = {str(p): kind for kind, p in runs.items()}
    return {paths[r["path"]]: r for r in data["runs"]}


# --- the page's data -------------------------------------------------------------------------------------------


def test_every_run_is_found_and_the_crashed_one_is_listed_as_crashed(runs, page):
    data = by_kind(embedded(page.read_text()), runs)
    assert set(data) == {"sft", "dpo", "grpo", "crashed", "interrupted"}
    assert {k: r["status"] for k, r in data.items()} == {"sft": "finished", "dpo": "finished", "grpo": "finished",
                                                          "crashed": "crashed", "interrupted": "interrupted"}
    assert [data[k]["summary"]["method"] for k in ("sft", "dpo", "grpo")] == ["sft", "dpo", "grpo"]
    crashed = data["crashed"]
    assert crashed["summary"]["steps"] == CRASH_STEP - 1  # from its last checkpoint's trainer_state.json
    assert [p[0] for p in crashed["curves"]["loss"]] == list(range(1, CRASH_STEP))
    assert crashed["settings"]["recipe.learning_rate"] == "0.01"
    assert data["dpo"]["name"] == f"{XSS_NAME}/out"
    for kind in ("sft", "dpo", "grpo"):  # the verdict is diagnosis.json's
        diagnosis = json.loads((runs[kind] / "diagnosis.json").read_text())
        assert data[kind]["diagnosis"]["verdict"] == diagnosis["verdict"]
    sft_eval = dict((row[0], row[1]) for row in data["sft"]["evaluation"]["rows"])
    report = json.loads((runs["sft"] / "eval" / "report.json").read_text())
    assert sft_eval["held-out loss"]["tuned"] == pytest.approx(report["heldout"]["sides"]["tuned"]["loss"])
    assert "reward accuracy" in dict((row[0], row[1]) for row in data["dpo"]["evaluation"]["rows"])
    assert {s["source"] for s in data["sft"]["samples"]} == {"eval"}
    assert any(a["text"] == XSS_ANSWER for s in data["grpo"]["samples"] for a in s["answers"])
    assert "rewards/margins" in data["dpo"]["curves"] and "reward" in data["grpo"]["curves"]
    sft_run = json.loads((runs["sft"] / "run.json").read_text())
    assert data["sft"]["curves"]["eval_loss"][0] == [0, 0.0, sft_run["eval_loss_before"]]  # before training
    assert data["sft"]["curves"]["eval_loss"][-1][2] == pytest.approx(sft_run["final_eval_loss"])


def test_a_run_stopped_by_an_error_or_ctrl_c_says_why_and_where_it_resumes(runs, page):
    """Issue 43, item 5: a stopped run's reason in its folder (stopped.json) and on the page; Ctrl-C is
    "interrupted" at its checkpoint's step (logging every 10 steps, its history's last step is 1)."""
    data = by_kind(embedded(page.read_text()), runs)
    crashed, stopped = data["crashed"], data["interrupted"]
    record = json.loads((runs["crashed"] / "stopped.json").read_text())
    assert record["kind"] == "error" and record["message"] == "RuntimeError: simulated crash (out of memory)"
    assert record["checkpoint"]["step"] == CRASH_STEP - 1
    assert crashed["stop"] == {"kind": "error", "message": record["message"]}
    assert "stopped on an error at step 4: RuntimeError: simulated crash (out of memory)" in crashed["status_reason"]
    assert f"last complete checkpoint at step {CRASH_STEP - 1}" in crashed["status_reason"]
    assert stopped["summary"]["steps"] == stopped["summary"]["checkpoint_step"] == INTERRUPT_STEP
    # every step's loss up to the checkpoint is in it (logged at step 1 only: the old page's step)
    assert [p[0] for p in stopped["curves"]["loss"]] == list(range(1, INTERRUPT_STEP + 1))
    assert stopped["status_reason"].startswith(f"interrupted at step {INTERRUPT_STEP}: checkpoint saved")
    # what it trains with, from recipe.resolved.yml (written when a run starts): plain values, paths, max_steps
    settings = crashed["settings"]
    assert settings["recipe.max_steps"] == "8" and settings["recipe.output_dir"].endswith("crashed/out")
    assert settings["recipe.datasets[0].path"].endswith("chat.jsonl")
    assert not [v for v in settings.values() if "DatasetSpec" in v or "path='" in v]


def test_a_stopped_run_without_a_checkpoint_says_so(tmp_path):
    from finetune.run_folder import OWNER_FILE
    from finetune.runs.read import read_run

    error, killed = tmp_path / "error", tmp_path / "killed"
    for folder in (error, killed):
        folder.mkdir()
        (folder / OWNER_FILE).write_text("{}")
    (error / "stopped.json").write_text(json.dumps({"kind": "error", "message": "ModelError: out of memory",
                                                    "step": 0, "checkpoint": None, "time": 0}))
    for folder, said in ((error, "stopped on an error at step 0: ModelError: out of memory"), (killed, "was killed")):
        run = read_run(folder, "r")
        assert run["status"] == "crashed" and said in run["status_reason"]
        assert "no checkpoint: `finetune train` with the same recipe starts it again" in run["status_reason"]
        assert "resumes" not in run["status_reason"] and run["summary"]["checkpoint_step"] is None


def test_settings_are_plain_rounded_and_list_sections_meet_on_one_row(runs, page, tmp_path):
    data = by_kind(embedded(page.read_text()), runs)
    grpo, sft = data["grpo"]["settings"], data["sft"]["settings"]
    assert grpo["recipe.rewards"] == "1 item (the recipe.rewards[i] rows)" and sft["recipe.rewards"] == "[]"
    assert grpo["recipe.rewards[0].function"].endswith("rewards.py:even_tokens")
    synthetic = synthetic_runs(tmp_path / "s", runs["sft"])
    from finetune.runs.read import read_run

    assert read_run(synthetic[0], "r")["settings"]["recipe.lora_dropout"] == "0.3"  # 0.1 + 0.2 = 0.30000000000000004


def test_each_run_writes_its_own_page_when_it_ends(runs):
    for kind in ("sft", "dpo", "grpo"):
        data = embedded((runs[kind] / "run.html").read_text())
        assert [r["path"] for r in data["runs"]] == [str(runs[kind])]
    sft = embedded((runs["sft"] / "run.html").read_text())["runs"][0]
    assert sft["evaluation"]["rows"]  # written after the recipe's eval: section ran
    assert not (runs["crashed"] / "run.html").exists()


def test_finetune_eval_later_refreshes_the_runs_own_page(runs, tmp_path):
    run = tmp_path / "sft"
    shutil.copytree(runs["sft"], run)
    before = embedded((run / "run.html").read_text())["runs"][0]["evaluation"]["rows"]
    assert "answers that ended" in [row[0] for row in before]
    assert main(["eval", str(run), "--generations", "0"]) == 0  # held-out loss alone this time
    after = embedded((run / "run.html").read_text())["runs"][0]
    assert [row[0] for row in after["evaluation"]["rows"]] == ["held-out loss", "held-out perplexity"]
    assert after["path"] == str(run.resolve())


def test_nothing_from_a_run_reaches_the_html_as_markup(page):
    html = page.read_text()
    for raw in (XSS_NAME, "<script>window.__pwned", XSS_PROMPT, "<img"):
        assert raw not in html  # as text, escaped: `\u003cimg src=x ...`
    assert html.count("<script") == 3 and html.count("</script>") == 3  # the data, uPlot, page.js
    names = [r["name"] for r in embedded(html)["runs"]]
    assert f"{XSS_NAME}/out" in names
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    scripts = re.search(r"script-src ([^;]+);", policy).group(1).split()
    assert len(scripts) == 2 and all(s.startswith("'sha256-") for s in scripts)  # no 'unsafe-inline' for scripts
    assert "default-src 'none'" in policy


def test_old_partial_and_damaged_run_folders_show_what_they_have(tmp_path):
    old = tmp_path / "old"
    old.mkdir()  # an older run.json: no plan, no method, a NaN loss in its history
    (old / "run.json").write_text(json.dumps({
        "recipe": {"base_model": "m", "adapter": "lora"}, "versions": {"torch": "2.0"}, "steps": 3,
        "log_history": [{"loss": 2.0, "step": 1}, {"loss": float("nan"), "step": 2}, {"loss": 1.5, "step": 3}]}))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "run.json").write_text('{"recipe": {"base_mod')  # cut short
    (damaged / "diagnosis.json").write_text(json.dumps({"verdict": "underfit", "reason": "r"}))
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("x")
    out = tmp_path / "page.html"
    assert main(["runs", str(tmp_path), "-o", str(out)]) == 0
    data = {r["name"]: r for r in embedded(out.read_text())["runs"]}
    assert set(data) == {"old", "damaged"}
    assert data["old"]["summary"]["steps"] == 3 and data["old"]["summary"]["method"] == "sft"
    assert data["old"]["curves"]["loss"] == [[1, None, 2.0], [3, None, 1.5]]  # the NaN is a gap
    assert data["old"]["settings"]["versions.torch"] == "2.0"
    assert data["damaged"]["diagnosis"]["verdict"] == "underfit"
    assert "damaged" in data["damaged"]["status_reason"]


def test_the_runs_verb_imports_no_heavy_library(runs, tmp_path):
    from test_cli_startup import run_cli

    result = run_cli("runs", str(runs["root"]), "-o", str(tmp_path / "page.html"))
    assert result["code"] == 0 and result["heavy"] == []  # no torch: it reads JSON files
    assert (tmp_path / "page.html").is_file()


def test_a_missing_folder_is_one_message_and_no_page(tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["runs", str(tmp_path / "nope"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no such folder" in err and "nope" in err and "Traceback" not in err
    assert not out.exists()


def test_a_run_whose_lock_is_held_by_a_live_process_is_training(tmp_path):
    from finetune.run_folder import LOCK_FILE, OWNER_FILE
    from finetune.runs.read import read_run

    (tmp_path / OWNER_FILE).write_text("{}")
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": 0, "command": "finetune train"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    assert read_run(tmp_path, "r")["status"] == "training"
    (tmp_path / LOCK_FILE).write_text(json.dumps({**holder, "pid": 2 ** 22 + 7}))  # a pid no process has
    assert read_run(tmp_path, "r")["status"] == "crashed"


def _get(url: str, host: str | None = None, method: str = "GET"):
    request = urllib.request.Request(url, method=method, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type"), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type"), err.read()


def test_serve_answers_the_page_and_fresh_data_on_loopback_only(runs, tmp_path):
    from finetune.runs.server import make_server

    watched = tmp_path / "watched"
    shutil.copytree(runs["sft"], watched / "a")
    server = make_server([watched], port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        base = f"http://127.0.0.1:{server.server_port}"
        status, kind, body = _get(base + "/")
        assert status == 200 and kind.startswith("text/html") and b'id="runs-data"' in body
        status, kind, body = _get(base + "/data.json")
        assert status == 200 and [r["name"] for r in json.loads(body)["runs"]] == ["a"]
        assert json.loads(body)["refresh_s"] > 0
        shutil.copytree(runs["grpo"], watched / "b")  # a run appears while the page is open: the next poll has it
        assert [r["name"] for r in json.loads(_get(base + "/data.json")[2])["runs"]] == ["a", "b"]
        assert _get(base + "/run.json")[0] == 404 and _get(base + "/../a/run.json")[0] == 404
        assert _get(base + "/", method="POST")[0] == 501
        assert _get(base + "/", host="evil.example:80")[0] == 403  # DNS rebinding
    finally:
        server.shutdown()
        server.server_close()


# --- in a real browser ---------------------------------------------------------------------------------------

browser = pytest.mark.browser


@pytest.fixture(scope="module")
def driver():
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads a driver
    profile = tempfile.mkdtemp(prefix="finetune-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 "--window-size=1400,1800"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield chrome
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def opened(driver, page):
    """The page freshly loaded in the module's browser (a test's clicks do not reach the next)."""
    driver.get(page.as_uri())
    assert driver.get_log("browser") == []  # loading it logged nothing; from here on, what the test causes
    return driver


def visible_texts(driver, css: str) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).filter(e => e.offsetParent !== null)"
        ".map(e => e.textContent)", css)


def legend(driver, metric: str) -> list[str]:
    return driver.execute_script(
        "const box = document.querySelector(`.chart[data-metric='${arguments[0]}']`);"
        "return Array.from(box.querySelectorAll('.u-legend .u-series .u-label')).slice(1).map(e => e.textContent)",
        metric)


@browser
def test_the_page_opens_from_file_with_no_request_and_no_error(driver, page, runs):
    driver.get_log("performance")  # what the browser did before (its own chrome:// pages)
    driver.get(page.as_uri())
    requests = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    # every request made for the page's document (the browser's own new-tab page loads alongside, not ours)
    urls = [m["params"]["request"]["url"] for m in requests if m["method"] == "Network.requestWillBeSent"
            and m["params"].get("documentURL") == page.as_uri()]
    assert urls == [page.as_uri()]  # the page itself and nothing else: no script, style, font or data fetched
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert driver.get_log("browser") == []  # no console error, no CSP violation
    rows = driver.execute_script("return Array.from(document.querySelectorAll('.runs-table tbody tr')).map(r => "
                                 "[r.querySelector('.name').textContent, r.dataset.status, "
                                 "(r.querySelector('.verdict .badge') || r.querySelector('.verdict')).textContent])")
    data = by_kind(embedded(page.read_text()), runs)
    shown = {name: (status, verdict) for name, status, verdict in rows}
    assert shown[data["crashed"]["name"]] == ("crashed", "no verdict")
    for kind in ("sft", "dpo", "grpo"):  # the badge says what diagnosis.json says
        verdict = json.loads((runs[kind] / "diagnosis.json").read_text())["verdict"]
        assert shown[data[kind]["name"]] == ("finished", verdict)


@browser
def test_curves_are_overlaid_one_series_per_run_on_every_axis(opened, page, runs):
    data = by_kind(embedded(page.read_text()), runs)
    everyone = sorted(r["name"] for r in data.values())
    assert sorted(legend(opened, "loss")) == everyone
    assert legend(opened, "rewards/margins") == [data["dpo"]["name"]]
    assert legend(opened, "reward") == [f"{data['grpo']['name']} \u00b7 mean", f"{data['grpo']['name']} \u00b7 std"]
    metrics = opened.execute_script("return Array.from(document.querySelectorAll('.chart')).map(c => c.dataset.metric)")
    assert metrics[:4] == ["loss", "eval_loss", "learning_rate", "grad_norm"]
    from selenium.webdriver.support.ui import Select

    for axis in ("epoch", "tokens", "step"):
        Select(opened.find_element("id", "x-axis")).select_by_value(axis)
        assert sorted(legend(opened, "loss")) == everyone or axis == "tokens"
    # tokens: the crashed run has no plan (no run.json), so it is named as missing from that axis
    opened.find_element("id", "log-y").click()
    opened.execute_script("const s = document.getElementById('smoothing'); s.value = '0.6';"
                          "s.dispatchEvent(new Event('input'))")
    assert sorted(legend(opened, "loss")) == everyone
    assert opened.get_log("browser") == []


@browser
def test_settings_show_only_what_differs_until_the_toggle(opened, page):
    data = embedded(page.read_text())["runs"]
    # a recipe key a run that recorded its recipe lacks is "(not set)" there (GRPO's rewards[0] in an SFT run)
    differing = {k for k in {k for r in data for k in r["settings"]}
                 if len({r["settings"].get(k, "(not set)") for r in data if k in r["settings"] or
                         k.startswith("recipe.")}) > 1}
    shown = set(visible_texts(opened, "table.settings tbody tr td:first-child"))
    assert shown == differing
    assert {"recipe.method", "recipe.learning_rate", "recipe.adapter"} <= shown
    assert "versions.torch" not in shown and "recipe.seed" not in shown  # equal in every run
    opened.find_element("id", "show-all").click()
    assert {"versions.torch", "recipe.seed"} <= set(visible_texts(opened, "table.settings tbody tr td:first-child"))
    opened.find_element("id", "show-all").click()
    assert set(visible_texts(opened, "table.settings tbody tr td:first-child")) == differing


@browser
def test_evaluations_side_by_side_with_deltas_against_the_baseline(opened, page, runs):
    from selenium.webdriver.support.ui import Select

    data = embedded(page.read_text())["runs"]
    kinds = by_kind({"runs": data}, runs)
    sft, dpo = data.index(kinds["sft"]), data.index(kinds["dpo"])

    def cells(metric):
        return opened.execute_script(
            "return Array.from(document.querySelectorAll(`.eval-table tr[data-metric='${arguments[0]}'] td`))"
            ".slice(1).map(td => td.textContent)", metric)

    def tuned(kind, metric):
        return dict((r[0], r[1]) for r in kinds[kind]["evaluation"]["rows"])[metric]["tuned"]

    Select(opened.find_element("id", "baseline")).select_by_value(str(dpo))
    held_out = cells("held-out loss")  # SFT's; a preference run reports reward accuracy instead
    assert held_out[sft] == f"{tuned('sft', 'held-out loss'):.4f}" and held_out[dpo] == "\u2014"
    assert cells("reward accuracy")[dpo] == str(int(tuned("dpo", "reward accuracy"))) or \
        cells("reward accuracy")[dpo].startswith(f"{tuned('dpo', 'reward accuracy'):.4f}")
    ended = cells("answers that ended")  # both runs answered 2 held-out prompts
    delta = tuned("sft", "answers that ended") - tuned("dpo", "answers that ended")
    assert ended[dpo] == str(tuned("dpo", "answers that ended"))  # the baseline: no delta
    assert ended[sft] == f"{tuned('sft', 'answers that ended')} ({'+' if delta >= 0 else ''}{delta})"
    Select(opened.find_element("id", "baseline")).select_by_value(str(sft))
    ended = cells("answers that ended")
    assert ended[sft] == str(tuned("sft", "answers that ended"))
    assert ended[dpo] == f"{tuned('dpo', 'answers that ended')} ({'+' if -delta >= 0 else ''}{-delta})"
    assert opened.get_log("browser") == []


@browser
def test_html_in_a_run_name_and_in_answers_stays_text_and_never_runs(opened, page, runs):
    assert opened.execute_script("return window.__pwned") is None
    names = opened.execute_script("return Array.from(document.querySelectorAll('.runs-table .name'))"
                                  ".map(e => e.textContent)")
    assert f"{XSS_NAME}/out" in names
    assert opened.execute_script("return document.querySelectorAll('main img').length") == 0
    def search_for(text):  # as typed: the page filters on each input event
        opened.execute_script("const s = document.getElementById('sample-search'); s.value = arguments[0];"
                              "s.dispatchEvent(new Event('input'))", text)

    opened.find_element("id", "sample-search").send_keys("__pwned=2")  # typed, key by key
    answers = visible_texts(opened, "#sample-list pre.answer")
    prompts = visible_texts(opened, "#sample-list pre.prompt")
    assert answers[0] == XSS_ANSWER and prompts == [XSS_PROMPT]
    assert opened.find_element("id", "sample-count").text.startswith("1 of ")
    search_for("no sample holds this text")
    assert visible_texts(opened, "#sample-list pre.answer") == []
    search_for("")
    assert len(visible_texts(opened, "#sample-list .sample")) == sum(len(r["samples"]) for r in
                                                                     embedded(page.read_text())["runs"])
    assert opened.execute_script("return window.__pwned") is None
    assert opened.get_log("browser") == []
    if os.environ.get("FINETUNE_SCREENSHOT"):  # docs/img/runs.png, the picture in docs/runs.md
        opened.execute_script("window.scrollTo(0, 0)")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        opened.save_screenshot(str(SCREENSHOT))


@browser
def test_a_stopped_run_shows_its_reason_and_the_step_it_resumes_from(opened, page, runs):
    data = by_kind(embedded(page.read_text()), runs)
    rows = opened.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('.runs-table tbody tr')).map(r => "
        "[r.querySelector('.name').textContent, [r.dataset.status, r.querySelector('.steps').textContent, "
        "(r.querySelector('.status-reason') || {}).textContent]]))")
    status, steps, reason = rows[data["crashed"]["name"]]
    assert status == "crashed" and steps == f"checkpoint at {CRASH_STEP - 1} of 8"
    assert "RuntimeError: simulated crash (out of memory)" in reason and "resumes from it" in reason
    status, steps, reason = rows[data["interrupted"]["name"]]
    assert status == "interrupted" and steps == f"checkpoint at {INTERRUPT_STEP} of 8"
    assert reason.startswith(f"interrupted at step {INTERRUPT_STEP}")
    assert rows[data["sft"]["name"]][2] is None  # a finished run: no reason line


@browser
def test_grpo_metrics_are_grouped_and_cut_completions_marked(opened, page, runs):
    data = by_kind(embedded(page.read_text()), runs)
    grpo = data["grpo"]["name"]
    metrics = opened.execute_script("return Array.from(document.querySelectorAll('.chart')).map(c => c.dataset.metric)")
    assert not [m for m in metrics if "even_tokens" in m or m.startswith("completions/m")]  # not one chart each
    assert {"rewards/*/mean", "rewards/*/std", "rewards/*/missing", "completions/length", "clip_ratio"} <= set(metrics)
    assert legend(opened, "rewards/*/mean") == [f"{grpo} \u00b7 even_tokens"]
    assert legend(opened, "reward") == [f"{grpo} \u00b7 mean", f"{grpo} \u00b7 std"]
    assert sorted(legend(opened, "completions/length")) == [f"{grpo} \u00b7 {m}" for m in ("max", "mean", "min")]
    marks = opened.execute_script(
        "return Array.from(document.querySelectorAll('#sample-list .sample')).filter(s => s.querySelector('.meta')"
        ".textContent.includes('GRPO')).map(s => s.querySelectorAll('.truncated-mark').length)")
    cut = [sum(line["truncated"]) for line in map(json.loads, (runs["grpo"] / "completions.jsonl").open())][-len(marks):]
    assert marks == cut and sum(cut) > 0 and marks[-1] == 0  # the last line (the script-carrying one) ended
    assert opened.get_log("browser") == []


@pytest.fixture(scope="module")
def synthetic_page(runs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    synthetic_runs(root / "runs", runs["sft"])
    out = root / "page.html"
    assert main(["runs", str(root / "runs"), "-o", str(out)]) == 0
    return out


def chart_attribute(driver, metric: str, name: str) -> str:
    return driver.execute_script("return document.querySelector(`.chart[data-metric='${arguments[0]}']`)"
                                 ".getAttribute(arguments[1])", metric, name)


@browser
def test_axes_read_right_for_small_constant_and_zero_values(driver, synthetic_page):
    """Issue 43, runs page: a constant learning rate of 5e-4 read "0.001", 2e-4..1e-3 "0.001 0.001 0.001 0", an
    all-zero metric drew on a 0-100 axis, and one logged value was one dot with no word why."""
    driver.get(synthetic_page.as_uri())
    ticks = chart_attribute(driver, "learning_rate", "data-y-ticks").split()
    assert "5e-4" in ticks and len(set(ticks)) == len(ticks) and "0.001" not in ticks, ticks
    assert chart_attribute(driver, "kl", "data-y-range") == "0 1"  # all zero: not 0 to 100
    notes = driver.execute_script("return Array.from(document.querySelectorAll(`.chart[data-metric='grad_norm'] "
                                  ".note.sparse`)).map(n => n.textContent)")
    assert notes == ["r00: 1 value in 6 steps: logged every 10 steps (logging_steps; the loss is kept at every step)"]
    assert driver.get_log("browser") == []


@browser
def test_twelve_runs_twelve_colours_an_unknown_verdict_says_why_and_the_baseline_has_an_evaluation(driver,
                                                                                                  synthetic_page):
    driver.get(synthetic_page.as_uri())
    colours = driver.execute_script("return Array.from(document.querySelectorAll('.runs-table .swatch'))"
                                    ".map(s => getComputedStyle(s).backgroundColor)")
    assert len(colours) == 12 and len(set(colours)) == 12
    reasons = driver.execute_script("return Array.from(document.querySelectorAll('.runs-table tbody tr')).map(r => "
                                    "(r.querySelector('.verdict-reason') || {}).textContent || null)")
    assert reasons[1] == "no reward was logged (set logging_steps lower than the step count)"
    assert reasons[0] is None  # no verdict at all: nothing to explain
    assert driver.find_element("id", "baseline").get_attribute("value") == "5"  # r05, the one with an evaluation
    assert driver.get_log("browser") == []


@browser
def test_the_served_page_shows_a_run_that_appears_without_a_reload(driver, runs, tmp_path):
    from finetune.runs.server import make_server

    watched = tmp_path / "watched"
    shutil.copytree(runs["sft"], watched / "first")
    server = make_server([watched], port=0, refresh_s=0.3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        driver.get(f"http://127.0.0.1:{server.server_port}/")
        names = "return Array.from(document.querySelectorAll('.runs-table .name')).map(e => e.textContent)"
        assert driver.execute_script(names) == ["first"]
        driver.execute_script("window.__same_document = true")  # gone if the page reloaded
        shutil.copytree(runs["grpo"], watched / "second")
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 10, poll_frequency=0.1).until(lambda d: d.execute_script(names) == ["first", "second"])
        assert driver.execute_script("return window.__same_document") is True
        assert sorted(legend(driver, "loss")) == ["first", "second"]
        assert driver.get_log("browser") == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_out_of_range_is_one_message(tmp_path, capsys):
    assert main(["runs", str(tmp_path), "--serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "--port 70000" in err and "Traceback" not in err
