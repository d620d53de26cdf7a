"""Labels are -100 exactly where they should be, token by token, for each record shape: by hand on a few
records, and against the per-record oracle (tests/oracle_encoder.py) on many varied ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import oracle_encoder
from finetune.contract import IGNORE_INDEX
from finetune.data import fit_length
from finetune.data.encode import encode_batch
from finetune.data.formats import alpaca_prompt

IGN = IGNORE_INDEX


def encode(tokenizer, shape, record, train_on_inputs):
    """One record through the production encoder."""
    return encode_batch(tokenizer, [(shape, record)], train_on_inputs)[0]


def ids(tok, text, special=False):
    return tok(text, add_special_tokens=special)["input_ids"]


def test_completion_supervises_everything_and_ends_with_eos(tiny_tokenizer):
    ex = encode(tiny_tokenizer, "completion", {"text": "the cat sat on the mat"}, train_on_inputs=False)
    assert ex.input_ids == ids(tiny_tokenizer, "the cat sat on the mat", True) + [tiny_tokenizer.eos_token_id]
    assert ex.labels == ex.input_ids


@pytest.mark.parametrize("with_input", [True, False])
def test_instruction_masks_the_prompt_exactly(tiny_tokenizer, with_input):
    record = {"instruction": "what is one plus one", "input": "numbers" if with_input else "", "output": "two"}
    ex = encode(tiny_tokenizer, "instruction", record, train_on_inputs=False)
    prompt = ids(tiny_tokenizer, alpaca_prompt(record), True)
    response = ids(tiny_tokenizer, "two") + [tiny_tokenizer.eos_token_id]
    assert ("### Input:" in alpaca_prompt(record)) == with_input
    assert ex.input_ids == prompt + response
    assert ex.labels == [IGN] * len(prompt) + response


def test_train_on_inputs_supervises_the_prompt(tiny_tokenizer):
    record = {"instruction": "say hello", "output": "hello world"}
    ex = encode(tiny_tokenizer, "instruction", record, train_on_inputs=True)
    assert ex.labels == ex.input_ids


def test_multi_turn_chat_supervises_every_assistant_turn(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is the sun"},
        {"role": "assistant", "content": "a big star"},
        {"role": "user", "content": "and rain"},
        {"role": "assistant", "content": "water falls"},
    ]
    ex = encode(tiny_tokenizer, "chat", {"messages": messages}, train_on_inputs=False)
    # Build the expected sequence piece by piece with the same ChatML template.
    pieces = [
        ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwhat is the sun<|im_end|>\n<|im_start|>assistant\n", False),
        ("a big star<|im_end|>\n", True),
        ("<|im_start|>user\nand rain<|im_end|>\n<|im_start|>assistant\n", False),
        ("water falls<|im_end|>\n", True),
    ]
    text = "".join(p for p, _ in pieces)
    assert tiny_tokenizer.decode(ex.input_ids) == text
    assert ex.input_ids == ids(tiny_tokenizer, text)
    supervised = tiny_tokenizer.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGN])
    assert supervised == "a big star<|im_end|>\nwater falls<|im_end|>\n"
    # nothing of the system/user turns or the assistant headers is supervised
    first_answer = text.index("a big star")
    n_prefix = len(ids(tiny_tokenizer, text[:first_answer]))
    assert ex.labels[:n_prefix] == [IGN] * n_prefix
    assert ex.labels[n_prefix] == ex.input_ids[n_prefix]


def test_roles_to_train_supervises_the_whole_turns_of_those_roles(tiny_tokenizer):
    from finetune.data.vision import chat_encoder

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the sun"},
                {"role": "assistant", "content": "a big star"}]
    chat = chat_encoder(SimpleNamespace(roles_to_train=["system", "assistant"]), None)  # the recipe's key
    ex = encode_batch(tiny_tokenizer, [("chat", {"messages": messages})], False, chat)[0]
    supervised = tiny_tokenizer.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGN])
    assert supervised == "<|im_start|>system\nbe brief<|im_end|>\na big star<|im_end|>\n"


def test_chat_train_on_inputs(tiny_tokenizer):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ex = encode(tiny_tokenizer, "chat", {"messages": msgs}, train_on_inputs=True)
    assert ex.labels == ex.input_ids


def test_chat_with_a_template_that_is_not_prefix_stable_is_a_clear_error(tiny_model_dir):
    from transformers import AutoTokenizer

    from finetune.errors import DataError

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # a template that writes the number of messages up front: renderings are not prefixes of each other
    tok.chat_template = "{{ messages|length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(DataError, match="chat_template: chatml"):
        encode(tok, "chat", {"messages": msgs}, train_on_inputs=False)


# --- the production encoder against the per-record oracle ---------------------------------------------

SYSTEM = {"role": "system", "content": "answer in one line"}


def _chat(*turns):
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


VARIED = [
    ("completion", {"text": "the cat sat on the mat"}),
    ("completion", {"text": "  leading and trailing spaces \n\n with newlines  "}),
    ("completion", {"text": "a text that names <|im_end|> and <|im_start|> inside it"}),
    ("instruction", {"instruction": "what is one plus one", "input": "", "output": "two"}),
    ("instruction", {"instruction": "translate", "input": "le chat", "output": "the cat"}),
    ("instruction", {"instruction": "blank input counts as none", "input": "   ", "output": "ok"}),
    ("instruction", {"instruction": "no input key at all", "output": "fine\nsecond line"}),
    ("chat", _chat(("user", "hi"), ("assistant", "hello"))),
    ("chat", {"messages": [SYSTEM, *_chat(("user", "what is the sun"), ("assistant", "a big star"),
                                          ("user", "and rain"), ("assistant", "water falls"))["messages"]]}),
    ("chat", _chat(("user", "one"), ("user", "two in a row"), ("assistant", "then me"), ("assistant", "and me"))),
    ("chat", _chat(("assistant", "I speak first"), ("user", "ok"), ("assistant", "bye"))),
    ("chat", _chat(("user", "say the end marker"), ("assistant", "here: <|im_end|> done"))),
    ("chat", _chat(("user", "empty answer next"), ("assistant", ""), ("user", "again"), ("assistant", "now"))),
    ("chat", _chat(("user", "unicode ça va? 日本"), ("assistant", "très bien, ünïcødé\n\nwith a blank line"))),
    ("chat", {"messages": [SYSTEM, *_chat(("user", "only a question"))["messages"]]}),
]


def _pairs(examples):
    return [(e.input_ids, e.labels) for e in examples]


@pytest.mark.parametrize("train_on_inputs", [False, True])
def test_production_encoder_equals_the_oracle_on_varied_records(tiny_tokenizer, train_on_inputs):
    expected = [oracle_encoder.encode(tiny_tokenizer, shape, r, train_on_inputs) for shape, r in VARIED]
    got = encode_batch(tiny_tokenizer, VARIED, train_on_inputs)  # mixed shapes in one batch, order kept
    for (shape, record), want, have in zip(VARIED, expected, got):
        assert (have.input_ids, have.labels) == (want.input_ids, want.labels), (shape, record)
    masked = sum(label == IGN for e in got for label in e.labels)
    assert (masked == 0) == train_on_inputs  # the records do have prompts to mask


@pytest.mark.parametrize("length", [1, 5, 17, 40])
def test_truncated_examples_keep_the_oracle_labels(tiny_tokenizer, length):
    recipe = SimpleNamespace(sequence_len=length, excess_length_strategy="truncate")
    for (shape, record), example in zip(VARIED, encode_batch(tiny_tokenizer, VARIED, False)):
        want = oracle_encoder.encode(tiny_tokenizer, shape, record, False)
        cut, what = fit_length(example, recipe)
        assert (cut.input_ids, cut.labels) == (want.input_ids[:length], want.labels[:length]), (shape, record)
        assert what == ("truncated" if len(want.input_ids) > length else None)


def test_added_special_tokens_are_encoded_and_masked_like_the_oracle(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<tool>"]})
    tok.add_tokens(["zebra-crossing"])
    records = [("chat", _chat(("user", "call <tool> now"), ("assistant", "<tool> zebra-crossing <tool>"))),
               ("instruction", {"instruction": "use <tool>", "input": "zebra-crossing", "output": "<tool>"}),
               ("completion", {"text": "<tool>zebra-crossing"})]
    for train_on_inputs in (False, True):
        expected = [oracle_encoder.encode(tok, shape, r, train_on_inputs) for shape, r in records]
        assert _pairs(encode_batch(tok, records, train_on_inputs)) == _pairs(expected)
    tool = tok.convert_tokens_to_ids("<tool>")
    chat = encode_batch(tok, records[:1], False)[0]
    # the user's <tool> is masked, the assistant's two are supervised: each one token, not split into pieces
    assert [label for token, label in zip(chat.input_ids, chat.labels) if token == tool] == [IGN, tool, tool]


def test_many_generated_records_equal_the_oracle(tiny_tokenizer):
    from conftest import make_records

    shaped = [(shape, r) for shape in ("completion", "instruction", "chat") for r in make_records(shape, 30, seed=3)]
    for train_on_inputs in (False, True):
        expected = [oracle_encoder.encode(tiny_tokenizer, shape, r, train_on_inputs) for shape, r in shaped]
        assert _pairs(encode_batch(tiny_tokenizer, shaped, train_on_inputs)) == _pairs(expected)
