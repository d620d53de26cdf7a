"""SFT on tool transcripts (finetune/data/tool_chat.py, encode.py): assistant turns that call tools are trained, their
calls as the template writes them; tool results are never supervised; the tools offered are rendered where the
template puts them, from the record's `tools` column (TRL's SFT convention) or the recipe's `tools:`; a template that
cannot write calls is refused, at validate and at encode, naming the fix."""

from __future__ import annotations

import json

import pytest
import yaml

from agents_helpers import TOOLS_PY
from conftest import write_jsonl

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def transcript(tools=True) -> dict:
    record = {"messages": [
        {"role": "user", "content": "what is 2 plus 3"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "the answer is 5"}]}
    return {**record, "tools": [ADD]} if tools else record


@pytest.fixture
def tools_tokenizer(tiny_tokenizer):
    import copy

    from finetune.contract import CHATML_TOOLS_TEMPLATE

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    return tokenizer


def supervised_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, label in zip(example.input_ids, example.labels) if label != -100])


def test_calls_are_trained_results_never_and_the_tools_are_rendered(tools_tokenizer):
    from finetune.data.encode import encode_chats
    from finetune.ingest.records import record_problem

    record = transcript()
    assert record_problem(record, "chat") is None
    (example,) = encode_chats(tools_tokenizer, [record], train_on_inputs=False)
    text = tools_tokenizer.decode(example.input_ids)
    trained = supervised_text(tools_tokenizer, example)
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text  # the record's tools, in the system turn
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>' in trained
    assert "the answer is 5<|im_end|>" in trained
    assert "<tool_response>" not in trained and "5\n</tool_response>" in text  # the result: read, never trained
    assert "what is 2 plus 3" not in trained and "<tools>" not in trained


def test_the_recipes_tools_render_for_records_without_a_tools_column(tools_tokenizer, tmp_path):
    from finetune.data.encode import encode_chats
    from finetune.data.tool_chat import recipe_tool_schemas
    from finetune.recipe import load_recipe

    (tmp_path / "tools.py").write_text(TOOLS_PY)
    write_jsonl(tmp_path / "chats.jsonl", [transcript(tools=False)] * 4)
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"base_model": "x", "datasets": [{"path": "chats.jsonl"}],
                                                    "tools": ["tools.py:add"], "chat_template": "chatml_tools"}))
    schemas = recipe_tool_schemas(load_recipe(tmp_path / "r.yml"))
    assert [s["function"]["name"] for s in schemas] == ["add"]
    (example,) = encode_chats(tools_tokenizer, [transcript(tools=False)], False, tools=schemas)
    assert '"description": "Add two numbers."' in tools_tokenizer.decode(example.input_ids)
    (without,) = encode_chats(tools_tokenizer, [transcript(tools=False)], False)
    assert "<tools>" not in tools_tokenizer.decode(without.input_ids)


def test_a_template_that_drops_tool_calls_is_refused(tiny_tokenizer):
    from finetune.data.encode import encode_chats
    from finetune.errors import DataError

    with pytest.raises(DataError, match=r"drops the tool calls of an assistant turn; set `chat_template: chatml_tools`"):
        encode_chats(tiny_tokenizer, [transcript()], train_on_inputs=False)


@pytest.mark.parametrize("messages, said", [
    ([{"role": "user", "content": "x"}, {"role": "tool", "name": "add", "content": "5"},
      {"role": "assistant", "content": "y"}], "a tool result with no assistant turn before it that calls a tool"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "add"}]}],
     "is not {\"type\": \"function\""),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}], "empty assistant turn"),
])
def test_broken_transcripts_are_named(messages, said):
    from finetune.ingest.records import record_problem

    assert said in record_problem({"messages": messages}, "chat")


def test_validate_and_a_run_on_tool_transcripts(tmp_path, tiny_model_dir, capsys):
    """validate says what the template does with the transcripts (ChatML: refused naming chatml_tools); an SFT run
    with chatml_tools trains them."""
    from finetune.cli import main
    from finetune.recipe import load_recipe
    from finetune.train.run import run_training

    write_jsonl(tmp_path / "chats.jsonl", [transcript()] * 8)
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chats.jsonl"}], "sequence_len": 1024,
              "micro_batch_size": 4, "max_steps": 1, "learning_rate": 1e-3, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "max_checkpoints": 1, "precision": "fp32", "logging_steps": 1}
    (tmp_path / "chatml.yml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "tools.yml").write_text(yaml.safe_dump({**recipe, "chat_template": "chatml_tools"}))
    assert main(["validate", str(tmp_path / "chatml.yml")]) == 2
    assert "tool transcripts: FAILED: the chat template drops the tool calls" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "tools.yml")]) == 0
    assert "tool transcripts: 8 of the first 8 chat records" in capsys.readouterr().out
    summary = run_training(load_recipe(tmp_path / "tools.yml"))
    assert summary["steps"] == 1
    stats = json.loads((tmp_path / "out" / "run.json").read_text())
    assert stats["steps"] == 1
