"""One home per setting: every recipe field says what it affects, and the resume fingerprint, the tokenization
cache key and the ingest cache key are derived from that; ingestion options, their CLI flags and the planner
take names and defaults from the schema; output_dir with someone else's files is refused; atomic writes honour
the umask."""

from __future__ import annotations

import argparse
import json
import os
import stat
from dataclasses import fields

import pytest

from finetune.recipe import Recipe
from finetune.recipe.data import DatasetSpec
from finetune.recipe.tags import AFFECTS_TAGS, INGEST, TOKENS, field_affects, fields_affecting


@pytest.mark.parametrize("model", [Recipe, DatasetSpec])
def test_every_recipe_field_says_what_it_affects(model):
    unclassified = [name for name in model.model_fields if field_affects(model, name) is None]
    assert not unclassified, f"classify these fields with json_schema_extra=affects(...): {unclassified}"
    for name in model.model_fields:
        assert set(field_affects(model, name)) <= set(AFFECTS_TAGS), name


def test_fingerprint_and_cache_keys_come_from_the_schema():
    from finetune.data.cache import TOKENIZATION_FIELDS
    from finetune.ingest.options import OUTPUT_OPTIONS, spec_name
    from finetune.train.checkpoints import FINGERPRINT_FIELDS

    # the fields the hand-written list missed, and the ones a "train longer" resume may change
    for name in ("sample_packing", "learning_rate", "lr_scheduler", "warmup_steps", "weight_decay", "precision",
                 "lora_dropout", "micro_batch_size", "seed", "base_model"):
        assert name in FINGERPRINT_FIELDS, name
    for name in ("num_epochs", "max_steps", "output_dir", "logging_steps", "report_to", "checkpoint_interval",
                 "resume", "overwrite_output_dir"):
        assert name not in FINGERPRINT_FIELDS, name
    assert TOKENIZATION_FIELDS == fields_affecting(Recipe, TOKENS)
    assert {"sequence_len", "train_on_inputs", "chat_template", "val_set_size"} <= set(TOKENIZATION_FIELDS)
    assert {spec_name(o) for o in OUTPUT_OPTIONS} == set(fields_affecting(DatasetSpec, INGEST))


def test_ingest_options_take_their_defaults_from_the_recipe_schema():
    from finetune.ingest.options import RUN_ONLY, IngestOptions, as_option, spec_name

    for f in fields(IngestOptions):
        if f.name in RUN_ONLY or f.name == "type":  # type: None means "infer", the recipe's `auto` a records file
            continue
        spec_field = DatasetSpec.model_fields[spec_name(f.name)]
        assert f.default == as_option(f.name, spec_field.get_default(call_default_factory=True)), f.name
    ingest_fields = set(fields_affecting(DatasetSpec, INGEST))
    assert ingest_fields <= {spec_name(f.name) for f in fields(IngestOptions)}


def test_a_recipe_dataset_entry_becomes_options_field_by_field():
    from finetune.ingest.options import IngestOptions

    spec = DatasetSpec(path="site/", type="html", map={"text": "main"}, html_mode="sections", html_split_level=3,
                       encoding="latin-1", slop="strip", slop_phrases=["as a large model"], slop_file="p.txt",
                       slop_builtin=False, normalize=False, dedup=False, near_dedup=0.9, min_chars=5,
                       max_chars=900, strict=True)
    opts = IngestOptions.from_spec(spec)
    assert opts == IngestOptions(type="html", mapping=(("text", "main"),), html_mode="sections", html_split_level=3,
                                 encoding="latin-1", slop="strip", slop_phrases=("as a large model",),
                                 slop_files=("p.txt",), slop_builtin=False, normalize=False, dedup=False,
                                 near_dedup=0.9, min_chars=5, max_chars=900, strict=True)
    # every output option is in the cache key: changing any one changes the fingerprint
    assert IngestOptions.from_spec(spec.model_copy(update={"html_split_level": 2})).fingerprint() != opts.fingerprint()


def _ingest_parser() -> argparse.ArgumentParser:
    from finetune.commands.ingest import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_ingest_option_has_a_flag_with_the_schema_default():
    from finetune.commands.ingest import options_from_args
    from finetune.ingest.options import IngestOptions

    parser = _ingest_parser()
    dests = {action.dest for action in parser._actions}
    missing = [f.name for f in fields(IngestOptions) if f.name not in dests]
    assert not missing, f"ingest options without a `finetune ingest` flag: {missing}"
    parsed = options_from_args(parser.parse_args(["x.csv", "-o", "o.jsonl", "--workers", "1"]))
    assert parsed == IngestOptions()  # no flag given: exactly the schema's defaults


