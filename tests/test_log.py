"""finetune's messages: `[finetune] ...` on the stderr of the moment, warnings marked, the main process
only (unless asked), --quiet / --verbose on the CLI before or after the verb."""

from __future__ import annotations

import logging

import pytest

from finetune import log
from finetune.cli import main as cli_main
from finetune.recipe import load_recipe


@pytest.fixture(autouse=True)
def default_level(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", log.ALL_RANKS_ENV):
        monkeypatch.delenv(name, raising=False)
    log.configure()
    yield
    log.configure()


def test_messages_and_warnings_look_as_before(capsys):
    logger = log.get_logger("finetune.some.module")
    logger.info("data: 3 records")
    logger.warning("loss spike")
    assert capsys.readouterr().err.splitlines() == ["[finetune] data: 3 records", "[finetune] WARNING: loss spike"]


def test_only_the_main_process_speaks_unless_asked(capsys, monkeypatch):
    logger = log.get_logger("finetune.x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    logger.warning("from rank 1")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(log.ALL_RANKS_ENV, "1")
    logger.info("from rank 1")
    assert capsys.readouterr().err == "[finetune rank 1] from rank 1\n"
    monkeypatch.delenv(log.ALL_RANKS_ENV)
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "1")  # a launcher that sets only the local rank
    logger.info("from local rank 1")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, level", [
    (["--quiet", "schema"], logging.WARNING),
    (["schema", "-q"], logging.WARNING),
    (["--verbose", "schema"], logging.DEBUG),
    (["schema", "--verbose"], logging.DEBUG),
    (["schema"], logging.INFO),
])
def test_quiet_and_verbose_before_or_after_the_verb(argv, level, capsys):
    assert cli_main(argv) == 0
    assert logging.getLogger("finetune").level == level
    assert capsys.readouterr().out.startswith("{")  # the verb's result still goes to stdout


def test_quiet_hides_progress_but_not_warnings(capsys):
    log.configure(quiet=True)
    logger = log.get_logger("finetune.x")
    logger.info("progress")
    logger.warning("careful")
    assert capsys.readouterr().err == "[finetune] WARNING: careful\n"


def test_model_building_messages_are_printed_once_not_per_process(make_recipe, capfd, monkeypatch):
    from finetune.model import build_model

    recipe = load_recipe(make_recipe("completion", n=4, adapter="lora", gradient_checkpointing="full"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    build_model(recipe)
    main = capfd.readouterr().err
    assert "[finetune] trainable parameters:" in main and "[finetune] gradient checkpointing: full" in main
    monkeypatch.setenv("RANK", "1")
    build_model(recipe)
    other = capfd.readouterr().err
    assert "trainable parameters" not in other and "gradient checkpointing" not in other
