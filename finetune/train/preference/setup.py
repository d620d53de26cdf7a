"""What a preference run adds to the SFT run's steps (finetune/train/run.py): its collator, its probes, and
the Trainer subclass with the objective, the token store and the reference table (cached or to compute)."""

from __future__ import annotations

from finetune.log import get_logger

log = get_logger(__name__)


def preference_collator(store, pad_id: int, flatten: bool, branches: bool, pixels=None):
    """`branches`: the attention path runs a segment starting at position p > 0 as a continuation of the prompt
    before it (finetune/model/varlen_attention.py), so packed pairs can share their prompt. `pixels`: a
    vision-language model's (finetune/data/vision/collate.py), the prompts' images in every batch."""
    from finetune.data.preference.collate import PreferenceCollator

    share = branches and not store.unpaired
    if share:
        train = store.split_ids("train")
        prompts = sum(len(store.prompts[i]) for i in train)
        tokens = sum(store.length(i) for i in train)
        log.info(f"pairs share their prompt in packed rows: prompt, chosen, rejected, the rejected response attending "
                 f"to the prompt and itself; {tokens - prompts:,} train tokens instead of {tokens:,} "
                 f"({prompts / max(tokens, 1):.0%} fewer), the same log-probs")
    return PreferenceCollator(store, pad_id, flatten=flatten, share_prompt=share, pixels=pixels)


def probe_preference(model, collator, pad_id: int, attn: str, packed: bool) -> bool:
    """The packing guard (segments isolated by position_ids, as in SFT rows) and the gathered-head probe;
    returns whether the loss must read the model's full logits."""
    from finetune.data.collate import Collator
    from finetune.data.preference.rows import UNPACKED
    from finetune.model import base_causal_lm
    from finetune.model.sequence_logps import probe_gathered_head

    if packed:
        from finetune.model.isolation import guard_packing

        # the same position_ids restarts a preference row uses between chosen and rejected and between pairs
        leak = guard_packing(model, Collator(pad_id, flatten=collator.flatten), attn)
        log.info(f"packed sequences are isolated: a packed sequence's logits match it alone (leak {leak:.1e} of full "
                 "cross-attention)")
        if collator.share_prompt:
            from finetune.model.isolation import MAX_LEAK_FRACTION, shared_prompt_leak

            leak = shared_prompt_leak(model, collator)
            if leak > MAX_LEAK_FRACTION:  # the guard above holds for the unshared layout: train with that
                collator.share_prompt = False
                log.warning(f"pairs do not share their prompt: with it shared, a response's logits move by {leak:.2g} "
                            "of full cross-attention on this model; each response is packed after its own prompt")
            else:
                log.info(f"pairs sharing their prompt are isolated: chosen and rejected each match their prompt "
                         f"alone (leak {leak:.1e} of full cross-attention)")
    from accelerate.utils import send_to_device

    store = collator.store  # the probe needs any two items: the shortest two cost the least
    items = [{UNPACKED: [i]} for i in sorted(range(len(store)), key=store.length)[:2]]
    batch = send_to_device(collator(items), next(model.parameters()).device)
    head = base_causal_lm(model).get_output_embeddings()
    if head is not None and probe_gathered_head(model, head, batch):
        log.info("preference log-probs: the LM head runs on response positions only")
        return False
    log.info("preference log-probs: from the model's full logits (its forward does not allow gathering positions)")
    return True


def reference_for(recipe, prepared, precision: str, resume_from) -> tuple[object, object, bool]:
    """(the cached reference table or None, where it is stored, whether the run resumes). A resumed run without its
    table is refused: its model is no longer the one the run started from (one lacking rows the run reads is refused
    at its first loss, where the rows it reads are known: trainer.items_used)."""
    from finetune.errors import DataError
    from finetune.recipe.methods import uses_reference
    from finetune.train.preference.reference import load_table, reference_path

    if not uses_reference(recipe):
        return None, None, bool(resume_from)
    images = ""
    if prepared.store.images is not None:  # the images' bytes: an image edited in place keeps its path
        from finetune.data.vision.images import images_digest

        images = images_digest(prepared.store.images)
    path = reference_path(recipe, prepared.key, precision, images)
    table = load_table(path, len(prepared.store))
    if table is not None:
        import torch

        scored = int((~torch.isnan(table).any(dim=1)).sum())
        part = f"; {scored:,} of {len(table):,} rows scored" if scored < len(table) else ""
        log.info(f"reference log-probs: read from {path} (the same data, model and settings{part})")
    elif resume_from:
        raise DataError(
            f"resuming needs the reference log-probs this run computed when it started ({path}), and they are gone "
            "(the cache was cleared, or the base model's files changed); the model being resumed is no longer the "
            "model the run started from, so they cannot be recomputed. Start over with `resume: false`"
        )
    return table, path, bool(resume_from)


