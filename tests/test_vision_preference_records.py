"""Preference records with images (issue 39 item 5): every pair layout the text reader accepts, with its images in
the prompt, reads to one canonical form (the prompt's user turn holding canonical image parts, the answers text);
the images of a datasets Image column go into the records cache; what cannot be used is one message or a counted
reject with its reason. Reading stops at the records: tokenizing is tests/test_vision_preference.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.errors import DataError
from finetune.ingest.preference import RecordProblem, canonical
from finetune.ingest.records import read_records
from test_image_records import ASK, BLUE, RED, folder, png  # noqa: F401 (folder: the images beside the data)
from tests.conftest import write_jsonl


def read_canonical(folder: Path, method: str = "dpo", **dataset) -> tuple[list[dict], dict]:
    """The records the data stage reads for one dataset entry, and the records cache's report."""
    import yaml

    from finetune.data import record_files
    from finetune.recipe import load_recipe

    recipe = {"base_model": "tiny/model", "method": method, "datasets": [dataset], "output_dir": "out",
              "cache_dir": "cache"}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    [(_, path)] = record_files(load_recipe(folder / "recipe.yml"))
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return records, json.loads(Path(path).with_suffix(".report.json").read_text())


def turn(role: str, content) -> dict:
    return {"role": role, "content": content}


def placeholder_turn() -> dict:
    return turn("user", [{"type": "image"}, {"type": "text", "text": ASK}])


LAYOUTS = {
    # TRL's explicit prompt, the image as a part with a path relative to the data file
    "parts": {"prompt": [turn("user", [{"type": "image", "path": "images/red.png"}, {"type": "text", "text": ASK}])],
              "chosen": [turn("assistant", "red")], "rejected": [turn("assistant", "blue")]},
    # TRL's vision preference layout: an `images` column, {"type": "image"} placeholders; answers as text parts
    "trl": {"images": ["images/red.png"], "prompt": [placeholder_turn()],
            "chosen": [turn("assistant", [{"type": "text", "text": "red"}])], "rejected": [turn("assistant", "blue")]},
    # an `images` column and no placeholder: the images lead the first user turn (TRL's rule)
    "no placeholder": {"images": ["images/red.png"], "prompt": [turn("user", ASK)], "chosen": [turn("assistant", "red")],
                       "rejected": [turn("assistant", "blue")]},
    # LLaMA-Factory's sharegpt preference layout: `<image>` in the text, an `images` list
    "sharegpt": {"images": ["images/red.png"], "conversations": [{"from": "human", "value": f"<image>{ASK}"}],
                 "chosen": {"from": "gpt", "value": "red"}, "rejected": {"from": "gpt", "value": "blue"}},
    # TRL's implicit prompt: whole conversations sharing their first turns, the placeholder in each
    "implicit": {"images": ["images/red.png"], "chosen": [placeholder_turn(), turn("assistant", "red")],
                 "rejected": [placeholder_turn(), turn("assistant", "blue")]},
}


def test_every_pair_layout_reads_to_one_canonical_form(folder):
    write_jsonl(folder / "pairs.jsonl", list(LAYOUTS.values()))
    red = str(folder / "images" / "red.png")
    expected = {"prompt": [turn("user", [{"type": "image", "path": red}, {"type": "text", "text": ASK}])],
                "chosen": [turn("assistant", "red")], "rejected": [turn("assistant", "blue")]}
    read = read_records(folder / "pairs.jsonl")  # the reader without the data stage (`finetune eval --data`)
    assert [shape for shape, _ in read] == ["preference"] * len(LAYOUTS)
    for name, (_, record) in zip(LAYOUTS, read):
        assert record == expected, name
    records, report = read_canonical(folder, path="pairs.jsonl")  # the data stage: through the records cache
    assert records == [expected] * len(LAYOUTS) and report["images"] == len(LAYOUTS) and report["dropped"] == {}


def test_kto_examples_with_images_read_to_their_canonical_form(folder):
    rows = [{"images": ["images/blue.png"], "messages": [turn("user", f"<image>{ASK}"), turn("assistant", "blue")],
             "label": True},  # LLaMA-Factory's KTO layout
            {"images": ["images/blue.png"], "prompt": [turn("user", ASK)], "completion": [turn("assistant", "red")],
             "label": False}]
    write_jsonl(folder / "kto.jsonl", rows)
    blue = {"type": "image", "path": str(folder / "images" / "blue.png")}
    records, _ = read_canonical(folder, "kto", path="kto.jsonl", type="unpaired")
    assert [r["prompt"] for r in records] == [[turn("user", [blue, {"type": "text", "text": ASK}])]] * 2
    assert [(r["completion"], r["label"]) for r in records] == [([turn("assistant", "blue")], True),
                                                                ([turn("assistant", "red")], False)]


