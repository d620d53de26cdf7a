"""New tokens from the recipe (`special_tokens`, `tokens`), the model's side: given embedding rows in the
model and, with an adapter, trained through full copies of the embeddings and lm_head (modules to save).
The tokenizer's side (adding them when it is loaded) is in finetune/model/loader.py.

A LoRA adapter cannot learn a new token: the token's embedding row and its lm_head row are fresh (the mean of
the others) and sit outside every adapted layer. Training those two modules in full is what gives it meaning.
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


def fit_embeddings(model, tokenizer, recipe) -> list[str] | None:
    """Grow the embeddings to the tokenizer; returns lora_modules_to_save, widened to the embeddings and lm_head
    when the recipe added tokens and trains an adapter."""
    from finetune.model.targets import embedding_module_names

    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        # new rows start at the mean of the old ones (transformers' mean_resizing), not at random
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        notice(f"new tokens: embeddings resized from {rows:,} to {len(tokenizer):,} rows")
    saved = list(recipe.lora_modules_to_save or [])
    new = tokens_new_to_base(recipe)
    if not new or recipe.adapter == "none":
        return saved or None
    wanted = [n for n in embedding_module_names(model) if n not in saved]
    if wanted:
        notice(f"new tokens {new}: training {' and '.join(wanted)} in full alongside the adapter "
               f"(lora_modules_to_save), so the new tokens can be learned; the adapter grows accordingly")
    return saved + wanted or None
