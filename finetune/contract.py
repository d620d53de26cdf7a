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
