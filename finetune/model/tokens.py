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
    ids = sorted(set(tokenizer.convert_tokens_to_ids(new)))
    # a tied lm_head follows the embedding's rows (peft ties the two); an untied one gets its own rows
    modules = embedding_module_names(model)[:1 if ties_embeddings(model) else None]
    saved = set(recipe.lora_modules_to_save or [])
    modules = [name for name in modules if name not in saved]  # trained in full already, as the recipe asks
    if modules:
        notice(f"new tokens {new}: training their rows of {' and '.join(modules)} alongside the adapter (peft's "
               f"trainable tokens: {len(ids)} row(s) each, saved with the adapter)")
    return {name: ids for name in modules} or None
