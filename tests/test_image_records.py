"""Chat records with images, from every source SFT reads, in every layout, to one canonical form
(finetune/ingest/record_images.py): parts with an absolute `path` (or `base64`), images of a datasets Image
column written once into the records cache, text-only records beside them as they were. Reading stops at the
records (finetune.data.record_files): encoding images is the vision data stage's."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from finetune.data import record_files
from finetune.errors import DataError, RecipeError
from finetune.ingest.records import read_records
from finetune.recipe import load_recipe
from tests.conftest import write_jsonl

RED, BLUE = (255, 0, 0), (0, 0, 255)
ASK = "What colour is it?"


def png(colour, size=(4, 4)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "red.png").write_bytes(png(RED))
    (tmp_path / "images" / "blue.png").write_bytes(png(BLUE))
    return tmp_path


def read_canonical(folder: Path, **dataset) -> tuple[list[dict], dict]:
    """The records the data stage reads for one dataset entry, and the ingest report (None for a plain file)."""
    recipe = {"base_model": "tiny/model", "datasets": [dataset], "output_dir": "out", "cache_dir": "cache"}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    [(_, path)] = record_files(load_recipe(folder / "recipe.yml"))
    report = Path(path).with_suffix(".report.json")
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return records, json.loads(report.read_text()) if report.is_file() else None


def user_turn(record: dict) -> list:
    return next(m["content"] for m in record["messages"] if m["role"] == "user")


def image(path: str) -> dict:
    return {"type": "image", "path": path}


def chat(content, answer="red") -> dict:
    return {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]}


def test_every_layout_in_a_jsonl_file_reads_to_canonical_parts(folder):
    red, blue = str(folder / "images" / "red.png"), str(folder / "images" / "blue.png")
    b64 = base64.b64encode(png(RED)).decode()
    rows = [
        chat([image("images/red.png"), {"type": "text", "text": ASK}]),  # a path relative to the data file
        chat([{"type": "image", "base64": b64}, {"type": "text", "text": ASK}]),
        chat([{"type": "image", "image": "images/red.png"}, {"type": "text", "text": ASK}]),
        chat([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
              {"type": "text", "text": ASK}]),
        # TRL: placeholders filled in order from `images`
        {**chat([{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]),
         "images": ["images/red.png", "images/blue.png"]},
        # LLaMA-Factory sharegpt: <image> in the text, an `images` list
        {"conversations": [{"from": "human", "value": f"<image>{ASK}"}, {"from": "gpt", "value": "red"}],
         "images": ["images/red.png"]},
        # images and no placeholder: they lead the first user turn (TRL's rule)
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
                      {"role": "assistant", "content": "red"}], "images": ["images/red.png"]},
        chat(ASK),  # text only, beside them: as it was
        chat([{"type": "text", "text": "What "}, {"type": "text", "text": "now?"}]),  # text parts: one string
    ]
    write_jsonl(folder / "data.jsonl", rows)
    records, report = read_canonical(folder, path="data.jsonl")
    assert report["records_read"] == 9 and report["records_mapped"] == 9 and report["dropped"] == {}
    assert report["images"] == 8
    assert user_turn(records[0]) == [image(red), {"type": "text", "text": ASK}]
    stored = user_turn(records[1])[0]["path"]  # base64 is written once into the records cache, by content
    assert Path(stored).parent == folder / "cache" / "ingested" / "images" and Path(stored).read_bytes() == png(RED)
    assert user_turn(records[3])[0] == image(stored)  # the same bytes: the same file
    assert user_turn(records[2]) == [image(red), {"type": "text", "text": ASK}]
    assert user_turn(records[4]) == [image(red), {"type": "text", "text": "and"}, image(blue)]
    assert records[5]["messages"] == [{"role": "user", "content": [image(red), {"type": "text", "text": ASK}]},
                                      {"role": "assistant", "content": "red"}]
    assert records[6]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert user_turn(records[6]) == [image(red), {"type": "text", "text": ASK}]
    assert records[7] == chat(ASK) and user_turn(records[8]) == "What now?"
    assert all("images" not in r for r in records)


def test_a_text_only_file_is_still_read_as_it_is(folder):
    write_jsonl(folder / "text.jsonl", [chat(ASK), chat('He said "images" are "image"-like.')])
    records, report = read_canonical(folder, path="text.jsonl")
    assert report is None and records[0] == chat(ASK)  # no ingest step: the data stage reads the file itself


def image_rows(n: int) -> list[dict]:
    """TRL's layout as a datasets Image column holds it: the image bytes, placeholders in the messages."""
    colours = [RED, BLUE]
    return [{"messages": [{"role": "user", "content": [{"type": "image", "text": None},
                                                       {"type": "text", "text": ASK}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ["red", "blue"][i % 2]}]}],
             "images": [{"bytes": png(colours[i % 2]), "path": None}]} for i in range(n)]


