"""Chat templates and tools: can a template write a tool-calling conversation, and the token ids its pieces
become. Shared by SFT on tool transcripts (finetune/data/encode.py) and GRPO's episodes (finetune/train/grpo/).

A template fit for tools renders (1) the tools it is given (their JSON schemas, where the template puts them),
(2) an assistant turn's `tool_calls` (name and arguments), (3) a `tool` turn's result, and (4) a conversation so
that its renderings as it grows are prefixes of each other: an episode is built from token ids (the prompt, what the
model sampled, then the template's tokens for the tool results), which is only the conversation the model later
sees when the template writes the earlier turns the same whatever follows (TRL 1.16 checks the same property,
`is_chat_template_prefix_preserving`; Qwen3's template, which drops earlier <think> blocks, has not got it).

The tool results' tokens are computed as TRL 1.16's `_get_tool_suffix_ids` computes them: render a short
conversation ending on an assistant tool call, then the same with the tool turns and the generation prompt, and take
what the second adds, the first cut after its last end-of-turn token (what generation stops at).
"""

from __future__ import annotations

import os

# what `finetune validate` and a run say to do when the template cannot carry tools
TEMPLATE_FIX = ("set `chat_template: chatml_tools` (ChatML with the Hermes / Qwen2.5 tool format: tools in the system "
                "turn, <tool_call> JSON, <tool_response> results) or a `chat_template: jinja` template that writes "
                "them")

_NAME, _KEY, _VALUE, _RESULT = "tool_name_q7x", "arg_key_k3z", "arg_value_v9w", "tool_result_r5y"


def tool_call(name: str, arguments) -> dict:
    """A tool call in the OpenAI / TRL shape."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _probe_schema() -> dict:
    return {"type": "function", "function": {"name": _NAME, "description": "A probe.", "parameters": {
        "type": "object", "properties": {_KEY: {"type": "string", "description": "A probe."}}, "required": [_KEY]}}}


def template_problem(tokenizer, what: str = "this chat template") -> str | None:
    """Why `tokenizer`'s template cannot carry a tool-calling conversation (which part it drops or where its
    renderings part), or None when it can."""
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [tool_call(_NAME, {_KEY: _VALUE})]},
                {"role": "tool", "name": _NAME, "content": _RESULT}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[_probe_schema()], tokenize=False)
        offered = tokenizer.apply_chat_template(messages[:1], tools=[_probe_schema()], tokenize=False,
                                                add_generation_prompt=True)
    except Exception as err:  # jinja2's TemplateError, a template that raises on a role, a TypeError on a dict
        return f"{what} cannot render a tool call and its result ({type(err).__name__}: {err}); {TEMPLATE_FIX}"
    dropped = [part for part, marks in (("the tool calls of an assistant turn", (_NAME, _KEY, _VALUE)),
                                        ("the result of a `tool` turn", (_RESULT,))) if not all(m in text for m in marks)]
    if dropped:
        return f"{what} drops {' and '.join(dropped)}; {TEMPLATE_FIX}"
    if _NAME not in offered:
        return f"{what} does not write the tools it is offered (their JSON schemas) into the prompt; {TEMPLATE_FIX}"
    return prefix_problem(tokenizer, what)


def prefix_problem(tokenizer, what: str = "this chat template") -> str | None:
    """None when rendering a conversation ending on an assistant tool call gives a prefix of rendering it with the
    tool turn and the generation prompt (token ids), else where the two part."""
    first = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [tool_call("dummy", {})]}]
    ids1 = _ids(tokenizer, first, False)
    ids2 = _ids(tokenizer, first + [{"role": "tool", "name": "dummy", "content": "dummy"}], True)
    if ids2[:len(ids1)] == ids1:
        return None
    same = next(i for i, (a, b) in enumerate(zip(ids1, ids2)) if a != b) if any(
        a != b for a, b in zip(ids1, ids2)) else min(len(ids1), len(ids2))
    return (f"{what} writes an assistant turn differently once a tool turn follows it (after "
            f"{tokenizer.decode(ids1[:same])[-40:]!r} it reads {tokenizer.decode(ids1[same:same + 8])!r} alone, "
            f"{tokenizer.decode(ids2[same:same + 8])!r} followed), so an episode built from token ids would not be the "
            f"conversation the model reads; {TEMPLATE_FIX}")


def _ids(tokenizer, messages: list[dict], generation_prompt: bool, tools=None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """A conversation prompt with the tools offered (`or None`: some templates write tool boilerplate for [])."""
    return _ids(tokenizer, messages, True, tools)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], end_ids) -> list[int]:
    """The ids the template writes after an assistant's tool call for these `tool` turns, up to and including the
    next assistant header: TRL 1.16's construction. `end_ids`: the tokens generation stops at (EOS, end of turn)."""
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [tool_call(tool_messages[0]["name"], {})]}]
    before = _ids(tokenizer, dummy, False)
    full = _ids(tokenizer, dummy + list(tool_messages), True)
    ends = [i for i, token in enumerate(before) if token in set(end_ids)]
    if ends:  # the model stops at its end-of-turn token: what the template writes after it belongs to the suffix
        before = before[:ends[-1] + 1]
    if full[:len(before)] != before:
        raise ValueError("the chat template is not prefix-preserving across a tool turn (checked before the run)")
    return full[len(before):]


