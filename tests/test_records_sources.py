"""Records datasets beyond a JSONL file of our field names: sharegpt read as it is, `map:` / `roles:` field
mappings, parquet and arrow files, hub-shaped folders, save_to_disk folders, and a hub id offline."""

from __future__ import annotations

import json

import pytest
import yaml

from finetune.data import build_dataset
from finetune.errors import DataError, RecipeError
from finetune.recipe import load_recipe
from tests.conftest import make_records, write_jsonl


def sharegpt(n: int, human="human", gpt="gpt", key="conversations") -> list[dict]:
    return [{key: [{"from": human, "value": m["content"]} if m["role"] == "user" else
                   {"from": gpt, "value": m["content"]} for m in r["messages"]], "id": i}
            for i, r in enumerate(make_records("chat", n))]


def alpaca_rows(n: int) -> list[dict]:
    return [{"question": r["instruction"], "context": r["input"], "answer": r["output"]}
            for r in make_records("instruction", n)]


def recipe_with(tmp_path, tiny_model_dir, **dataset) -> object:
    recipe = {"base_model": str(tiny_model_dir), "datasets": [dataset], "sequence_len": 256, "micro_batch_size": 4,
              "num_epochs": 1, "learning_rate": 1e-3, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"]}
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(path)


def write_parquet(path, rows: list[dict]):
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))
    return path


def test_sharegpt_jsonl_reads_as_it_is(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_jsonl(tmp_path / "sg.jsonl", sharegpt(8))
    prepared = build_dataset(recipe_with(tmp_path, tiny_model_dir, path="sg.jsonl"), tiny_tokenizer)
    assert prepared.stats["records"] == 8 and prepared.stats["formats"] == {"chat": 8}


def test_conversation_mapping_and_roles(tmp_path, tiny_model_dir, tiny_tokenizer, capsys):
    rows = [{"dialog": [{"speaker": t["from"].replace("human", "me").replace("gpt", "bot"), "text": t["value"]}
                        for t in r["conversations"]], "sys": "Be brief."} for r in sharegpt(6)]
    write_jsonl(tmp_path / "d.jsonl", rows)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="d.jsonl", type="chat",
                         map={"messages": "dialog", "role": "speaker", "content": "text", "system": "sys"},
                         roles={"me": "user", "bot": "assistant"})
    prepared = build_dataset(recipe, tiny_tokenizer)
    assert prepared.stats["records"] == 6 and prepared.stats["formats"] == {"chat": 6}
    assert "records " in capsys.readouterr().err  # the report line: read / mapped
    written = next(p for p in (tmp_path / "cache" / "ingested").glob("records-*.jsonl")
                   if ".rejects" not in p.name).read_text().splitlines()
    first = json.loads(written[0])["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user", "assistant"]
    assert first[1]["content"] == rows[0]["dialog"][0]["text"]


def test_a_role_the_mapping_does_not_cover_is_one_error_naming_the_record(tmp_path, tiny_model_dir, tiny_tokenizer):
    rows = sharegpt(3)
    rows[2]["conversations"][1]["from"] = "bot"
    write_jsonl(tmp_path / "sg.jsonl", rows)
    with pytest.raises(DataError, match=r"line 3: conversations\[1\] has the role 'bot'.*`roles: \{bot: assistant\}`"):
        build_dataset(recipe_with(tmp_path, tiny_model_dir, path="sg.jsonl"), tiny_tokenizer)
    rows_ok = recipe_with(tmp_path, tiny_model_dir, path="sg.jsonl", roles={"bot": "assistant"})
    assert build_dataset(rows_ok, tiny_tokenizer).stats["records"] == 3