def image_dataset(rows: list[dict]):
    from datasets import Dataset, Features, Image as ImageFeature, List, Value

    turn = {"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}
    return Dataset.from_list(rows, features=Features({"messages": List(turn), "images": List(ImageFeature())}))


@pytest.mark.parametrize("form", ["parquet", "arrow", "save_to_disk", "hub folder"])
def test_a_datasets_image_column_is_written_once_into_the_cache(folder, form):
    rows = image_rows(5)
    rows[4]["images"] = [{"bytes": b"not an image at all", "path": None}]
    dataset = image_dataset(rows)
    if form == "parquet":
        dataset.to_parquet(str(folder / "vqa.parquet"))
        path = "vqa.parquet"
    elif form in ("arrow", "save_to_disk"):
        dataset.save_to_disk(str(folder / "saved"))
        path = str(next((folder / "saved").glob("*.arrow"))) if form == "arrow" else "saved"
    else:
        (folder / "vqa" / "data").mkdir(parents=True)
        dataset.to_parquet(str(folder / "vqa" / "data" / "train-00000-of-00001.parquet"))
        (folder / "vqa" / "README.md").write_text("---\nlicense: mit\n---\n")
        path = "vqa"
    records, report = read_canonical(folder, path=path)
    assert report["records_mapped"] == 4 and report["images"] == 4 and report["dropped"] == {"unreadable_image": 1}
    [reject] = [json.loads(line) for line in open(report["rejects"])]
    assert reject["where"].endswith("row 5") and reject["record"]["images"] == [{"bytes": "<19 bytes>", "path": None}]
    paths = [user_turn(r)[0]["path"] for r in records]
    assert len(set(paths)) == 2  # two distinct images, each written once
    for record, stored in zip(records, paths):
        colour = RED if record["messages"][1]["content"] == "red" else BLUE
        assert Image.open(stored).convert("RGB").getpixel((0, 0)) == colour
        assert user_turn(record)[1] == {"type": "text", "text": ASK}  # arrow's None-valued keys dropped


def test_a_single_image_column_and_a_flat_mapping(folder):
    """VQA rows ({image, question, answer}): `map:` makes the turns; the one Image column is found by its type."""
    from datasets import Dataset, Features, Image as ImageFeature, Value

    rows = [{"image": {"bytes": png(c), "path": None}, "question": ASK, "answer": n}
            for c, n in ((RED, "red"), (BLUE, "blue"))]
    features = Features({"image": ImageFeature(), "question": Value("string"), "answer": Value("string")})
    Dataset.from_list(rows, features=features).to_parquet(str(folder / "vqa.parquet"))
    records, _ = read_canonical(folder, path="vqa.parquet", map={"user": "<image>{question}", "assistant": "answer"})
    assert [m["role"] for m in records[0]["messages"]] == ["user", "assistant"]
    assert user_turn(records[0])[0]["type"] == "image" and user_turn(records[0])[1] == {"type": "text", "text": ASK}
    assert "image" not in records[0]  # the column read as the images is not kept as a field


def test_a_conversation_mapping_with_roles_and_an_images_column(folder):
    rows = [{"dialog": [{"speaker": "me", "text": "<image> and <image>?"}, {"speaker": "bot", "text": "red, blue"}],
             "pics": ["images/red.png", "images/blue.png"]}]
    write_jsonl(folder / "d.jsonl", rows)
    records, _ = read_canonical(folder, path="d.jsonl", type="chat", roles={"me": "user", "bot": "assistant"},
                                map={"messages": "dialog", "role": "speaker", "content": "text", "images": "pics"})
    assert user_turn(records[0]) == [image(str(folder / "images" / "red.png")), {"type": "text", "text": " and "},
                                     image(str(folder / "images" / "blue.png")), {"type": "text", "text": "?"}]


def test_count_mismatches_are_counted_rejects_and_a_url_is_one_message(folder):
    rows = [chat([image("images/red.png"), {"type": "text", "text": ASK}]),
            {**chat("<image><image>Which?"), "images": ["images/red.png"]},  # 2 tags, 1 image
            {**chat([{"type": "image"}, {"type": "text", "text": ASK}])},  # a placeholder, no images
            {**chat([image("images/red.png")]), "images": ["images/blue.png"]},  # an image, and one more to place
            {"messages": [{"role": "user", "content": ASK},
                          {"role": "assistant", "content": [image("images/red.png")]}]}]  # an image as an answer
    write_jsonl(folder / "data.jsonl", rows)
    records, report = read_canonical(folder, path="data.jsonl")
    assert len(records) == 1 and report["dropped"] == {"image_count_mismatch": 3, "invalid_record": 1}
    assert "2 image placeholders (<image> or" in report["first_dropped"]["image_count_mismatch"]
    assert "assistant turn with an image" in report["first_dropped"]["invalid_record"]
    written = set((folder / "cache" / "ingested").glob("*"))
    write_jsonl(folder / "url.jsonl", [chat(ASK), chat([{"type": "image", "url": "https://example.com/a.png"}])])
    with pytest.raises(DataError, match=r"url.jsonl` line 2: the image `https://example.com/a.png` is a URL; "
                                        r"finetune reads images from local files only"):
        read_canonical(folder, path="url.jsonl")
    assert set((folder / "cache" / "ingested").glob("*")) == written  # nothing half-written


def test_read_records_resolves_paths_for_a_reader_without_the_data_stage(folder):
    """`finetune eval --data FILE` reads a records file directly: its image paths are made absolute the same way."""
    write_jsonl(folder / "held.jsonl", [{**chat("<image>Which?"), "images": ["images/blue.png"]}])
    [(shape, record)] = read_records(folder / "held.jsonl")
    assert shape == "chat" and user_turn(record)[0] == image(str(folder / "images" / "blue.png"))
    write_jsonl(folder / "bad.jsonl", [{**chat("<image>Which?"), "images": []}])
    with pytest.raises(DataError, match="line 1: 1 image placeholder .* but 0 images"):
        read_records(folder / "bad.jsonl")


@pytest.mark.parametrize("mapping", [{"instruction": "q", "output": "a", "images": "img"},
                                     {"chosen": "c", "rejected": "r", "images": "img"}])
def test_images_mapped_beside_a_record_that_is_not_chat_is_a_recipe_error(folder, mapping):
    recipe = {"base_model": "tiny/model", "datasets": [{"path": "d.parquet", "map": mapping}], "output_dir": "out"}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match="`map` names `images` with .*images go with a chat record"):
        load_recipe(folder / "recipe.yml")


