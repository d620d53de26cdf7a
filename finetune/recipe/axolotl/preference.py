"""axolotl's preference recipes, the part the recipe reads: the `rl:` keys with what to write in finetune
(`finetune validate` names them; port/preference/method.py converts them), and axolotl's preference dataset types
(`finetune validate` tells them from a GRPO transform; port/preference/records.py says how finetune reads each).

Checked against axolotl at commit 067b021 (2026-07): core/builders/rl.py, core/trainers/dpo/__init__.py,
utils/schemas/{config,deprecated,validation}.py and prompt_strategies/{dpo,orpo,kto}/ (the fields each `type:` reads
and the turns it writes). Pure data and small functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- the keys: hints for `finetune validate`, and the reason a key is dropped when nothing more is said --------

NO_REFERENCE_MODEL = ("not needed: finetune's reference is the model as it is before the first step; its log-probs "
                      "are computed once, in one no-grad pass, and cached with the tokenized data, so no second "
                      "model is loaded (docs/preference.md)")
PADDING_FREE = ("finetune packs whole pairs with no padding (TRL's `padding_free` falls back to padding since its "
                "DPO refactor, so in axolotl it does nothing)")

HINTS: dict[str, str] = {
    "rl": "write `method: dpo` (or ipo, orpo, simpo, kto), the method that `rl:` names",
    "dpo_beta": "write `rl_beta` (axolotl's old name for it)",
    "cpo_alpha": "write `rpo_alpha`: with `method: simpo` it is the weight of the chosen answers' NLL (TRL's CPO "
                 "`cpo_alpha`)",
    "trl": "not in finetune: of `trl:`, axolotl's DPO/IPO/ORPO/SimPO/KTO read only `trl.beta` (write `rl_beta`; "
           "`orpo_alpha` with `method: orpo`); the rest configures its GRPO trainer, whose keys are finetune's "
           "`method: grpo` settings (`finetune port` converts them)",
    "dpo_loss_type": "write `method: ipo` for ['ipo'], `method: dpo` for ['sigmoid'], and `rpo_alpha` for the "
                     "weight of an 'sft' term; TRL's other DPO losses are not in finetune",
    "dpo_loss_weights": "not in finetune as such: the preference loss has weight 1 and `rpo_alpha` weighs the SFT "
                        "term",
    "dpo_use_weighting": "not in finetune: WPO weighting (each pair's loss weighted by the policy's length-normalized "
                         "probability of its answers) changes what is trained; pairs count equally",
    "dpo_norm_loss": "not in finetune: DPO's sigmoid loss on length-averaged log-probs (current axolotl refuses the "
                     "key too); finetune's DPO sums the log-probs",
    "dpo_padding_free": "write `sample_packing: true`: " + PADDING_FREE,
    "precompute_ref_log_probs": NO_REFERENCE_MODEL.replace("not needed:", "not needed: finetune always precomputes;"),
    "rl_adapter_ref_model": NO_REFERENCE_MODEL,
    "dpo_use_logits_to_keep": "not needed: finetune runs the LM head on response positions only (current axolotl "
                              "refuses the key)",
    "dpo_use_liger_kernel": "not needed: a fused-kernel speed option with the same loss; finetune runs the LM head "
                            "on response positions only",
    "dpo_generate_during_eval": "not in finetune: `finetune generate` samples from the trained model",
    "max_prompt_len": "not needed: axolotl passes it to none of its DPO/IPO/ORPO/SimPO/KTO trainers (a no-op); "
                      "finetune shortens a prompt only when prompt + answer exceed `sequence_len` "
                      "(`excess_length_strategy: truncate` cuts it from its start, never the assistant header)",
    "remove_unused_columns": "not needed: finetune tokenizes the records itself (axolotl needs `false` for KTO and "
                             "ORPO)",
}

# --- the dataset types ------------------------------------------------------------------------------------

SYSTEM_FIELD = '"system" (optional), '


@dataclass(frozen=True)
class Layout:
    """An axolotl preference dataset type. `fields`: the records it reads. `reads`: finetune reads them as they
    are. `plain`: finetune reads them, but as plain text, where axolotl wraps them in chat turns. `chat`: the
    turns axolotl writes: "chatml" / "llama3" whatever chat_template says, "template": the recipe's template."""

    fields: str
    reads: bool = False
    plain: bool = False
    chat: str | None = None


