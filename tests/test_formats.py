"""Labels are -100 exactly where they should be, token by token, for each record shape."""

from __future__ import annotations

import pytest

from finetune.data.formats import IGNORE_INDEX, alpaca_prompt, encode

IGN = IGNORE_INDEX


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
