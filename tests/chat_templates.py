"""Chat templates in the turn formats of the families the matrix trains, for the masking tests (test_chat_templates.py).

Written for these tests after each family's published turn format, trimmed to the turns (no tools, no dates);
they are not the vendors' files. Each keeps what matters to locating assistant turns: Llama 3's headers and
<|eot_id|>; Gemma's `model` role, the system prompt folded into the first user turn and <end_of_turn>; Phi-3's
<|end|> and the EOS it writes only to close a conversation; Mistral's [INST] ... [/INST] with the answer and </s>
after it; Qwen3's <think> block, written for assistant turns after the last user message and dropped before it.
"""

from __future__ import annotations

LLAMA3 = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

GEMMA = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\n\n' %}"
    "{%- set turns = messages[1:] %}{%- else %}{%- set first = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for m in turns %}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\n' + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}"
)

PHI3 = (
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\n' }}{%- else %}{{- eos_token }}{%- endif %}"
)

MISTRAL = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}{{- '[INST] ' + m['content'] + ' [/INST]' }}"
    "{%- elif m['role'] == 'assistant' %}{{- ' ' + m['content'] + '</s>' }}{%- endif %}"
    "{%- endfor %}"
)

QWEN3 = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set content = m['content'].split('</think>')[-1].lstrip('\n') %}"
    "{%- set reasoning = m['content'].split('</think>')[0].split('<think>')[-1].strip('\n') "
    "if '</think>' in m['content'] else '' %}"
    "{{- '<|im_start|>assistant\n' }}"
    "{%- if loop.index0 > ns.last_query %}{{- '<think>\n' + reasoning + '\n</think>\n\n' }}{%- endif %}"
    "{{- content + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# name -> (template, its special tokens, what ends an assistant turn followed by more turns, ... the last turn)
FAMILY_TEMPLATES = {
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|eot_id|>", "<|eot_id|>"),
    "gemma": (GEMMA, ["<bos>", "<start_of_turn>", "<end_of_turn>"], "<end_of_turn>\n", "<end_of_turn>\n"),
    "phi3": (PHI3, ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"], "<|end|>\n", "<|end|>\n<|endoftext|>"),
    "mistral": (MISTRAL, ["<s>", "</s>", "[INST]", "[/INST]"], "</s>", "</s>"),
}