def _pairs(chat: str) -> dict[str, Layout]:
    """axolotl's prompt_strategies/dpo/{chatml,llama3}.py: strings wrapped in fixed turns, or messages."""
    def strings(names: str, plain: bool = False) -> Layout:
        return Layout("{" + SYSTEM_FIELD + names + "} strings", plain=plain, chat=chat)

    return {
        f"{chat}.default": strings('"prompt" | "input" | "question" | "instruction", "chosen" | "chosen_response", '
                                   '"rejected" | "rejected_response"'),
        f"{chat}.prompt_pairs": strings('"prompt", "chosen", "rejected"', plain=True),
        f"{chat}.intel": strings('"question", "chosen", "rejected"'),
        f"{chat}.icr": strings('"input", "chosen", "rejected"'),
        f"{chat}.argilla": strings('"instruction", "chosen_response", "rejected_response"'),
        f"{chat}.argilla_chat": Layout('{"chosen": [user, assistant messages], "rejected": [...]}: TRL\'s implicit '
                                       "prompt", reads=True, chat=chat),
        f"{chat}.ultra": Layout('{' + SYSTEM_FIELD + '"prompt", "chosen": [user, assistant messages], "rejected": [...]}: '
                                "UltraFeedback's layout", reads=True, chat=chat),
    }


def _unpaired(chat: str) -> dict[str, Layout]:
    """axolotl's prompt_strategies/kto/{chatml,llama3}.py."""
    def strings(names: str, plain: bool = False) -> Layout:
        return Layout("{" + SYSTEM_FIELD + names + ', "label"} with string prompt and completion', plain=plain, chat=chat)

    return {
        f"{chat}.prompt_pairs": strings('"prompt", "completion"', plain=True),
        f"{chat}.ultra": strings('"prompt", "completion"', plain=True),
        f"{chat}.intel": strings('"question", "completion"'),
        f"{chat}.argilla": strings('"instruction", "completion"'),
        f"{chat}.argilla_chat": Layout('{"completion": [user, assistant messages], "label"}', chat=chat),
    }


PAIR_TYPES: dict[str, Layout] = {
    **_pairs("chatml"), **_pairs("llama3"),
    "chat_template.argilla_chat": Layout('{"chosen": [messages], "rejected": [messages]}: TRL\'s implicit prompt',
                                         reads=True, chat="template"),
    "chat_template.argilla": Layout('{' + SYSTEM_FIELD + '"prompt" (optional), "chosen": [messages], "rejected": '
                                    "[messages]} (axolotl's ORPO type)", reads=True, chat="template"),
    "passthrough.default": Layout("TRL's {prompt, chosen, rejected}, passed as they are", reads=True),
    "zephyr.nectar": Layout('{"prompt", "answers": [{"answer", "rank"}...]}'),
}
UNPAIRED_TYPES: dict[str, Layout] = {**_unpaired("chatml"), **_unpaired("llama3")}
# `reward_model: true` (axolotl's prompt_strategies/bradley_terry/): single-turn pairs of strings in chat turns
REWARD_TYPES: dict[str, Layout] = {
    "bradley_terry.chat_template": Layout('{' + SYSTEM_FIELD + '"input", "chosen", "rejected"} strings',
                                          chat="template"),
    "bradley_terry.llama3.icr": Layout('{' + SYSTEM_FIELD + '"input", "chosen", "rejected"} strings', chat="llama3"),
}
SHORT_NAMES = {"chatml": "chatml.default", "llama3": "llama3.default", "chat_template": "chat_template.default",
          "passthrough": "passthrough.default"}

def known(value: Any) -> bool:
    """`value` names one of axolotl's preference dataset types."""
    name = SHORT_NAMES.get(value, value) if isinstance(value, str) else None
    return name in PAIR_TYPES or name in UNPAIRED_TYPES or name in REWARD_TYPES or name == "chat_template.default"
