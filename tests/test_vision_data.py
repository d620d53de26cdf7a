"""The data stage with images (issue 39 item 4): image tokens counted before training and apart from supervised
ones, a row over sequence_len never cut inside its images (a counted reject), images under a text model one message,
and `finetune preprocess --show` saying where the image tokens sit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_jsonl
from tiny_vision import draw_images, tiny_vlm

CORPUS = Path(__file__).parent / "bad_inputs" / "image_records" / "images"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    paths = draw_images(root / "data-images", {"red": (230, 20, 20)}, (60, 40))
    image_chat = {"messages": [{"role": "user", "content": [{"type": "image", "path": paths["red"]},
                                                            {"type": "text", "text": "what colour"}]},
                               {"role": "assistant", "content": "red"}]}
    text_chat = {"messages": [{"role": "user", "content": "say hello"}, {"role": "assistant", "content": "hello world"}]}
    missing = {"messages": [{"role": "user", "content": [{"type": "image", "path": str(root / "absent.png")}]},
                            {"role": "assistant", "content": "none"}]}
    # a JPEG cut short: its header reads (kept at read time), its pixels do not decode (a reject of the encoding)
    truncated = {"messages": [{"role": "user", "content": [{"type": "image", "path": str(CORPUS / "truncated.jpg")}]},
                              {"role": "assistant", "content": "none"}]}
    write_jsonl(root / "mixed.jsonl", [image_chat, image_chat, text_chat, missing, truncated])
    return root


def prepared(folder, tmp_path, base, data_type="chat", data=None, **keys):
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor
    from finetune.recipe import recipe_from_dict

    recipe = recipe_from_dict({"base_model": str(base), "datasets": [{"path": str(data or folder / "mixed.jsonl"),
                                                                      **({"type": data_type} if data_type else {})}],
                               "cache_dir": str(tmp_path / "cache"), **keys}, tmp_path)
    return build_dataset(recipe, *tokenizer_and_processor(recipe))


def test_image_tokens_are_counted_apart_and_a_missing_image_is_a_counted_reject(folder, tmp_path):
    stats = prepared(folder, tmp_path, tiny_vlm("idefics3", folder)).stats
    # a 60 x 40 image: 2 x 2 tiles (each a frame token, its <row_i_col_j> tag, 4 image tokens), the global image
    # (frame, <global-img>, 4 image tokens, frame) and the newlines between rows: 4 * 6 + 7 + 3 = 34 tokens
    assert stats["train"]["images"] == 2 and stats["train"]["image_tokens"] == 2 * 34
    assert stats["train"]["examples"] == 3 and stats["records"] == 4
    assert stats["dropped_images"] == {"unreadable_image": 1}  # found when the encoder decodes it
    # the missing image is a reject of the reading (finetune/ingest/images.py), counted with its dataset
    assert stats["sources"][0]["read"] == 5 and stats["sources"][0]["dropped"] == {"missing_image": 1}
    # supervised: "red<|im_end|>\n" twice and "hello world<|im_end|>\n"
    assert stats["train"]["supervised_tokens"] < stats["train"]["tokens"] - stats["train"]["image_tokens"]


def test_an_image_edited_or_removed_after_tokenizing_is_tokenized_again(folder, tmp_path):
    """The cache holds each row's image tokens, counted from the image as it was; an image edited in place (same path,
    another shape: other tiles) or removed since is tokenized again, never trained from stale rows (the model would
    stop mid-run: "Image features and image tokens do not match", or the collator on the missing file)."""
    from PIL import Image

    base = tiny_vlm("idefics3", folder)
    paths = draw_images(tmp_path / "images", {"red": (230, 20, 20), "blue": (30, 40, 220)}, (60, 40))
    data = write_jsonl(tmp_path / "data.jsonl", [
        {"messages": [{"role": "user", "content": [{"type": "image", "path": paths[name]}]},
                      {"role": "assistant", "content": name}]} for name in ("red", "blue")])
    first = prepared(folder, tmp_path, base, data=data)
    assert first.stats["train"]["image_tokens"] == 2 * 34 and not first.reused  # 2 x 2 tiles + the global image
    assert prepared(folder, tmp_path, base, data=data).reused  # nothing changed: the cache serves
    Image.new("RGB", (64, 16), (230, 20, 20)).save(paths["red"])  # 1 x 2 tiles now: fewer image tokens
    edited = prepared(folder, tmp_path, base, data=data)
    fresh = prepared(folder, tmp_path / "fresh", base, data=data)  # what a new cache holds for the images as they are
    assert not edited.reused and edited.stats["train"] == fresh.stats["train"]
    assert edited.stats["train"]["image_tokens"] < 2 * 34
    Path(paths["blue"]).unlink()
    gone = prepared(folder, tmp_path, base, data=data)
    assert not gone.reused and gone.stats["dropped_images"] == {"missing_image": 1}
    assert gone.stats["train"]["images"] == 1
    # removed while a run reads the rows: the batch that needs it stops the run with one message, not a traceback
    from transformers import AutoProcessor

    from finetune.data.collate import Collator
    from finetune.data.vision.collate import VisionCollator
    from finetune.errors import DataError

    collator = VisionCollator(Collator(0), AutoProcessor.from_pretrained(base), 768 * 768)
    row = {"input_ids": [1, 2], "labels": [1, 2], "images": json.dumps([{"type": "image", "path": paths["blue"]}])}
    with pytest.raises(DataError, match="no image file at .*blue.png.* changed on disk after"):
        collator([row])


@pytest.mark.parametrize("strategy", ["drop", "truncate"])
def test_a_row_over_sequence_len_is_never_cut_inside_its_images(folder, tmp_path, strategy):
    # 30 tokens: the text-only chat fits, the image chats (~58 tokens) do not
    stats = prepared(folder, tmp_path, tiny_vlm("idefics3", folder), sequence_len=30,
                     excess_length_strategy=strategy).stats
    assert stats["dropped_images"] == {"too_long_with_images": 2, "unreadable_image": 1}
    assert stats["train"]["examples"] == 1 and stats["train"]["image_tokens"] == 0
    assert stats["truncated"] == 0 and stats["dropped_too_long"] == 0


def test_image_records_under_a_text_model_are_one_message(folder, tmp_path, tiny_model_dir):
    from finetune.errors import DataError

    with pytest.raises(DataError, match="holds records with images .* the model reads text only"):
        prepared(folder, tmp_path, tiny_model_dir)


def test_grpo_is_refused_with_one_message_naming_what_works(folder, tmp_path):
    """Preference methods train a vision-language model (tests/test_vision_preference.py); GRPO does not."""
    from finetune.errors import DataError

    (tmp_path / "rewards.py").write_text("def short(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    grpo = {"rewards": [{"function": str(tmp_path / "rewards.py") + ":short"}], "num_generations": 2,
            "micro_batch_size": 2}
    with pytest.raises(DataError, match="`method: grpo` with a vision-language base model.*`method: sft`.*`method: "
                                        "dpo`"):
        prepared(folder, tmp_path, tiny_vlm("llava", folder), data_type=None, method="grpo", **grpo)


def test_preprocess_show_marks_image_tokens_and_supervised_ones(folder, tmp_path, capsys):
    import yaml

    from finetune.cli import main

    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump({"base_model": str(tiny_vlm("idefics3", folder)), "cache_dir": str(tmp_path),
                                      "datasets": [{"path": str(folder / "mixed.jsonl"), "type": "chat"}]}))
    assert main(["preprocess", str(recipe), "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "train: 3 examples" in out and "68 image tokens (2 images)" in out and "1 missing_image" in out and "1 unreadable_image" in out
    # each tile: its frame and tag, the image token and how many, where they sit in the row; the answer supervised
    assert "<fake_token_around_image><row_1_col_2><image>x4" in out and "<global-img><image>x4" in out
    assert "what colour<|im_end|>" in out and "[[red<|im_end|>\n]]" in out
