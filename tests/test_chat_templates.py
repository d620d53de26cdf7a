"""Assistant-only masking in each family's turn format (tests/chat_templates.py): exactly the assistant's answer
and the end of its turn are supervised, in every turn; a template that writes a turn differently once later turns
follow (Qwen3's <think> blocks) is refused with the reason; the tokenizer's own template is the default."""

from __future__ import annotations

import pytest

from chat_templates import FAMILY_TEMPLATES, QWEN3
from finetune.data.encode import encode_chats
from finetune.errors import DataError
from tiny import CHATML, build_tokenizer

CHAT = [{"role": "system", "content": "answer in one line"}, {"role": "user", "content": "what is the river"},
        {"role": "assistant", "content": "the blue river runs"}, {"role": "user", "content": "and the tree"},
        {"role": "assistant", "content": "a big green tree"}]
ANSWERS = [m["content"] for m in CHAT if m["role"] == "assistant"]


@pytest.fixture(scope="module")
def base_tokenizer():
    return build_tokenizer()


def tokenizer_with(base, template: str, specials: list[str], bos: str | None = None):
    import copy

    tokenizer = copy.deepcopy(base)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    if bos:
        tokenizer.bos_token = bos
    tokenizer.chat_template = template
    return tokenizer


def supervised_text(tokenizer, messages: list[dict]) -> list[str]:
    """The characters of each run of supervised tokens, read from the tokens' offsets."""
    example = encode_chats(tokenizer, [{"messages": messages}], train_on_inputs=False)[0]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(offsets) == len(example.labels)
    runs, current = [], None
    for (start, end), label in zip(offsets, example.labels):
        if label == -100:
            current = None
        elif current is None:
            current = [start, end]
            runs.append(current)
        else:
            current[1] = end
    return [text[a:b] for a, b in runs]


@pytest.mark.parametrize("name", ["chatml", *FAMILY_TEMPLATES])
def test_every_assistant_turn_and_only_it_is_supervised(base_tokenizer, name):
    if name == "chatml":
        tokenizer, middle, last = base_tokenizer, "<|im_end|>\n", "<|im_end|>\n"
    else:
        template, specials, middle, last = FAMILY_TEMPLATES[name]
        bos = specials[0] if name in ("llama3", "gemma", "mistral") else None
        tokenizer = tokenizer_with(base_tokenizer, template, specials, bos)
    expected = [ANSWERS[0] + middle, ANSWERS[1] + last]
    if name == "mistral":  # the answer follows [/INST] after a space, which the model generates with it
        expected = [" " + a for a in expected]
    assert supervised_text(tokenizer, CHAT[1:] if name == "mistral" else CHAT) == expected


def test_phi3_multi_turn_trains_every_turn_and_the_closing_eos_once(base_tokenizer):
    """Phi-3's template writes EOS only to close a conversation: an earlier turn, rendered as the last one, ends
    with it, the whole conversation has it once at the end. The earlier turn's span stops at its <|end|>."""
    template, specials, _, _ = FAMILY_TEMPLATES["phi3"]
    tokenizer = tokenizer_with(base_tokenizer, template, specials)
    runs = supervised_text(tokenizer, CHAT)
    assert runs == [ANSWERS[0] + "<|end|>\n", ANSWERS[1] + "<|end|>\n<|endoftext|>"]


def test_qwen3_one_exchange_trains_its_think_block(base_tokenizer):
    tokenizer = tokenizer_with(base_tokenizer, QWEN3, ["<think>", "</think>"])
    messages = [{"role": "user", "content": "what is the river"},
                {"role": "assistant", "content": "<think>\nblue\n</think>\n\nthe blue river runs"}]
    assert supervised_text(tokenizer, messages) == ["<think>\nblue\n</think>\n\nthe blue river runs<|im_end|>\n"]
    plain = [messages[0], {"role": "assistant", "content": "the blue river runs"}]  # an empty block: what it writes
    assert supervised_text(tokenizer, plain) == ["<think>\n\n</think>\n\nthe blue river runs<|im_end|>\n"]


def test_qwen3_multi_turn_is_refused_with_the_reason(base_tokenizer):
    tokenizer = tokenizer_with(base_tokenizer, QWEN3, ["<think>", "</think>"])
    with pytest.raises(DataError) as refused:
        encode_chats(tokenizer, [{"messages": CHAT}], train_on_inputs=False)
    message = str(refused.value)
    assert "assistant turn 1" in message and "<think>" in message and "one record per turn" in message


def test_a_turn_that_only_looks_closed_is_not_taken_for_the_closing_text(base_tokenizer):
    """The closing text an earlier turn may drop is the template's, never the answer: two identical answers under
    Qwen3's template are still refused."""
    tokenizer = tokenizer_with(base_tokenizer, QWEN3, ["<think>", "</think>"])
    same = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "yes"}]
    with pytest.raises(DataError, match="<think>"):
        encode_chats(tokenizer, [{"messages": same}], train_on_inputs=False)


def test_the_tokenizers_own_template_is_the_default(tmp_path, base_tokenizer):
    """`chat_template: tokenizer_default` (the default) renders with the family's template its tokenizer ships;
    ChatML only where the tokenizer has none."""
    import yaml

    from finetune.model.loader import load_tokenizer
    from finetune.recipe import load_recipe

    template, specials, _, _ = FAMILY_TEMPLATES["gemma"]
    own = tokenizer_with(base_tokenizer, template, specials, "<bos>")
    own.save_pretrained(tmp_path / "gemma")
    bare = tokenizer_with(base_tokenizer, "", [])
    bare.chat_template = None
    bare.save_pretrained(tmp_path / "bare")
    for folder, expected in (("gemma", template), ("bare", CHATML)):
        (tmp_path / folder / "config.json").write_text("{}")
        (tmp_path / f"{folder}.yml").write_text(yaml.safe_dump({"base_model": str(tmp_path / folder),
                                                                "datasets": [{"path": "x.jsonl"}]}))
        recipe = load_recipe(tmp_path / f"{folder}.yml")
        assert recipe.chat_template == "tokenizer_default"
        rendered = load_tokenizer(recipe).apply_chat_template(CHAT[1:3], tokenize=False)
        want = tokenizer_with(base_tokenizer, expected, specials, "<bos>").apply_chat_template(CHAT[1:3], tokenize=False)
        assert rendered == want