def test_old_and_new_ingest_flag_spellings_agree():
    from finetune.commands.ingest import options_from_args

    parser = _ingest_parser()
    old = options_from_args(parser.parse_args(["x.sql", "--dialect", "mysql", "--split-level", "3",
                                               "--slop-phrases", "f.txt", "--map", "text=body"]))
    new = options_from_args(parser.parse_args(["x.sql", "--sql-dialect", "mysql", "--html-split-level", "3",
                                               "--slop-file", "f.txt", "--map", "text=body"]))
    assert old == new and old.sql_dialect == "mysql" and old.html_split_level == 3
    assert old.slop_files == ("f.txt",) and old.mapping == (("text", "body"),)


def test_plan_knobs_are_recipe_fields_with_schema_defaults(tiny_model_dir):
    from finetune.commands.plan import KNOBS, _knobs

    assert set(KNOBS.values()) <= set(Recipe.model_fields)
    args = argparse.Namespace(gpu=None, **{flag: None for flag in KNOBS})
    knobs = _knobs(args, None)
    assert knobs["lora_r"] == Recipe.model_fields["lora_r"].default
    assert knobs["seq_len"] == Recipe.model_fields["sequence_len"].default
    assert knobs["micro_batch_size"] == Recipe.model_fields["micro_batch_size"].default


# --- output_dir: ours or someone else's -------------------------------------------------------------------------


def test_output_dir_with_someone_elses_files_is_refused_before_anything_is_written(make_recipe, tmp_path):
    from finetune.errors import RecipeError
    from finetune.recipe import load_recipe

    recipe = make_recipe("completion", n=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "run.json").write_text('{"mine": true}\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    message = str(err.value)
    assert "README.md, run.json" in message and "output_dir" in message and "overwrite_output_dir: true" in message
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "run.json"]
    assert load_recipe(recipe, ["overwrite_output_dir=true"]).overwrite_output_dir is True
    assert load_recipe(recipe, [f"output_dir={tmp_path / 'fresh'}"])  # a new folder is fine


def test_a_finetune_run_folder_is_recognised_even_after_a_crash(make_recipe, tmp_path):
    from finetune.recipe import load_recipe
    from finetune.run_folder import OWNER_FILE, foreign_entries
    from finetune.train.checkpoints import claim_output_dir as claim

    recipe = make_recipe("completion", n=4)
    out = tmp_path / "out"
    claim(out)  # what a run does first; then it crashed before writing anything else
    (out / "checkpoint-3").mkdir()
    assert (out / OWNER_FILE).is_file() and foreign_entries(out) == []
    assert load_recipe(recipe).output_dir == str(out)
    # a folder from before the owner file: recognised by finetune's run.json
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "README.md").write_text("model card")
    (legacy / "run.json").write_text(json.dumps({"recipe": {}, "versions": {}, "steps": 3}))
    assert foreign_entries(legacy) == []
    (legacy / "run.json").write_text(json.dumps({"steps": 3}))
    assert foreign_entries(legacy) == ["README.md", "run.json"]


# --- permissions ------------------------------------------------------------------------------------------------


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_outputs_honour_the_umask(tmp_path, umask_022):
    from finetune.atomic import temp_dir
    from finetune.ingest.options import IngestOptions
    from finetune.ingest.pipeline import ingest, sidecar_paths
    from finetune.ingest.records import write_jsonl_atomic

    write_jsonl_atomic(tmp_path / "records.jsonl", [{"text": "hello there"}])
    assert mode(tmp_path / "records.jsonl") == 0o644
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a record long enough"}\n')
    ingest([str(src)], tmp_path / "clean.jsonl", IngestOptions())
    rejects, report = sidecar_paths(tmp_path / "clean.jsonl")
    assert [mode(p) for p in (tmp_path / "clean.jsonl", rejects, report)] == [0o644] * 3
    assert mode(temp_dir(tmp_path / "merged")) == 0o755  # merged models and converted GGUF folders



def test_safetensors_files_honour_the_umask(tmp_path, umask_022):
    import torch
    from safetensors.torch import save_file

    from finetune.atomic import honour_umask

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    # compat record (finetune/atomic.py): safetensors 0.8.0 writes 0600 whatever the umask (safetensors#782).
    # When this fails, a release honours the umask again and honour_umask() can go.
    assert mode(tmp_path / "model.safetensors") == 0o600
    honour_umask(tmp_path)
    assert mode(tmp_path / "model.safetensors") == 0o644