def test_parquet_file_with_instruction_mapping_counts_what_it_drops(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                     capsys):
    rows = alpaca_rows(10)
    rows[4]["answer"] = ""
    write_parquet(tmp_path / "qa.parquet", rows)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="qa.parquet", type="instruction",
                         map={"instruction": "question", "input": "context", "output": "answer"})
    prepared = build_dataset(recipe, tiny_tokenizer)
    assert prepared.stats["records"] == 9 and prepared.stats["formats"] == {"instruction": 9}
    err = capsys.readouterr().err
    assert "10 read, 9 mapped, 1 dropped (1 unmapped, e.g. row 5: `output` is empty" in err
    report = json.loads(next((tmp_path / "cache" / "ingested").glob("*.report.json")).read_text())
    assert report["records_read"] == 10 and report["dropped"] == {"unmapped": 1}
    from finetune.cli import main

    assert main(["preprocess", str(tmp_path / "recipe.yml"), "--show", "0"]) == 0
    assert f"  {tmp_path / 'qa.parquet'}: 9 records (read 10, kept 9, 1 unmapped)" in capsys.readouterr().out
    assert prepared.stats["sources"] == [{"path": str(tmp_path / "qa.parquet"), "records": 9, "read": 10, "kept": 9,
                                          "dropped": {"unmapped": 1}}]
    [reject] = [json.loads(line) for line in open(report["rejects"])]
    assert reject["where"].endswith("qa.parquet row 5") and reject["record"]["answer"] == ""


def test_a_mapped_column_that_is_not_there_is_named(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_parquet(tmp_path / "qa.parquet", alpaca_rows(3))
    recipe = recipe_with(tmp_path, tiny_model_dir, path="qa.parquet", map={"instruction": "prompt", "output": "answer"})
    with pytest.raises(DataError, match="column `prompt` .* does not exist; columns are: question, context, answer"):
        build_dataset(recipe, tiny_tokenizer)


def test_hub_shaped_parquet_folder_with_a_card_and_splits(tmp_path, tiny_model_dir, tiny_tokenizer):
    folder = tmp_path / "slimorca"
    write_parquet(folder / "data" / "train-00000-of-00002.parquet", sharegpt(6))
    write_parquet(folder / "data" / "train-00001-of-00002.parquet", sharegpt(4))
    write_parquet(folder / "data" / "test-00000-of-00001.parquet", sharegpt(3))
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# A dataset card\n")
    prepared = build_dataset(recipe_with(tmp_path, tiny_model_dir, path="slimorca"), tiny_tokenizer)
    assert prepared.stats["records"] == 10 and prepared.stats["formats"] == {"chat": 10}
    test_split = recipe_with(tmp_path, tiny_model_dir, path="slimorca", split="test")
    assert build_dataset(test_split, tiny_tokenizer).stats["records"] == 3


def test_a_folder_of_jsonl_shards(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_jsonl((tmp_path / "data").mkdir() or tmp_path / "data" / "part-1.jsonl", make_records("completion", 5))
    prepared = build_dataset(recipe_with(tmp_path, tiny_model_dir, path="data", type="completion"), tiny_tokenizer)
    assert prepared.stats["records"] == 5


def test_save_to_disk_folder_and_an_arrow_file(tmp_path, tiny_model_dir, tiny_tokenizer):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(make_records("instruction", 7)),
                 "validation": Dataset.from_list(make_records("instruction", 2))}).save_to_disk(str(tmp_path / "saved"))
    assert build_dataset(recipe_with(tmp_path, tiny_model_dir, path="saved"), tiny_tokenizer).stats["records"] == 7
    with pytest.raises(DataError, match="has the splits train, validation, not `test`"):
        build_dataset(recipe_with(tmp_path, tiny_model_dir, path="saved", split="test"), tiny_tokenizer)
    arrow = next((tmp_path / "saved" / "validation").glob("*.arrow"))
    prepared = build_dataset(recipe_with(tmp_path, tiny_model_dir, path=str(arrow)), tiny_tokenizer)
    assert prepared.stats["records"] == 2


