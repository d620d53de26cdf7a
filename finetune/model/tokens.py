"""New tokens from the recipe (`special_tokens`, `tokens`), the model's side: given embedding rows in the
model and, with an adapter, their rows of the embeddings and lm_head trained (peft's trainable tokens).
The tokenizer's side (adding them when it is loaded) is in finetune/model/loader.py.

A LoRA adapter cannot learn a new token: the token's embedding row and its lm_head row are fresh (the mean of
the others) and sit outside every adapted layer. Training those rows is what gives it meaning; the rest of both
matrices stays the base's, so the adapter holds a row per new token, not two copies of the vocabulary.
"""

from __future__ import annotations

from finetune.log import get_logger

from finetune.model.loader import missing_tokens, recipe_tokens, resolve_model_path


def tokens_new_to_base(recipe) -> list[str]:
    """The recipe's tokens the base model's own tokenizer lacks (reloads it: cheap, and exact even when the
    embedding matrix has spare padded rows)."""
    if not recipe_tokens(recipe):
        return []
    from transformers import AutoTokenizer

    source = resolve_model_path(recipe.tokenizer_config or recipe.base_model, recipe.cache_dir)
    return missing_tokens(AutoTokenizer.from_pretrained(source, trust_remote_code=recipe.trust_remote_code), recipe)


def notice(message: str) -> None:
    get_logger(__name__).info(message)


def fit_embeddings(model, tokenizer, recipe) -> dict[str, list[int]] | None:
    """Grow the embeddings to the tokenizer; returns peft's `trainable_token_indices` for the recipe's new tokens
    when it trains an adapter: their embedding rows and (unless tied to the embeddings) their lm_head rows, trained
    alongside the adapter and saved with it: one row per new token, not the whole matrices (issue 33: a new pad
    token made a LoRA adapter 718 MB)."""
    from finetune.model.targets import embedding_module_names, ties_embeddings

    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        # new rows start at the mean of the old ones (transformers' mean_resizing), not at random
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        notice(f"new tokens: embeddings resized from {rows:,} to {len(tokenizer):,} rows")
    new = tokens_new_to_base(recipe)
    if not new or recipe.adapter == "none":
        return None
    _check_rows_trainable(recipe, new)
    ids = sorted(set(tokenizer.convert_tokens_to_ids(new)))
    # a tied lm_head follows the embedding's rows (peft ties the two); an untied one gets its own rows
    modules = embedding_module_names(model)[:1 if ties_embeddings(model) else None]
    saved = set(recipe.lora_modules_to_save or [])
    modules = [name for name in modules if name not in saved]  # trained in full already, as the recipe asks
    if modules:
        notice(f"new tokens {new}: training their rows of {' and '.join(modules)} alongside the adapter (peft's "
               f"trainable tokens: {len(ids)} row(s) each, saved with the adapter)")
    return {name: ids for name in modules} or None


def _check_rows_trainable(recipe, new: list[str]) -> None:
    """Where peft's trainable token rows cannot go, one message instead of a peft error at its first forward."""
    from finetune.errors import ModelError
    from finetune.model.loader import adapter_folder

    folder = adapter_folder(recipe.base_model)
    if folder is not None:
        raise ModelError(
            f"tokens {new} are new to the adapter in {folder}, which this run continues: a continued adapter keeps "
            "its own settings, so their embedding and lm_head rows would not train (and the adapter would save "
            "both whole resized matrices). Add the tokens in the run that trained that adapter, or merge it "
            f"(`finetune merge {folder}`) and set base_model to the merged folder to start a fresh adapter")
    import torch
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled() and not torch.cuda.is_available():
        raise ModelError(
            f"tokens {new} with an adapter under ZeRO-3 on a CPU: peft gathers the new rows from the sharded "
            "embedding on a CUDA device only. Use `deepspeed: zero2` here (ZeRO-3 with new tokens runs on GPUs), "
            "or train without the new tokens")
