"""Security: YAML is loaded safely (see tests/bad_inputs/python_object_tag), trust_remote_code is off unless set
and loud when set, and secrets never reach run.json, the resolved recipe or an error message."""

from __future__ import annotations

import json
import subprocess
import sys

from finetune.recipe import load_recipe
from finetune.redact import redact, redact_text
from finetune.train import run_training

SECRET = "hunter2-very-secret"


def test_redact_masks_url_passwords_query_tokens_secret_keys_and_env_secrets(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    data = {"path": f"postgresql://bob:{SECRET}@db:5432/corpus", "query": f"https://h/x.jsonl?token={SECRET}&n=1",
            "password": SECRET, "eos_token": "</s>", "tokenizer_config": "tok", "supervised_tokens": 12,
            "note": ["key is 0123456789abcdef"]}
    out = json.dumps(redact(data))
    assert SECRET not in out and "0123456789abcdef" not in out
    assert "postgresql://bob:***@db:5432/corpus" in out and "</s>" in out and '"tokenizer_config": "tok"' in out
    assert redact_text("plain text, no secrets") == "plain text, no secrets"


def test_trust_remote_code_is_off_by_default_and_loud_when_on(make_recipe, capsys):
    from finetune.model import build_model

    assert load_recipe(make_recipe("completion", n=4)).trust_remote_code is False
    build_model(load_recipe(make_recipe("completion", n=4, trust_remote_code=True)))
    assert "trust_remote_code is ON" in capsys.readouterr().err


def test_secrets_stay_out_of_run_json_resolved_recipe_and_logs(make_recipe, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    recipe = load_recipe(make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=1,
                                     wandb_project=f"proj-{SECRET}"))
    run_training(recipe)
    out = tmp_path / "out"
    written = (out / "run.json").read_text() + (out / "recipe.resolved.yml").read_text()
    logs = capfd.readouterr()
    assert SECRET not in written and SECRET not in logs.out + logs.err
    assert json.loads((out / "run.json").read_text())["recipe"]["wandb_project"] == "proj-***"


def test_cli_never_prints_a_database_password(make_recipe, tmp_path):
    recipe = make_recipe("completion", n=4)
    url = f"postgresql://bob:{SECRET}@localhost:1/db"
    ok = subprocess.run([sys.executable, "-m", "finetune.cli", "validate", str(recipe), "--set",
                         f"datasets.0.path={url}", "--set", "datasets.0.type=database",
                         "--set", "datasets.0.table=docs"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert SECRET not in ok.stdout + ok.stderr and "postgresql://bob:***@localhost:1/db" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "finetune.cli", "validate", str(recipe), "--set", f"resume={url}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "no checkpoint folder" in bad.stderr
    assert SECRET not in bad.stderr and "bob:***@localhost" in bad.stderr