def test_a_changed_parquet_file_is_never_read_from_a_stale_cache(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_parquet(tmp_path / "d.parquet", make_records("completion", 6))
    recipe = recipe_with(tmp_path, tiny_model_dir, path="d.parquet")
    first = build_dataset(recipe, tiny_tokenizer)
    assert build_dataset(recipe, tiny_tokenizer).reused
    write_parquet(tmp_path / "d.parquet", make_records("completion", 9, seed=1))
    again = build_dataset(recipe, tiny_tokenizer)
    assert not again.reused and again.key != first.key and again.stats["records"] == 9


def test_a_hub_id_offline_says_how_to_get_the_files_and_writes_nothing(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                        monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = recipe_with(tmp_path, tiny_model_dir, path="tatsu-lab/alpaca", type="instruction")
    assert recipe.datasets[0].path == "tatsu-lab/alpaca"  # an id, not resolved to a path beside the recipe
    with pytest.raises(DataError, match=r"hf download --repo-type dataset tatsu-lab/alpaca "
                                        r"--local-dir data/alpaca.*`path: data/alpaca`"):
        build_dataset(recipe, tiny_tokenizer)
    assert not (tmp_path / "cache" / "ingested").exists() and not (tmp_path / "cache" / "prepared").exists()
    from finetune.cli import main

    capsys.readouterr()
    assert main(["preprocess", str(tmp_path / "recipe.yml")]) == 2  # at the CLI: one paragraph, exit 2
    err = capsys.readouterr().err
    assert "hf download --repo-type dataset tatsu-lab/alpaca" in err and "Traceback" not in err
    assert not (tmp_path / "cache" / "ingested").exists() and not (tmp_path / "cache" / "prepared").exists()


def test_the_hub_id_path_asks_for_the_resolved_revision(tmp_path, tiny_model_dir, tiny_tokenizer, monkeypatch):
    """Up to where the network is needed: the commit the id resolves to keys the data, and load_dataset is asked
    for that commit, with the recipe's name, split and data_files."""
    import datasets
    from huggingface_hub import HfApi

    from finetune.ingest import from_dataset

    monkeypatch.setattr(from_dataset, "resolve_hub_revision", lambda spec: "c0ffee" + (spec.revision or ""))
    asked = []

    def fake_load(path, **kwargs):
        asked.append((path, kwargs))
        return datasets.Dataset.from_list(alpaca_rows(4))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="org/qa", name="main", split="train[:4]",
                         data_files=["a.parquet"], map={"instruction": "question", "output": "answer"})
    assert build_dataset(recipe, tiny_tokenizer).stats["records"] == 4
    assert asked == [("org/qa", {"name": "main", "split": "train[:4]", "data_files": ["a.parquet"],
                                 "revision": "c0ffee", "cache_dir": None, "download_mode": None})]
    assert HfApi  # the real resolver asks HfApi().dataset_info(id, revision).sha


@pytest.mark.parametrize("dataset, needle", [
    ({"path": "d.jsonl", "map": {"question": "q"}}, "`map` cannot name `question` for records"),
    ({"path": "d.jsonl", "map": {"prompt": "q", "output": "a"}}, "a prompt record maps only `prompt`"),
    ({"path": "d.jsonl", "map": {"messages": "c", "output": "a"}}, "mixes a conversation"),
    ({"path": "d.csv", "type": "csv", "roles": {"bot": "assistant"}}, "`roles` applies to records datasets"),
    ({"path": "d.jsonl", "roles": {"bot": "robot"}}, "robot"),
])
def test_bad_mapping_keys_are_recipe_errors(tmp_path, tiny_model_dir, dataset, needle):
    with pytest.raises(RecipeError, match=needle):
        recipe_with(tmp_path, tiny_model_dir, **dataset)


def test_hub_options_where_they_mean_nothing_are_an_error(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_parquet(tmp_path / "d.parquet", make_records("completion", 3))
    with pytest.raises(DataError, match="`split: test` does not apply to a single file"):
        build_dataset(recipe_with(tmp_path, tiny_model_dir, path="d.parquet", split="test"), tiny_tokenizer)
    with pytest.raises(DataError, match="`revision: v1` does not apply to a single file .* works with hub ids"):
        build_dataset(recipe_with(tmp_path, tiny_model_dir, path="d.parquet", revision="v1"), tiny_tokenizer)


def test_preference_pairs_from_parquet_read_as_they_are(tmp_path):
    """Preference records go through the same reader: a parquet file of sharegpt-style pairs comes out canonical."""
    from finetune.ingest.records import read_records
    from finetune.ingest.records_source import materialize_records
    from finetune.recipe.data import DatasetSpec

    pairs = [{"conversations": [{"from": "human", "value": f"q{i}"}], "chosen": {"from": "gpt", "value": f"yes {i}"},
              "rejected": {"from": "gpt", "value": f"no {i}"}} for i in range(3)]
    write_parquet(tmp_path / "pairs.parquet", pairs)
    out = materialize_records(DatasetSpec(path=str(tmp_path / "pairs.parquet")), str(tmp_path / "cache"))
    read = read_records(out)
    assert [shape for shape, _ in read] == ["preference"] * 3
    assert read[0][1]["chosen"][-1] == {"role": "assistant", "content": "yes 0"}


def test_a_system_column_of_instruction_data_replaces_the_alpaca_preamble(tmp_path, tiny_model_dir, tiny_tokenizer):
    from finetune.contract import alpaca_prompt

    assert alpaca_prompt({"instruction": "Add 2 and 2.", "system": "You are a calculator."}) == (
        "You are a calculator.\n\n### Instruction:\nAdd 2 and 2.\n\n### Response:\n")
    assert alpaca_prompt({"instruction": "Hi", "input": "x", "system": " "}).startswith("Below is an instruction")
    rows = [{**r, "sys": "You are terse." if i % 2 else ""} for i, r in enumerate(alpaca_rows(6))]
    write_parquet(tmp_path / "qa.parquet", rows)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="qa.parquet", type="instruction",
                         map={"instruction": "question", "input": "context", "output": "answer", "system": "sys"})
    prepared = build_dataset(recipe, tiny_tokenizer)
    assert prepared.stats["formats"] == {"instruction": 6}
    texts = [tiny_tokenizer.decode(ids) for ids in prepared.train["input_ids"]]
    assert sum("You are terse." in t for t in texts) == 3 and sum("Below is an instruction" in t for t in texts) == 3


def test_a_jsonl_field_absent_from_the_first_record_can_still_be_mapped(tmp_path, tiny_model_dir, tiny_tokenizer):
    rows = alpaca_rows(4)
    del rows[0]["context"]  # JSONL has no schema: an optional field may be missing from some records
    write_jsonl(tmp_path / "qa.jsonl", rows)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="qa.jsonl",
                         map={"instruction": "question", "input": "context", "output": "answer"})
    assert build_dataset(recipe, tiny_tokenizer).stats["formats"] == {"instruction": 4}


