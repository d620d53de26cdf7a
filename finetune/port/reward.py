"""axolotl's reward-model recipes (`reward_model: true`) -> finetune's `method: reward`; their `bradley_terry.*`
dataset types are port/preference/records.py's. Pure data and small functions, like axolotl.py beside it;
convert.py applies them.

Checked against axolotl at commit 067b021 (2026-07): core/builders/causal.py (AxolotlRewardTrainer on TRL's
RewardConfig, `center_rewards_coefficient` passed through, TRL's DataCollatorForPreference), utils/schemas/config.py
and validation.py (`reward_model` sets num_labels 1 and model_type AutoModelForSequenceClassification, and
`pad_to_sequence_len` true), prompt_strategies/bradley_terry/ and docs/reward_modelling.qmd. axolotl's process
reward models (`process_reward_model: true`, TRL's PRMTrainer) are not ported: finetune leaves them out, as TRL moved
PRMTrainer to its experimental package.
"""

from __future__ import annotations

from typing import Any

from finetune.port.preference.method import KeyPort

# keys axolotl reads for a reward model; convert.py asks here first when `reward_model: true`
KEYS = ("reward_model", "center_rewards_coefficient", "num_labels", "pad_to_sequence_len", "remove_unused_columns")


def port_keys(config: dict) -> dict[str, KeyPort]:
    """What each reward-model key of `config` becomes (`config["reward_model"]` is true)."""
    ports = {"reward_model": KeyPort({"method": "reward"}, "a Bradley-Terry reward model: the base's "
                                     "sequence-classification class with one output, trained on preference pairs "
                                     "(docs/reward-models.md)")}
    coefficient = config.get("center_rewards_coefficient")
    if coefficient is not None:
        ports["center_rewards_coefficient"] = KeyPort({"center_rewards_coefficient": coefficient})
    labels = config.get("num_labels")
    if labels is not None:
        ports["num_labels"] = (KeyPort(drop="not needed: a reward model has one output, finetune's always") if labels == 1
                               else KeyPort(block=f"num_labels {labels}: a reward model scores with one output; "
                                                  "delete the line to train one"))
    if "pad_to_sequence_len" in config:
        ports["pad_to_sequence_len"] = KeyPort(drop="not needed: each sequence is scored at its own last token, "
                                                    "however the batch is padded or packed")
    if "remove_unused_columns" in config:
        ports["remove_unused_columns"] = KeyPort(drop="not needed: finetune tokenizes the records itself")
    return ports


def note_packing(out: Any) -> None:
    """axolotl trains a reward model on padded pairs; finetune can pack whole pairs, their prompt held once."""
    if not out.settings.get("sample_packing"):
        out.note("method", "`sample_packing: true` packs whole pairs with each prompt held once (chosen and rejected "
                           "after it), fewer tokens than axolotl's padded pairs: worth setting")
