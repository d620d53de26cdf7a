"""The bad-input sweep: every malformed recipe or data file under tests/bad_inputs/ goes through the real CLI
in a subprocess and must give a clear message, exit code 2, no traceback, and nothing in output_dir.
Bad records that a run trains without (a case with `rejects:`, e.g. bad images) are counted rejects instead: each
one has its reason in the records report and the rejects file, every other record is kept, nothing is lost.

Recipe problems are instant (`validate` never imports torch); data problems are found before the model loads,
but each `train` subprocess pays the torch/transformers import, so three data cases go through the CLI (at the same
time) and the others through run_training in this process: same loader, same error, same message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

CORPUS = Path(__file__).parent / "bad_inputs"
EXPECTED = yaml.safe_load((CORPUS / "expected.yml").read_text())
# data cases run through the real CLI; the other data cases run in-process (see below)
CLI_DATA_CASES = ("binary_data", "empty_data", "chat_without_assistant")
RUNS = [(case, verb) for case, spec in EXPECTED.items() for verb in spec["verbs"]
        if spec["verbs"] != ["train"] or case in CLI_DATA_CASES]
IN_PROCESS = [case for case, spec in EXPECTED.items() if spec["verbs"] == ["train"] and case not in CLI_DATA_CASES]
REJECT_CASES = [case for case, spec in EXPECTED.items() if "rejects" in spec]


def test_every_case_in_the_corpus_is_listed():
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert folders == set(EXPECTED)


def copy_case(case: str, folder: Path, tiny_model_dir: Path) -> Path:
    shutil.copytree(CORPUS / case, folder)
    recipe = folder / "recipe.yml"
    recipe.write_bytes(recipe.read_bytes().replace(b"@TINY_MODEL@", str(tiny_model_dir).encode()))
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model_dir):
    """Run every (case, verb) once, in a copy of its folder, with the tiny model filled in."""
    root = tmp_path_factory.mktemp("bad_inputs")

    def run(case_verb):
        case, verb = case_verb
        folder = copy_case(case, root / f"{case}-{verb}", tiny_model_dir)
        recipe = folder / "recipe.yml"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "FINETUNE_CACHE_DIR": str(folder / "cache")}
        proc = subprocess.run([sys.executable, "-m", "finetune.cli", verb, str(recipe)], cwd=folder,
                              capture_output=True, text=True, timeout=600, env=env)
        return case_verb, (proc, folder)

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, RUNS))


@pytest.mark.parametrize("case, verb", RUNS, ids=[f"{c}-{v}" for c, v in RUNS])
def test_bad_input_is_refused_clearly(results, case, verb):
    proc, folder = results[(case, verb)]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    assert EXPECTED[case]["message"] in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("error:") == 1  # one readable paragraph
    assert not (folder / "out").exists()  # nothing half-written
    assert not (folder / "pwned").exists()  # the python/object tag did not run


@pytest.mark.parametrize("case", IN_PROCESS)
def test_bad_data_is_refused_before_the_model_loads(case, tmp_path, tiny_model_dir, monkeypatch):
    from finetune import train
    from finetune.errors import FinetuneError
    from finetune.recipe import load_recipe

    folder = copy_case(case, tmp_path / case, tiny_model_dir)
    monkeypatch.setenv("FINETUNE_CACHE_DIR", str(folder / "cache"))
    monkeypatch.setattr("finetune.model.build_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(FinetuneError) as err:
        train.run_training(load_recipe(folder / "recipe.yml"))
    assert err.value.exit_code == 2 and EXPECTED[case]["message"] in str(err.value)
    assert not (folder / "out").exists()


@pytest.mark.parametrize("case", REJECT_CASES)
def test_bad_records_are_counted_rejects_and_nothing_is_lost(case, tmp_path):
    """Read as the data stage reads them (finetune.data.record_files): each record ends where its `expect` says,
    every kept record's images load (RGB, inside the pixel budget) or are rejected by decoding as `on_load` says."""
    from PIL import Image

    from finetune.data import record_files
    from finetune.data.vision.images import ImageRejected, image_parts, load_image
    from finetune.recipe import load_recipe

    folder = copy_case(case, tmp_path / case, tmp_path / "no-model")
    for name, size in EXPECTED[case].get("generated", {}).items():
        Image.new("RGB", size, (200, 30, 30)).save(folder / name, quality=90)
    [(_, path)] = record_files(load_recipe(folder / "recipe.yml"))
    report = json.loads(Path(path).with_suffix(".report.json").read_text())
    rows = [json.loads(line) for line in (folder / "data.jsonl").read_text().splitlines()]
    rejects = {r["where"].rsplit(" line ", 1)[1]: r for r in map(json.loads, open(report["rejects"]))}
    assert report["dropped"] == EXPECTED[case]["rejects"]
    assert report["records_read"] == len(rows) == report["records_mapped"] + sum(report["dropped"].values())
    kept = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [r["expect"] for r in kept] == ["kept"] * report["records_mapped"]
    for lineno, row in enumerate(rows, start=1):
        if row["expect"] != "kept":
            assert rejects[str(lineno)]["reason"] == row["expect"] and rejects[str(lineno)]["detail"], lineno
    for record in kept:
        for part in image_parts(record):
            try:
                image = load_image(part, max_pixels=768 * 768)
            except ImageRejected as rejected:
                assert rejected.reason == record.get("on_load"), (part, rejected)
                continue
            assert "on_load" not in record and image.mode == "RGB" and image.width * image.height <= 768 * 768