def preference_trainer_kwargs(recipe, built, prepared, reference: tuple) -> dict:
    """PreferenceTrainer's own arguments; `reference` is reference_for's answer."""
    from finetune.data.preference.rows import row_capacity
    from finetune.model import base_causal_lm
    from finetune.train.preference.objective import Objective

    table, path, resumed = reference
    note = dropout_note(built.model, recipe)
    if note:
        log.info(note)
    budget = recipe.micro_batch_size * row_capacity(recipe, prepared.store)  # a training micro batch's tokens
    return {"objective": Objective(recipe), "store": prepared.store, "full_logits": built.full_logits,
            "head": base_causal_lm(built.model).get_output_embeddings(), "reference": table,
            "reference_path": path, "reference_batch_tokens": budget,
            "reference_collator": built.collator, "resumed": resumed,
            "unrebuildable": unrebuildable(recipe, built.model) if resumed else None}


def unrebuildable(recipe, model) -> str | None:
    """Why a resumed run cannot score reference rows its first run did not, or None where it can: a fresh LoRA on a
    base (B zero, A drawn: peft's default init) starts as exactly the base, so the base with the adapter switched off
    is the model the run started from."""
    from finetune.model.loader import adapter_folder

    config = getattr(model, "peft_config", {}).get("default")
    if recipe.adapter == "none" or config is None:
        return "a full fine-tune's starting weights are not kept"
    if adapter_folder(recipe.base_model) is not None:
        return "it continues an adapter, so its starting model is not the base with the adapter switched off"
    # DoRA starts as the base too: B zero, and its magnitudes are the base's column norms (m / |W| = 1, exactly in
    # fp32; in bf16 to rounding, ~1e-4 of a response's log-prob). PiSSA / OLoRA / EVA start elsewhere.
    if recipe.peft_init_lora_weights not in (True, "gaussian"):
        return (f"its adapter did not start as a no-op (peft_init_lora_weights: {recipe.peft_init_lora_weights}), so "
                "switching it off does not give the starting model")
    if getattr(config, "modules_to_save", None) or getattr(config, "trainable_token_indices", None):
        return "it trains whole modules or token rows beside the adapter (modules_to_save / trainable tokens)"
    return None


def dropout_note(model, recipe) -> str | None:
    """Why step 1's loss is not the policy = reference value (DPO: log 2), when dropout is why: the policy trains
    with dropout, the reference pass scored the same model without it (eval mode; reference.py), so their
    log-probs differ before any update. A fresh LoRA's own dropout does not count: its B is zero at the start.
    We keep the recipe's dropout (TRL's DPOTrainer switches every dropout off by default, `disable_dropout`):
    it is the user's regularisation, and the eval (no dropout) still starts exactly at the reference."""
    import torch

    from finetune.model.loader import adapter_folder
    from finetune.recipe.methods import uses_reference

    if not uses_reference(recipe):
        return None
    continued = adapter_folder(recipe.base_model) is not None
    where = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            if ".lora_dropout." in f"{name}." or name.endswith("lora_dropout"):
                if continued:
                    where.setdefault(f"the continued adapter's lora_dropout {module.p:g}", None)
            else:
                where.setdefault(f"dropout modules with p={module.p:g}", None)
    config = getattr(model, "config", None)
    for key, value in (config.to_dict() if config is not None else {}).items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value > 0:
            where.setdefault(f"the model config's {key} {value:g}", None)
    if not where:
        return None
    start = "log 2 = 0.693" if recipe.method == "dpo" else "its value while the policy equals the reference"
    return (f"step 1's training loss is not exactly {start}: the policy trains with dropout ({', '.join(where)}), "
            "while the reference log-probs were scored without it (eval mode), so the two differ by dropout noise "
            "before any update; the training rewards and accuracy carry that noise from step 1. The eval before "
            "training has no dropout and starts exactly there. Expected, not a bug (docs/preference.md)")


def preference_record(recipe, trainer) -> dict:
    """What run.json records of a preference run: the method's settings, the reference pass, the last metrics."""
    from finetune.recipe.methods import method_settings

    history = trainer.state.log_history
    shared = bool(getattr(getattr(trainer, "reference_collator", None), "share_prompt", False))
    store = trainer.store
    last_train = next((e for e in reversed(history) if "rewards/accuracies" in e or "rewards/margins" in e), {})
    last_eval = next((e for e in reversed(history) if any(k.startswith("eval_rewards/") for k in e)), {})
    return {
        "settings": method_settings(recipe),
        # packed pairs held their prompt once, both responses after it (finetune/data/preference/collate.py), so
        # the train split's rows held fewer tokens than data.train.tokens counts (a prompt per response)
        "shared_prompt": shared,
        "train_tokens_in_rows": sum(store.length(i) - (len(store.prompts[i]) if shared else 0)
                                    for i in store.split_ids("train")),
        "reference_pass_s": getattr(trainer, "reference_seconds", None),
        # the items the run reads (the eval split's, its steps' train items) and those its pass scored (not cached);
        # None: no reference, or a cached table that held every item
        "reference_items": getattr(trainer, "reference_items", None),
        "reference_table": str(trainer.reference_path) if getattr(trainer, "reference_path", None) else None,
        "train_metrics": {k: v for k, v in last_train.items() if "/" in k},
        "eval_metrics": {k: v for k, v in last_eval.items() if k.startswith("eval_") and "/" in k},
    }
