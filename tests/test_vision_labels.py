"""Labels of image chats, for every family (issue 39 item 3): image tokens, their boundaries and padding are never
supervised; on the text, the labels are those of the same conversation with the images removed, as the text
encoder makes them; train_on_inputs and roles_to_train hold for every family."""

from __future__ import annotations

import importlib.util

import pytest

from finetune.contract import IGNORE_INDEX
from tiny_vision import build_tiny_vlm, draw_images

FAMILIES = ["llava", "idefics3", "gemma3",
            pytest.param("qwen2_vl", marks=pytest.mark.skipif(
                importlib.util.find_spec("torchvision") is None,
                reason="Qwen2-VL's processor needs torchvision (its video processor), not installed here"))]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    # 60 x 40: Idefics3 splits it into 2 x 2 tiles (+ the global image), the others resize or crop it
    return draw_images(tmp_path_factory.mktemp("images"), {"red": (230, 20, 20), "blue": (30, 40, 220)}, (60, 40))


@pytest.fixture(scope="module")
def processors(tmp_path_factory):
    from transformers import AutoProcessor

    root, loaded = tmp_path_factory.mktemp("vlms"), {}

    def get(family):
        if family not in loaded:
            loaded[family] = AutoProcessor.from_pretrained(build_tiny_vlm(family, root / family))
        return loaded[family]

    return get


def conversation(images: dict) -> dict:
    return {"messages": [
        {"role": "system", "content": "answer in one word"},
        {"role": "user", "content": [{"type": "image", "path": images["red"]}, {"type": "text", "text": "what colour"}]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [{"type": "text", "text": "and this one"}, {"type": "image", "path": images["blue"]}]},
        {"role": "assistant", "content": "blue sky"},
    ]}


def without_images(record: dict) -> dict:
    text = lambda content: content if isinstance(content, str) else "".join(  # noqa: E731
        p["text"] for p in content if p["type"] == "text")
    return {"messages": [{**m, "content": text(m["content"])} for m in record["messages"]]}


def encode(processor, record, train_on_inputs=False, roles=("assistant",)):
    from finetune.data.vision.encode import ImageEncoder

    return ImageEncoder(processor, roles=roles)(processor.tokenizer, [record], train_on_inputs)[0]


def text_encode(processor, record, train_on_inputs=False, roles=("assistant",)):
    from finetune.data.encode import encode_chats

    return encode_chats(processor.tokenizer, [record], train_on_inputs, roles)[0]


def image_ids(processor) -> set[int]:
    """Every token the family adds for images: the image token, boundaries, tile tags (Idefics3's <row_1_col_1>)."""
    tokenizer = processor.tokenizer
    family = [t for t in tokenizer.get_vocab() if t.startswith("<") and t not in ("<|im_start|>", "<|im_end|>",
                                                                                 "<|endoftext|>", "<pad>")
              and tokenizer.convert_tokens_to_ids(t) >= 512]  # the tiny tokenizer's own vocabulary ends at 512
    return {tokenizer.convert_tokens_to_ids(t) for t in family}


def supervised(example) -> list[int]:
    return [label for label in example.labels if label != IGNORE_INDEX]


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_on_text_equal_the_conversation_without_images(family, processors, images):
    processor = processors(family)
    record = conversation(images)
    row, text_row = encode(processor, record), text_encode(processor, without_images(record))
    assert len(row.images) == 2 and row.image_tokens > 0
    assert len(row.input_ids) > len(text_row.input_ids)
    # the supervised tokens are the two answers and their end-of-turn tokens, exactly as for text alone
    assert supervised(row) == supervised(text_row) and supervised(row)
    assert processor.tokenizer.decode(supervised(row)) == "red<|im_end|>\nblue sky<|im_end|>\n"
    ids = image_ids(processor)
    assert set(row.input_ids) & ids  # the row holds the family's image tokens...
    assert not set(supervised(row)) & ids  # ...and none of them is supervised


@pytest.mark.parametrize("family", FAMILIES)
def test_train_on_inputs_supervises_all_text_and_never_an_image_token(family, processors, images):
    processor = processors(family)
    record = conversation(images)
    row, text_row = encode(processor, record, train_on_inputs=True), text_encode(processor, without_images(record),
                                                                                 train_on_inputs=True)
    ids = image_ids(processor)
    assert not set(supervised(row)) & ids
    # every token is supervised but the images' own: their expansions, boundaries and tile tags included
    assert len(supervised(row)) == len(row.input_ids) - row.image_tokens
    assert processor.tokenizer.decode(supervised(row)).replace("\n", "") == \
        processor.tokenizer.decode(supervised(text_row)).replace("\n", "")


@pytest.mark.parametrize("family", FAMILIES)
def test_roles_to_train_user_turns_are_supervised_without_their_images(family, processors, images):
    processor = processors(family)
    record = conversation(images)
    roles = ("user", "assistant")
    row, text_row = encode(processor, record, roles=roles), text_encode(processor, without_images(record), roles=roles)
    assert not set(supervised(row)) & image_ids(processor)
    text = processor.tokenizer.decode(supervised(row))
    assert "what colour" in text and "and this one" in text and "answer in one word" not in text
    assert text.replace("\n", "") == processor.tokenizer.decode(supervised(text_row)).replace("\n", "")
    assert len(supervised(row)) > len(supervised(encode(processor, record)))
