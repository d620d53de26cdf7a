"""The data stage: counts, length handling, the eval split, the cache and its invalidation, bad data."""

from __future__ import annotations

import json

import pytest

from conftest import make_records, write_jsonl
from finetune.data import build_dataset
from finetune.errors import DataError
from finetune.recipe import load_recipe


def prepare(recipe_path, tiny_tokenizer, *overrides):
    return build_dataset(load_recipe(recipe_path, list(overrides)), tiny_tokenizer)


def test_counts_and_split(make_recipe, tiny_tokenizer):
    prepared = prepare(make_recipe("chat", n=40, val_set_size=0.25), tiny_tokenizer)
    stats = prepared.stats
    assert stats["records"] == 40
    assert stats["train"]["examples"] == 30 and stats["eval"]["examples"] == 10
    assert len(prepared.train) == 30 and len(prepared.eval) == 10
    tokens = sum(len(x) for x in prepared.train["input_ids"])
    supervised = sum(sum(1 for t in x if t != -100) for x in prepared.train["labels"])
    assert stats["train"]["tokens"] == tokens and stats["train"]["supervised_tokens"] == supervised
    assert 0 < supervised < tokens


def test_split_is_reproducible_and_seeded(make_recipe, tiny_tokenizer, tmp_path):
    recipe = make_recipe("instruction", n=30, val_set_size=5)
    a = prepare(recipe, tiny_tokenizer).eval["input_ids"]
    b = prepare(recipe, tiny_tokenizer, "dataset_prepared_path=other").eval["input_ids"]
    c = prepare(recipe, tiny_tokenizer, "seed=7").eval["input_ids"]
    assert list(a) == list(b) and list(a) != list(c)


@pytest.mark.parametrize("strategy, kept, dropped, truncated", [("drop", 0, 24, 0), ("truncate", 24, 0, 24)])
def test_excess_length(make_recipe, tiny_tokenizer, strategy, kept, dropped, truncated):
    recipe = make_recipe("completion", n=24, sequence_len=3, excess_length_strategy=strategy, train_on_inputs=True)
    if kept == 0:
        with pytest.raises(DataError, match="24 over sequence_len 3"):
            prepare(recipe, tiny_tokenizer)
        return
    stats = prepare(recipe, tiny_tokenizer).stats
    assert stats["train"]["examples"] == kept and stats["dropped_too_long"] == dropped
    assert stats["truncated"] == truncated and stats["train"]["tokens"] == 3 * kept


def test_excess_length_error_names_the_fix(make_recipe, tiny_tokenizer):
    with pytest.raises(DataError, match="excess_length_strategy"):
        prepare(make_recipe("completion", sequence_len=3, excess_length_strategy="error"), tiny_tokenizer)


def test_truncated_prompt_without_response_counts_as_no_supervised_tokens(tmp_path, make_recipe, tiny_tokenizer):
    recipe = make_recipe("instruction", n=10, sequence_len=12, excess_length_strategy="truncate")
    with pytest.raises(DataError, match="10 with no supervised tokens"):
        prepare(recipe, tiny_tokenizer)


def test_cache_is_reused_and_invalidated_by_an_in_place_edit(make_recipe, tiny_tokenizer, tmp_path):
    recipe = make_recipe("instruction", n=12)
    first = prepare(recipe, tiny_tokenizer)
    again = prepare(recipe, tiny_tokenizer)
    assert not first.reused and again.reused and again.key == first.key
    # edit the data file in place: same path, same size class, new content
    data = tmp_path / "instruction.jsonl"
    records = make_records("instruction", 12)
    records[3]["output"] = "a completely different answer"
    write_jsonl(data, records)
    edited = prepare(recipe, tiny_tokenizer)
    assert not edited.reused and edited.key != first.key
    assert list(edited.train["input_ids"]) != list(first.train["input_ids"])
    # a field that changes tokenization changes the key; one that doesn't, doesn't
    assert prepare(recipe, tiny_tokenizer, "train_on_inputs=true").key != edited.key
    assert prepare(recipe, tiny_tokenizer, "learning_rate=0.1").key == edited.key


def test_interrupted_cache_write_is_not_loaded(make_recipe, tiny_tokenizer):
    from finetune.data import prepared_root

    recipe_path = make_recipe("completion", n=8)
    first = prepare(recipe_path, tiny_tokenizer)
    (prepared_root(load_recipe(recipe_path)) / first.key / "stats.json").unlink()  # as if killed mid-write
    import shutil

    shutil.rmtree(first.cache_path)
    assert not prepare(recipe_path, tiny_tokenizer).reused


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "no records"),
        (b'{"text": "ok"}\n{"text": oops}\n', "line 2, column 10: not valid JSON \\(expecting value, near `"),
        (b'{"text": "ok"}\n{"text": "never ends\n', "line 2, column 10: not valid JSON \\(unterminated string "
                                                    "starting at column 10, near `{\"text\": \"never ends`\\)"),
        (b"\x00\x01\x02binary", "looks binary"),
        ('{"text": "caf\xe9"}\n'.encode("latin-1"), "not UTF-8"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}\n', "no assistant turn"),
        (b'{"text": "ok"}\n{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}, '
         b'{"role": "user", "content": "and?"}, {"role": "assistant", "content": " "}]}\n',
         "line 2: messages\\[3\\] is an empty assistant turn: it would teach the model to answer with nothing"),
        (b'{"foo": 1}\n', "cannot tell the record's shape"),
    ],
)
def test_bad_data_gives_one_clear_message(make_recipe, tiny_tokenizer, tmp_path, content, needle):
    recipe = make_recipe("completion")
    (tmp_path / "completion.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=needle):
        prepare(recipe, tiny_tokenizer, "datasets.0.type=auto")


def test_missing_data_file(make_recipe, tiny_tokenizer):
    with pytest.raises(DataError, match="no data file at"):
        prepare(make_recipe("completion"), tiny_tokenizer, "datasets.0.path=nope.jsonl")


@pytest.mark.parametrize("shape", ["completion", "auto"])
def test_a_folder_without_records_files_says_what_is_in_it(make_recipe, tiny_tokenizer, tmp_path, shape):
    """A folder of JSONL/parquet shards is a dataset (tests/test_records_sources.py); one of HTML pages is not."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "page.html").write_text("<p>a</p>")
    with pytest.raises(DataError, match=r"`[^`]*data` is a folder with no records files \(page.html is in it\)"
                                        r".*`type: html`"):
        prepare(make_recipe("completion"), tiny_tokenizer, "datasets.0.path=data", f"datasets.0.type={shape}")


def test_json_list_files_and_auto_shape(tmp_path, make_recipe, tiny_tokenizer):
    recipe = make_recipe("completion")
    mixed = make_records("completion", 3) + make_records("chat", 2) + make_records("instruction", 2)
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    prepared = prepare(recipe, tiny_tokenizer, "datasets.0.path=mixed.json", "datasets.0.type=auto", "sequence_len=512")
    assert prepared.stats["train"]["examples"] == 7, prepared.stats


def test_preprocess_cli_prints_counts_and_marks_supervised_spans(make_recipe, capsys):
    from finetune.cli import main

    recipe = make_recipe("chat", n=6)
    assert main(["preprocess", str(recipe), "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "records: 6" in out and "train: 6 examples" in out
    example = out.split("--- example 0")[1].split("---\n", 1)[1]
    # the user turn is outside the marks, the assistant answer and its end-of-turn inside
    assert "<|im_start|>user\n" in example and "<|im_end|>\n]]" in example
    assert example.count("[[") == 2  # two assistant turns in each generated conversation
