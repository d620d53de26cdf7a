"""What this machine lacks to train a recipe, found once and said at once (finetune/train/preflight.py; issue 43
item 8, and the lm-eval task names left from the last round).

A new user's axolotl FSDP recipe, ported and run on a CPU: `validate` called it valid, then `train` spent 53 s
retrying the hub, died on a hub error cut mid-URL, then (with a local model) refused flash attention, then FSDP:
three runs for problems one `validate` can list."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from importlib.util import find_spec

import pytest
import torch
import yaml

from finetune.cli import main
from finetune.recipe import load_recipe
from test_fsdp import AXOLOTL_FSDP2, _port

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals of a machine without CUDA")


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """axolotl's FSDP2 example with `flash_attention: true`, ported as it is (base_model Qwen/Qwen3-8B, a hub id)."""
    root = tmp_path_factory.mktemp("ported")
    code, _, recipe = _port(root, AXOLOTL_FSDP2 + "flash_attention: true\n")
    assert code == 0 and recipe["attn_implementation"] == "flash_attention_2" and "fsdp" in recipe
    return root / "recipe.yml"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@cpu_only
def test_validate_lists_every_problem_of_this_machine_at_once(ported, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["validate", str(ported)]) == 2
    err = capsys.readouterr().err
    assert "is a valid recipe, but this machine cannot train it" in err and "Traceback" not in err
    assert "`fsdp` shards over GPU processes and this machine has no CUDA GPU" in err
    assert "`attn_implementation: flash_attention_2` needs a CUDA GPU" in err
    if find_spec("flash_attn") is None:
        assert "the flash-attn package is not installed" in err
    assert "`base_model`: `Qwen/Qwen3-8B` is a hub id, the local HF cache has no copy, and HF_HUB_OFFLINE is set" in err
    assert "hf download Qwen/Qwen3-8B" in err and "--recipe-only" in err
    assert main(["validate", str(ported), "--recipe-only"]) == 0  # the recipe itself is fine


@cpu_only
def test_train_stops_on_the_same_message_before_asking_the_hub(ported, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", str(ported)]) == 2
    err = capsys.readouterr().err
    assert "this machine cannot train it (4 problems)" in err or "this machine cannot train it (3 problems)" in err
    assert "Retrying" not in err and "no CUDA GPU" in err and "Qwen/Qwen3-8B" in err
    assert not (ported.parent / "outputs").exists()  # nothing written


def test_an_unreachable_hub_is_found_in_one_request_and_named_with_its_reason(ported, monkeypatch):
    from huggingface_hub import constants

    from finetune.train import preflight

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")  # connection refused
    hub = preflight.hub_state()
    assert not hub.reachable and hub.probed and f"the hub ({constants.ENDPOINT}) cannot be reached" in hub.why
    problems = preflight.hub_problems(load_recipe(ported), hub)
    assert len(problems) == 1 and problems[0].startswith("`base_model`: `Qwen/Qwen3-8B` is a hub id")
    assert f"cannot be reached from this machine (" in problems[0]


def _cache_model(cache, repo: str) -> None:
    """A model in the local HF cache, laid out as huggingface_hub leaves it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))


def test_a_cached_model_trains_offline_when_the_hub_is_unreachable_but_a_hub_dataset_cannot(
        ported, tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants

    from finetune.commands.train import _check_the_machine
    from finetune.train import preflight

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache_model(tmp_path / "hub", "Qwen/Qwen3-8B")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    recipe = load_recipe(ported, ["fsdp=false", "attn_implementation=sdpa"])
    with caplog.at_level("INFO", logger="finetune"):
        before = _check_the_machine(recipe, "recipe.yml")
    # the run's downloads would retry for ~50 s, then read the cache: it reads the cache at once
    assert before is False and constants.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == "1"
    assert "the run reads its model from the local HF cache" in caplog.text
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # a hub dataset's revision is asked of the hub on every run: no cache stands in for it
    hub = preflight.hub_state()
    problems = preflight.hub_problems(load_recipe(ported, ["datasets.0.path=tatsu-lab/alpaca"]), hub)
    assert len(problems) == 1 and problems[0].startswith("`datasets[0].path`: no file or folder `tatsu-lab/alpaca`")
    assert "hf download --repo-type dataset tatsu-lab/alpaca" in problems[0]


def test_the_hub_error_is_said_whole(make_recipe, monkeypatch):
    from finetune.errors import ModelError
    from finetune.model.loader import load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(make_recipe("chat", n=4, base_model="nobody/no-such-model"))
    with pytest.raises(ModelError) as err:
        load_tokenizer(recipe)
    # transformers' own message ends with the page on offline mode: it was cut at 200 characters, mid-URL
    assert "offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'" in str(err.value)


def test_a_launched_workers_load_recipe_does_not_import_lm_eval(make_recipe, tmp_path):
    """lm-eval's task lookup imports lm_eval and datasets (~0.9 s): asked where the machine is checked, once per
    run, not in each worker's load_recipe."""
    pytest.importorskip("lm_eval")
    path = make_recipe("chat", n=4, eval={"tasks": ["tiny_facts"]})
    probe = ("import sys\nfrom finetune.commands.train import checks_the_machine\nfrom finetune.recipe import "
             f"load_recipe\nload_recipe({str(path)!r})\nprint(checks_the_machine(), 'lm_eval' in sys.modules, "
             "'datasets' in sys.modules)")
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "FINETUNE_MACHINE_CHECKED": "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "False"]


@pytest.mark.parametrize("env,checks", [
    ({}, True),  # the process the user started: alone, or the launcher
    ({"WORLD_SIZE": "2", "RANK": "0", "FINETUNE_MACHINE_CHECKED": "1"}, False),  # finetune's launcher checked
    ({"WORLD_SIZE": "2", "RANK": "1"}, False),  # a worker of a bare `accelerate launch`: rank 0 checks
    ({"WORLD_SIZE": "2", "RANK": "0"}, True),
])
def test_one_process_of_a_run_checks_the_machine(env, checks, monkeypatch):
    from finetune.commands.train import checks_the_machine

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "FINETUNE_MACHINE_CHECKED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert checks_the_machine() is checks


def test_the_launcher_tells_its_workers_the_machine_is_checked(make_recipe, monkeypatch):
    from finetune.train import launch

    started = {}
    monkeypatch.setattr(launch.subprocess, "run", lambda command, env: started.update(env=env) or
                        subprocess.CompletedProcess(command, 0))
    args = launch.argparse.Namespace(recipe=make_recipe("chat", n=4), overrides=[], num_processes=2, num_machines=1,
                                     machine_rank=0, main_process_ip="127.0.0.1", main_process_port=29511)
    assert launch.launch(args, load_recipe(args.recipe)) == 0
    assert started["env"]["FINETUNE_MACHINE_CHECKED"] == "1"
