"""The contracts between the stages (DESIGN.md, "The seams"): constants that ingest/, data/, model/ and train/
must agree on, defined once here, below every stage, so each imports them down the pipeline.

Pure: no imports at all.
"""

from __future__ import annotations

# A label the loss ignores: torch.nn.CrossEntropyLoss's default ignore_index, which the HF models' loss uses.
# The data stage writes it on every token that is not supervised; packing, collation, the supervised-token
# counters and the supervised-logits loss read it.
IGNORE_INDEX = -100

# ChatML: the chat template set on a tokenizer that has none of its own (and on `chat_template: chatml`);
# the data stage renders chats with whatever template the tokenizer then carries.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# ChatML with tools (`chat_template: chatml_tools`): the Hermes / Qwen2.5 tool format, for a model whose own template
# cannot write tool calls (SmolLM2's, ChatML). Tools as JSON schemas in the system turn, a call as
# <tool_call>{"name": ..., "arguments": ...}</tool_call> in the assistant turn, results as <tool_response> blocks in one
# user turn; every turn written the same whatever follows (prefix-preserving: finetune/data/tool_chat.py checks it).
CHATML_TOOLS_TEMPLATE = (
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' + (system + '\n\n' if system else '') + '# Tools\n\nYou may call one or more "
    "functions. Their signatures are within <tools></tools>:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each call, write a JSON object with the function name and its arguments within "
    "<tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n' }}"
    "{%- elif system is not none %}{{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{{- ('\n' if message['content'] or not loop.first else '') + '<tool_call>\n{\"name\": \"' + f['name'] + "
    "'\", \"arguments\": ' + (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) + "
    "'}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# The alpaca prompt of an instruction record. The data stage renders SFT instruction records with it, and
# ingestion renders the prompt of an alpaca-style preference record ({instruction, input, chosen, rejected})
# with it, so a preference prompt reads exactly as the same instruction does in SFT.
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def alpaca_prompt(record: dict) -> str:
    """The prompt of an instruction record: with the input section only when `input` holds some text. A record's
    `system` text, when it has one, replaces the opening sentence ("Below is an instruction..."), as axolotl's
    alpaca `field_system` / `system_prompt` do."""
    if (record.get("input") or "").strip():
        prompt = ALPACA_WITH_INPUT.format(instruction=record["instruction"], input=record["input"])
    else:
        prompt = ALPACA_NO_INPUT.format(instruction=record["instruction"])
    system = (record.get("system") or "").strip()
    return f"{system}\n\n{prompt.split(chr(10) * 2, 1)[1]}" if system else prompt
