"""Shared fixtures: a tiny model built in-process, record files, recipes. No test reaches the network."""

from __future__ import annotations

import gc
import json
import os
import random
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (the README's `-n 2`), each worker gets its share of the cores: two workers each using
# every core for torch's intra-op threads oversubscribe the machine and run slower than one.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_share)

from tiny import WORDS, build_tiny_model  # noqa: E402


_frozen_modules = 0


def _freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic collector's reach: the modules of torch, transformers, peft...
    (~600k objects) live for the whole session, and a full collection walks them all (~0.2 s each; a training
    run triggers several). Garbage is collected first, so only what is alive is frozen."""
    global _frozen_modules
    gc.collect()
    gc.freeze()
    _frozen_modules = len(sys.modules)


def pytest_collection_finish(session):
    _freeze_long_lived()  # collection imported the libraries the test files import at their top


def pytest_runtest_setup(item):
    # again when tests imported more libraries lazily (the Trainer, TRL, matplotlib...), or a test unfroze
    if len(sys.modules) - _frozen_modules > 200 or gc.get_freeze_count() == 0:
        _freeze_long_lived()


@pytest.fixture(autouse=True)
def _default_log_level():
    """Every test starts at the CLI's default verbosity: a `--quiet` run in one test file would otherwise silence
    the log lines a later file in the same process (a pytest-xdist worker) asserts on."""
    from finetune import log

    log.configure()
    yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def sentence(rng: random.Random, lo: int = 2, hi: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def make_records(shape: str, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    if shape == "completion":
        return [{"text": sentence(rng, 4, 16)} for _ in range(n)]
    if shape == "instruction":
        return [{"instruction": sentence(rng), "input": sentence(rng) if i % 2 else "", "output": sentence(rng)}
                for i in range(n)]
    return [{"messages": [{"role": "user", "content": sentence(rng)},
                          {"role": "assistant", "content": sentence(rng)},
                          {"role": "user", "content": sentence(rng)},
                          {"role": "assistant", "content": sentence(rng)}]} for _ in range(n)]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def make_recipe(tmp_path, tiny_model_dir):
    """Write a recipe for the tiny model next to a generated dataset; returns the recipe path."""

    def _make(shape: str = "instruction", n: int = 24, **overrides) -> Path:
        data = write_jsonl(tmp_path / f"{shape}.jsonl", make_records(shape, n))
        recipe = {
            "base_model": str(tiny_model_dir),
            "datasets": [{"path": data.name, "type": shape}],
            "sequence_len": 512,
            "micro_batch_size": 4,
            "num_epochs": 1,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "output_dir": "out",
            "cache_dir": "cache",
            "report_to": ["none"],
            "max_checkpoints": 1,
        }
        recipe.update(overrides)
        path = tmp_path / "recipe.yml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return _make


def resolved_training_arguments(recipe, prepared=None):
    """TrainingArguments exactly as run_training builds them: the process group, the counted data, the one
    resolution (finetune/train/settings.py), then the arguments."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.train.launch import start_process_group
    from finetune.train.arguments import training_arguments
    from finetune.train.settings import resolve

    state = start_process_group(recipe, cuda=False)
    prepared = prepared or build_dataset(recipe, load_tokenizer(recipe))
    return training_arguments(recipe, resolve(recipe, prepared, state.num_processes, cuda=False))