def test_a_folder_of_arrow_shards(tmp_path, tiny_model_dir, tiny_tokenizer):
    from datasets import Dataset

    Dataset.from_list(sharegpt(5)).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "shards" / "data").mkdir(parents=True)
    for arrow in (tmp_path / "saved").glob("*.arrow"):  # the arrow files alone, without save_to_disk's state.json
        (tmp_path / "shards" / "data" / "train-00000-of-00001.arrow").write_bytes(arrow.read_bytes())
    prepared = build_dataset(recipe_with(tmp_path, tiny_model_dir, path="shards"), tiny_tokenizer)
    assert prepared.stats["formats"] == {"chat": 5}


def test_a_hub_id_the_hub_does_not_answer_for_is_one_message(tmp_path, tiny_model_dir, tiny_tokenizer, monkeypatch):
    """Online, a failed lookup (no such dataset, gated, no connection) is the same one message, nothing written."""
    from huggingface_hub import HfApi

    from finetune.ingest import from_dataset

    def refuse(self, repo_id, revision=None):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(from_dataset, "_offline", lambda: False)
    monkeypatch.setattr(HfApi, "dataset_info", refuse)
    recipe = recipe_with(tmp_path, tiny_model_dir, path="data/train")  # a missing folder reads as a hub id
    with pytest.raises(DataError, match=r"no file or folder `data/train` is here .* asking the hub for it failed "
                                        r"\(ConnectionError: Failed to resolve 'huggingface.co'\); download it"):
        build_dataset(recipe, tiny_tokenizer)
    assert not (tmp_path / "cache" / "ingested").exists()