def test_a_datasets_image_column_of_pairs_is_written_into_the_cache(folder):
    from datasets import Dataset, Features, Image as ImageFeature, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    features = Features({"image": ImageFeature(), "prompt": List(message), "chosen": List(message),
                         "rejected": List(message)})
    rows = [{"image": {"bytes": png(colour), "path": None}, "prompt": [turn("user", ASK)],
             "chosen": [turn("assistant", name)], "rejected": [turn("assistant", other)]}
            for colour, name, other in ((RED, "red", "blue"), (BLUE, "blue", "red"), (RED, "red", "green"))]
    Dataset.from_list(rows, features=features).to_parquet(str(folder / "pairs.parquet"))
    records, report = read_canonical(folder, path="pairs.parquet", type="preference")
    assert report["records_mapped"] == 3 and report["images"] == 3
    stored = [r["prompt"][0]["content"][0]["path"] for r in records]
    assert len(set(stored)) == 2 and all(Path(p).parent == folder / "cache" / "ingested" / "images" for p in stored)
    assert [colour_of(p) for p in stored] == [RED, BLUE, RED]
    assert all("image" not in r for r in records)  # the images column is not kept as a field


def colour_of(path: str):
    from PIL import Image

    return Image.open(path).convert("RGB").getpixel((0, 0))


def test_what_a_pair_cannot_hold_is_one_message_naming_the_fix(folder):
    pair = LAYOUTS["parts"]
    cases = {
        "an image in an answer": ({**pair, "chosen": [turn("assistant", [{"type": "image", "path": "images/red.png"}])]},
                                  'chosen[0] holds an image (or a part that is not text): "chosen" is the model\'s '
                                  "answer, in text; images go in the prompt's user turn"),
        "a plain prompt": ({"prompt": ASK, "chosen": "red", "rejected": "blue", "images": ["images/red.png"]},
                           'a record with "images" needs a conversational prompt (a list of messages)'),
        "an assistant turn with an image": (
            {**pair, "prompt": [turn("user", "hi"), turn("assistant", [{"type": "image", "path": "images/red.png"}]),
                                turn("user", ASK)]},
            "prompt[1] is an assistant message with an image: images go in the user turns"),
    }
    for name, (record, message) in cases.items():
        write_jsonl(folder / "bad.jsonl", [record])
        with pytest.raises(DataError, match="bad.jsonl` line 1: " + _escaped(message)):
            read_records(folder / "bad.jsonl")
    with pytest.raises(RecordProblem, match=r"cleaning steps \(`type: records`\) read text only"):
        canonical(pair, "preference")  # the cleaning steps read no images: a reason, not a crash
    # list-content text (TRL's text layout) joins back into strings, images or not
    text = {"prompt": [turn("user", [{"type": "text", "text": ASK}])], "chosen": [turn("assistant", "red")],
            "rejected": [turn("assistant", [{"type": "text", "text": "blue"}])]}
    assert canonical(text, "preference") == {"prompt": [turn("user", ASK)], "chosen": [turn("assistant", "red")],
                                             "rejected": [turn("assistant", "blue")]}


def _escaped(message: str) -> str:
    import re

    return re.escape(message)


def test_bad_images_of_pairs_are_counted_rejects(folder):
    pair = LAYOUTS["trl"]
    rows = [pair, {**pair, "images": ["images/missing.png"]}, {**pair, "images": ["images/red.png", "images/blue.png"]},
            {**pair, "images": ["images/red.png"], "prompt": [turn("user", "no placeholder"), placeholder_turn(),
                                                              placeholder_turn()]}]
    write_jsonl(folder / "pairs.jsonl", rows)
    records, report = read_canonical(folder, path="pairs.jsonl")
    assert len(records) == 1 and report["dropped"] == {"missing_image": 1, "image_count_mismatch": 2}
    assert json.loads(Path(report["rejects"]).read_text().splitlines()[0])["reason"] == "missing_image"


def test_grpo_prompts_with_images_are_one_message_naming_what_trains_images(folder):
    write_jsonl(folder / "prompts.jsonl", [{"prompt": [placeholder_turn()], "images": ["images/red.png"]}])
    from finetune.ingest.records_source import materialize_records
    from finetune.recipe.data import DatasetSpec

    with pytest.raises(DataError, match=r"prompts.jsonl` line 1: a prompt record with images; GRPO does not read "
                                        r"images .*`method: sft`.*`method: dpo`"):
        materialize_records(DatasetSpec(path=str(folder / "prompts.jsonl")), str(folder / "cache"))