def test_the_cleaning_steps_join_text_parts_and_refuse_images_with_a_reason():
    """`type: records` (finetune ingest) cleans text: a content of text parts is one string there too, and a record
    with an image is an invalid_record that says where images are read, not a crash inside the slop filter."""
    from finetune.ingest.clean import Cleaner
    from finetune.ingest.options import IngestOptions

    cleaner = Cleaner(IngestOptions())
    kept, verdict = cleaner.apply(chat([{"type": "text", "text": "Why is the sky "}, {"type": "text", "text": "blue?"}],
                                       answer="Rayleigh scattering of sunlight by the air."))
    assert verdict is None and user_turn(kept) == "Why is the sky blue?"
    dropped, (reason, detail) = cleaner.apply(chat([image("/data/cat.png"), {"type": "text", "text": ASK}]))
    assert dropped is None and reason == "invalid_record" and "`type: auto`" in detail


def test_the_same_file_in_another_folder_reads_its_own_images(tmp_path):
    """The records cache is keyed by the data file's content; its relative image paths resolve against the file's
    folder, so the same JSONL beside other images (a notebook's fresh workdir, a copied project) is its own entry:
    reusing the first entry pointed at the first folder's images, gone with it (`missing_image` for every record)."""
    import shutil

    cache = tmp_path / "cache"
    paths = []
    for name in ("first", "second"):
        where = tmp_path / name
        (where / "images").mkdir(parents=True)
        (where / "images" / "red.png").write_bytes(png(RED))
        write_jsonl(where / "data.jsonl", [chat([image("images/red.png"), {"type": "text", "text": "Which?"}])])
        recipe = {"base_model": "tiny/model", "datasets": [{"path": "data.jsonl", "type": "chat"}],
                  "output_dir": "out", "cache_dir": str(cache)}
        (where / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        [(_, path)] = record_files(load_recipe(where / "recipe.yml"))
        paths.append(path)
        if name == "first":
            shutil.rmtree(where)
    [record] = [json.loads(line) for line in Path(paths[1]).read_text().splitlines()]
    assert user_turn(record)[0]["path"] == str(tmp_path / "second" / "images" / "red.png")
