"""What a reward run adds to the SFT run's steps (finetune/train/run.py): its probes, the Trainer's arguments and what
run.json records. Its rows and collator are the preference methods' (the same pairs: finetune/data/preference/)."""

from __future__ import annotations

from finetune.log import get_logger

log = get_logger(__name__)


def probe_reward(model, collator, pad_id: int, attn: str, packed: bool) -> bool:
    """The packing guard for a reward model: packed sequences (and, sharing, a pair's responses after one prompt)
    must leave each other's hidden states, the score head's input, as they are alone; else training refuses (or, for
    the shared prompt, each response keeps its own prompt). Returns False: a reward model has no LM head to gather."""
    from finetune.data.collate import Collator
    from finetune.model.isolation import MAX_LEAK_FRACTION, guard_packing, shared_prompt_leak
    from finetune.model.score_head import HiddenStates

    if not packed:
        return False
    hidden = HiddenStates(model)
    leak = guard_packing(hidden, Collator(pad_id, flatten=collator.flatten), attn)
    log.info(f"packed sequences are isolated: a packed sequence's hidden states match it alone (leak {leak:.1e} of "
             "full cross-attention)")
    if collator.share_prompt:
        leak = shared_prompt_leak(hidden, collator)
        if leak > MAX_LEAK_FRACTION:
            collator.share_prompt = False
            log.warning(f"pairs do not share their prompt: with it shared, a response's hidden states move by "
                        f"{leak:.2g} of full cross-attention on this model; each response is packed after its own "
                        "prompt")
        else:
            log.info(f"pairs sharing their prompt are isolated: chosen and rejected each score as after their prompt "
                     f"alone (leak {leak:.1e} of full cross-attention)")
    return False


def reward_trainer_kwargs(recipe, tokenizer, plain_text: bool) -> dict:
    """RewardTrainer's own arguments; a note when plain-text pairs end on an EOS that is also the pad token."""
    from finetune.recipe.methods import method_setting

    if plain_text and tokenizer.pad_token_id == tokenizer.eos_token_id:
        log.warning(f"the pad token is the EOS ({tokenizer.eos_token!r}), and plain-text pairs end with it: finetune "
                    "scores each sequence at its last token by position, so training, `finetune eval` and GRPO read "
                    "that EOS; a tool that pools at the last token that is not the pad token (transformers' own "
                    "forward, TRL) would read the token before it. To serve this model to such tools, give it a pad "
                    "token of its own (`special_tokens: {pad_token: ...}`)")
    return {"center_coefficient": method_setting(recipe, "center_rewards_coefficient")}


def reward_record(recipe, trainer, collator, tokenizer, conversational: bool) -> dict:
    """What run.json records of a reward run: the settings, how it scores (the scorer reapplies it:
    finetune/model/scorer.py), whether pairs shared their prompt, the last metrics."""
    from finetune.model.scorer import scoring_record
    from finetune.recipe.methods import method_settings

    history = trainer.state.log_history
    last_train = next((e for e in reversed(history) if "accuracy" in e), {})
    last_eval = next((e for e in reversed(history) if "eval_accuracy" in e), {})
    return {"settings": method_settings(recipe), "scoring": scoring_record(recipe, tokenizer, conversational),
            "shared_prompt": bool(getattr(collator, "share_prompt", False)),
            "train_metrics": {k: v for k, v in last_train.items() if k in METRICS},
            "eval_metrics": {k: v for k, v in last_eval.items() if k.removeprefix("eval_") in METRICS}}


METRICS = ("accuracy", "margin", "chosen_reward", "rejected_reward", "mean_reward", "min_reward", "max_reward")
