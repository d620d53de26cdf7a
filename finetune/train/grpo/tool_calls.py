"""The tool calls in what the model sampled, per template family.

    parser = call_parser(tokenizer)            # None: finetune cannot read this template's calls (validate says so)
    turn = parser(ids, prefix_ids, schemas)    # Turn(content, calls, malformed)

Where the tokenizer carries transformers' response parser (`response_template`, or the older `response_schema`: a
model's own description of its output), that reads the turn. Otherwise the template's family decides:

    hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more (Hermes, Qwen2.5 / Qwen3,
             SmolLM3, finetune's `chatml_tools`)
    llama3   the whole turn one JSON object {"name": ..., "parameters": {...}} (Llama 3.1 / 3.2's JSON tool calls)

A turn that opens a call it does not complete (bad JSON, no name, arguments that are not an object, no closing tag)
is `malformed`: counted as a call and a failure, and the episode ends there (TRL 1.16 reads such a turn as plain
text and ends the episode the same way, uncounted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass(frozen=True)
class Turn:
    content: str
    calls: list[dict] = field(default_factory=list)  # [{"type": "function", "function": {"name", "arguments"}}]
    malformed: str | None = None  # why the turn's call could not be read

    def message(self) -> dict:
        """The assistant message, as TRL's completions list it."""
        out = {"role": "assistant", "content": self.content}
        if self.calls:
            out["tool_calls"] = self.calls
        return out


def family(tokenizer) -> str | None:
    """'response_template', 'hermes', 'llama3', or None."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return "response_template"
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
    if "<tool_call>" in template:
        return "hermes"
    if "<|eot_id|>" in template and "parameters" in template:
        return "llama3"
    return None


def call_parser(tokenizer):
    """parse(ids, prefix_ids, schemas) -> Turn for this tokenizer's family, or None."""
    kind = family(tokenizer)
    if kind is None:
        return None

    def parse(ids: list[int], prefix_ids: list[int], schemas: list[dict]) -> Turn:
        if kind == "response_template":
            return _from_response_parser(tokenizer, ids, prefix_ids, schemas)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        special = [t for t in tokenizer.all_special_tokens if t]
        return (_hermes if kind == "hermes" else _llama3)(text, special)

    return parse


def _call(obj, key: str = "arguments") -> tuple[dict | None, str | None]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, "a call needs a \"name\" (a string)"
    arguments = obj.get(key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # the OpenAI shape writes arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f"the arguments of {obj['name']} are not JSON"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"the arguments of {obj['name']} are a {type(arguments).__name__}, not an object"
    return {"type": "function", "function": {"name": obj["name"], "arguments": arguments}}, None


def _strip(text: str, special: list[str]) -> str:
    for token in special:
        text = text.replace(token, "")
    return text


def _hermes(text: str, special: list[str]) -> Turn:
    body = _strip(text, special)
    opened = body.count("<tool_call>")
    if not opened:
        return Turn(body.strip())
    calls = []
    for block in _HERMES.findall(body):
        try:
            call, problem = _call(json.loads(block.strip()))
        except json.JSONDecodeError as err:
            call, problem = None, f"a <tool_call> block is not JSON ({err.msg} at character {err.pos})"
        if problem:
            return Turn(body.strip(), malformed=problem)
        calls.append(call)
    if len(calls) < opened:
        return Turn(body.strip(), malformed="a <tool_call> is not closed with </tool_call>")
    return Turn(body[:body.index("<tool_call>")].strip(), calls)


def _llama3(text: str, special: list[str]) -> Turn:
    body = _strip(text, special).strip()
    if not body.startswith("{"):
        return Turn(body)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return Turn(body, malformed=f"the turn opens a JSON tool call that is not JSON ({err.msg})") \
            if body.startswith('{"name"') else Turn(body)
    call, problem = _call(obj, "parameters")
    return Turn("", [call]) if call else Turn(body, malformed=problem)


def _from_response_parser(tokenizer, ids, prefix_ids, schemas) -> Turn:
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix_ids, tools=schemas or None)
    except Exception as err:  # the parser's regex or JSON failed on what the model wrote
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return Turn(text, malformed=f"the tokenizer's response parser could not read the turn ({type(err).__name__})")
    content = parsed.get("content") or "" if isinstance(parsed, dict) else ""
    calls = []
    for raw in (parsed.get("tool_calls") or []) if isinstance(parsed, dict) else []:
        call, problem = _call(raw.get("function", raw) if isinstance(raw, dict) else raw)
        if problem:
            return Turn(str(content), malformed=problem)
        calls.append(call)
    return Turn(str(content).removesuffix(tokenizer.eos_token or ""), calls)
