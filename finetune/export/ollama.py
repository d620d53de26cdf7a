"""An Ollama `Modelfile` for an exported GGUF: FROM the file, the chat template in Ollama's Go template syntax
when the model's Jinja template is one we can translate exactly, stop tokens and the context length.

We never translate Jinja in general. We render the model's own template on probe conversations and compare the
text with what ChatML produces: only an exact match gets the ChatML Go template (plus the default system
prompt the Jinja template injects, as SYSTEM). Anything else gets no TEMPLATE line, and Ollama falls back to
the `tokenizer.chat_template` embedded in the GGUF, which it matches against the templates it knows.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.atomic import write_text_atomic

# Ollama puts the SYSTEM prompt first in .Messages, so one range renders system, user and assistant turns.
CHATML_GO = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
# Ollama's default context is small (2,048 to 4,096 tokens, by version); the model's own limit, capped to
# keep the KV cache of a laptop-sized run reasonable: 8,192 tokens of a 135M model's cache is ~180 MB.
MAX_NUM_CTX = 8192

_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
          {"role": "user", "content": "2+2?"}]


def _chatml(messages: list[dict]) -> str:
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _render(tokenizer, messages: list[dict]) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses a probe (e.g. wants strict alternation with system): no match
        return None


def chatml_system_default(tokenizer) -> str | None:
    """None if the template is not exactly ChatML; else the default system prompt it adds ("" for none)."""
    with_system = [{"role": "system", "content": "Be brief."}] + _PROBE
    if _render(tokenizer, with_system) != _chatml(with_system):
        return None
    rendered = _render(tokenizer, _PROBE)
    if rendered == _chatml(_PROBE):
        return ""
    head = "<|im_start|>system\n"
    if rendered and rendered.startswith(head):
        system = rendered[len(head):].split("<|im_end|>\n", 1)[0]
        if rendered == _chatml([{"role": "system", "content": system}] + _PROBE):
            return system
    return None


def _alpaca_go() -> str:
    """The alpaca prompt (no input section) with Ollama's {{ .Prompt }} where the instruction goes."""
    from finetune.contract import ALPACA_NO_INPUT

    return ALPACA_NO_INPUT.replace("{instruction}", "{{ .Prompt }}")


def modelfile(gguf_name: str, tokenizer, context_length: int, prompt_format: str = "chat") -> str:
    """`prompt_format`: what the run trained with (finetune.model.prompt_format.served_format): the chat template,
    the alpaca prompt, or plain continuation."""
    stem = gguf_name.removesuffix(".gguf")
    lines = [f"# ollama create NAME -f {stem}.Modelfile && ollama run NAME", f"FROM ./{gguf_name}"]
    system = chatml_system_default(tokenizer) if tokenizer.chat_template and prompt_format == "chat" else None
    stops = []
    if prompt_format == "alpaca":
        lines += ["# the run trained on instruction records: the alpaca prompt, not the chat template",
                  f'TEMPLATE """{_alpaca_go()}"""']
    elif prompt_format == "raw":
        lines += ["# the run trained on completion text: plain continuation, not the chat template",
                  'TEMPLATE """{{ .Prompt }}"""']
    elif system is not None:
        lines.append(f'TEMPLATE """{CHATML_GO}"""')
        if system:
            lines.append(f'SYSTEM """{system}"""')
        stops.append("<|im_end|>")
    else:
        lines.append("# no TEMPLATE: the chat template embedded in the GGUF (tokenizer.chat_template) is used")
    if tokenizer.eos_token and tokenizer.eos_token not in stops:
        stops.append(tokenizer.eos_token)
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    lines.append(f"PARAMETER num_ctx {min(context_length, MAX_NUM_CTX)}")
    return "\n".join(lines) + "\n"


def modelfile_path(gguf_path: Path) -> Path:
    """run.f16.gguf -> run.f16.Modelfile: one per file, so an f16 and a q8_0 export can share a folder."""
    return gguf_path.with_suffix(".Modelfile")


def write_modelfile(gguf_path: Path, tokenizer, context_length: int, prompt_format: str = "chat") -> Path:
    """The Modelfile beside the GGUF, written whole (temp file in the same folder, then rename)."""
    path = modelfile_path(gguf_path)
    write_text_atomic(path, modelfile(gguf_path.name, tokenizer, context_length, prompt_format))
    return path