def test_counts_name_this_recipes_path_when_another_recipe_built_the_cache(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                           capsys):
    """Two recipes read the same bytes under different names through one cache: each recipe's counts (the prepared
    stats, the records line on stderr) name its own path, not the path of the recipe that filled the cache."""
    rows = alpaca_rows(6)
    name = "qa.parquet"  # the file's name enters its content hash: the same name, the same bytes, two folders
    for folder in ("first", "second"):
        write_parquet(tmp_path / folder / name, rows)
        recipe = {"base_model": str(tiny_model_dir), "sequence_len": 256, "micro_batch_size": 4, "output_dir": "out",
                  "cache_dir": str(tmp_path / "cache"), "report_to": ["none"],
                  "datasets": [{"path": name, "type": "instruction",
                                "map": {"instruction": "question", "input": "context", "output": "answer"}}]}
        (tmp_path / folder / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    capsys.readouterr()
    build_dataset(load_recipe(tmp_path / "first" / "recipe.yml"), tiny_tokenizer)
    capsys.readouterr()
    prepared = build_dataset(load_recipe(tmp_path / "second" / "recipe.yml"), tiny_tokenizer)
    assert prepared.reused  # the same content: the first recipe's cache entry
    assert [s["path"] for s in prepared.stats["sources"]] == [str(tmp_path / "second" / name)]
    err = capsys.readouterr().err
    assert f"records {tmp_path / 'second' / name} (cached)" in err and str(tmp_path / "first") not in err


def test_the_same_file_twice_counts_each_entry_once(tmp_path, tiny_model_dir, tiny_tokenizer):
    write_jsonl(tmp_path / "d.jsonl", make_records("instruction", 5))
    recipe = recipe_with(tmp_path, tiny_model_dir, path="d.jsonl")
    recipe = recipe.model_copy(update={"datasets": [recipe.datasets[0], recipe.datasets[0]]})
    prepared = build_dataset(recipe, tiny_tokenizer)
    assert [s["records"] for s in prepared.stats["sources"]] == [5, 5] and prepared.stats["records"] == 10


@pytest.mark.parametrize("method", ["dpo", "kto"])
def test_map_reads_axolotl_preference_pairs(tmp_path, tiny_model_dir, tiny_tokenizer, method):
    """Issue 33 item 9: axolotl's `{conversation, chosen, rejected}` pairs (its chat_template.default examples) with
    `map: {messages: conversation}` failed with '"chosen" is missing' on every record. The turns are the prompt, the
    pair is kept; other names for the answers map too (axolotl's field_chosen / field_rejected)."""
    rows = [{"conversation": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": f"q {i}"}],
             "better": {"role": "assistant", "content": f"yes {i}"}, "worse": f"no {i}"} for i in range(6)]
    write_jsonl(tmp_path / "pairs.jsonl", rows)
    recipe = {"base_model": str(tiny_model_dir), "method": method, "sequence_len": 256, "output_dir": "out",
              "cache_dir": "cache", "report_to": ["none"],
              "datasets": [{"path": "pairs.jsonl", "type": "preference",
                            "map": {"messages": "conversation", "chosen": "better", "rejected": "worse"}}]}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    prepared = build_dataset(load_recipe(tmp_path / "recipe.yml"), tiny_tokenizer)
    assert prepared.stats["records"] == 6 and prepared.stats["train"]["examples"] == 6 * (2 if method == "kto" else 1)
    written = next(p for p in (tmp_path / "cache" / "ingested").glob("records-*.jsonl") if ".rejects" not in p.name)
    first = json.loads(written.read_text().splitlines()[0])
    assert first == {"prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "q 0"}],
                     "chosen": [{"role": "assistant", "content": "yes 0"}],
                     "rejected": [{"role": "assistant", "content": "no 0"}]}


def test_map_renames_the_answers_of_plain_pairs_and_keeps_a_kto_label(tmp_path, tiny_model_dir, tiny_tokenizer):
    from finetune.ingest.records import read_records
    from finetune.ingest.records_source import materialize_records
    from finetune.recipe.data import DatasetSpec

    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Sky?", "good": " Blue.", "bad": " Green."}])
    out = materialize_records(DatasetSpec(path=str(tmp_path / "p.jsonl"), map={"chosen": "good", "rejected": "bad"}),
                              str(tmp_path / "cache"))
    assert read_records(out) == [("preference", {"prompt": "Sky?", "chosen": " Blue.", "rejected": " Green."})]
    write_jsonl(tmp_path / "k.jsonl", [{"dialog": [{"from": "human", "value": "Sky?"}, {"from": "gpt", "value": "Blue."}],
                                        "label": True}])
    out = materialize_records(DatasetSpec(path=str(tmp_path / "k.jsonl"), map={"messages": "dialog"}),
                              str(tmp_path / "cache"))
    assert read_records(out) == [("unpaired", {"prompt": [{"role": "user", "content": "Sky?"}],
                                               "completion": [{"role": "assistant", "content": "Blue."}],
                                               "label": True})]