# --- SFT on tool transcripts ---------------------------------------------------------------------------------------
_SCHEMAS: dict[tuple, list[dict]] = {}  # the recipe's tools' schemas, by their specs and files' (mtime, size)


def recipe_tool_schemas(recipe) -> list[dict] | None:
    """The JSON schemas of the recipe's `tools:` (SFT renders them into transcripts without a `tools` column), read
    in a spawned process (finetune/agent_tools.py); None without tools or for another method (GRPO offers its tools
    itself). Read once per state of the files."""
    if getattr(recipe, "method", "sft") != "sft" or not getattr(recipe, "tools", None):  # a stand-in recipe: none
        return None
    from pathlib import Path

    from finetune.agent_tools import schemas_in_worker

    files = [spec.rpartition(":")[0] for spec in recipe.tools]
    key = tuple(recipe.tools) + tuple((os.stat(f).st_mtime_ns, os.stat(f).st_size) if os.path.isfile(f) else None
                                      for f in files)
    if key not in _SCHEMAS:
        _SCHEMAS[key] = schemas_in_worker(None, list(recipe.tools), Path.cwd())["schemas"]
    return _SCHEMAS[key]


def tools_fingerprint(recipe) -> str:
    """What the recipe's tools add to the tokenization cache key: their schemas (a docstring edited changes the
    tokens), '' without tools."""
    schemas = recipe_tool_schemas(recipe)
    if not schemas:
        return ""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()[:16]


def record_tools(record: dict, default: list[dict] | None) -> list[dict] | None:
    """The tools a transcript was offered: its `tools` column (a list of schemas, or that list as a JSON string,
    TRL's SFT convention), else `default` (the recipe's)."""
    tools = record.get("tools")
    if isinstance(tools, str):
        import json

        tools = json.loads(tools)
    return tools or default


def is_tool_transcript(record: dict) -> bool:
    return bool(record.get("tools")) or any(m.get("tool_calls") or m.get("role") == "tool"
                                            for m in record.get("messages") or [] if isinstance(m, dict))


_CHECKED: dict[str, str | None] = {}  # a template's problem with tool transcripts, by the template's text


def check_transcripts(tokenizer, records: list[dict], tools) -> None:
    """DataError when some records are tool transcripts (or the recipe offers tools) and the template cannot write
    them: it would silently drop the calls and train on empty turns."""
    if not tools and not any(is_tool_transcript(r) for r in records):
        return
    from finetune.errors import DataError

    template = str(tokenizer.chat_template)
    if template not in _CHECKED:
        _CHECKED[template] = template_problem(tokenizer, "the chat template")
    if _CHECKED[template]:
        raise DataError(f"tool transcripts (assistant turns with tool_calls, tool results): {_CHECKED[template]}")


def validate_transcripts(recipe, load_tokenizer, say=print, n_records: int = 50) -> int:
    """`finetune validate` on an SFT recipe with tool transcripts among its first records (or `tools:`): the tools
    offered and whether the template writes calls and results; 2 when it cannot. `load_tokenizer(recipe)`: the
    run's tokenizer with its chat template (finetune/model/loader.py, a later stage than this one)."""
    from itertools import islice

    from finetune.ingest.records import read_records
    from finetune.ingest.records_source import plain_records_file

    records = []  # the plain record files' first chats (validate ingests nothing to look: a raw source has no tools)
    for spec in recipe.datasets:
        if spec.type in ("chat", "auto") and plain_records_file(spec) and os.path.isfile(spec.path):
            records += [r for shape, r in islice(read_records(spec.path, spec.type), n_records) if shape == "chat"]
    transcripts = sum(is_tool_transcript(r) for r in records)
    if not transcripts and not recipe.tools:
        return 0
    from finetune.errors import RewardError

    try:
        schemas = recipe_tool_schemas(recipe) or []
    except RewardError as err:
        say(f"tools: FAILED: {err}")
        return 2
    problem = template_problem(load_tokenizer(recipe), "the chat template")
    offered = f"; the recipe's {len(schemas)} tools ({', '.join(s['function']['name'] for s in schemas)})" \
        if schemas else ""
    if problem:
        say(f"tool transcripts: FAILED: {problem}")
        return 2
    say(f"tool transcripts: {transcripts} of the first {len(records)} chat records{offered}; the chat template "
        "writes tool calls and results, and no result is ever supervised")
    return 0
