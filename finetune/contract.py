"""The tokenized-example contract between the stages (DESIGN.md, "The seams"): constants that data/, model/
and train/ must agree on, defined once here, below every stage, so each imports them down the pipeline.

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
