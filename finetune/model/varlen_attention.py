"""Packed rows on CPU: attention computed one example at a time instead of over the whole row.

With `sample_packing`, a 512-token row holds several examples that must not see each other. transformers
expresses that as a block-diagonal mask, and SDPA then scores every (query, key) pair of the row: 512 x 512
for a row whose four ~128-token examples need a quarter of that. On GPU, flash-attn's variable-length
kernel skips the masked blocks; on CPU nothing does, and attention (forward + backward) was ~17% of a
SmolLM2-135M LoRA step. So on CPU each example of a packed row gets its own causal SDPA call on its own
slice of queries, keys and values: the same numbers as the masked kernel (the masked-out scores are
exactly zero weights there), a fraction of the work, and isolation by construction (the packing guard
still proves it on the real model before training).

Registered with transformers' public AttentionInterface / AttentionMaskInterface under NAME. Example
boundaries come from `position_ids` (a position that does not follow its predecessor starts an example),
as transformers itself detects packed rows. Anything else (a padding mask, a KV cache, decoding, models
with sliding windows or attention extras) goes to the stock SDPA function.

Branches (a prompt shared by a pair's two responses, finetune/data/preference/collate.py): a segment whose
positions start at p > 0 instead of 0 continues the first p tokens of the last segment that started at 0. Its
queries attend to those p keys and, causally, to its own: exactly what they would see after their own copy of
the prompt (the prompt's keys and values depend only on the prompt, and rotary positions come from
position_ids). The other kernels (the masked SDPA, flex_attention, flash-attn) read such a segment as an
example of its own, so only this path is given rows with branches (finetune/train/run.py decides).
"""

from __future__ import annotations

from finetune.compat import attn_implementation

NAME = "finetune_sdpa_varlen"
_registered = False


def segments(positions: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each example in a packed row: a new one starts where positions stop counting up."""
    starts = [0] + [t for t in range(1, len(positions)) if positions[t] != positions[t - 1] + 1]
    return list(zip(starts, starts[1:] + [len(positions)]))


def varlen_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                        is_causal=None, **kwargs):
    """(batch, seq, heads, head_dim) attention output, example by example; stock SDPA when not a packed row."""
    import torch

    from finetune.compat import sdpa_functions

    sdpa_attention_forward, _ = sdpa_functions()

    position_ids = kwargs.get("position_ids")
    q_length = query.shape[2]
    plain = (attention_mask is not None or position_ids is None or q_length == 1 or key.shape[2] != q_length
             or not getattr(module, "is_causal", True) or kwargs.get("softcap") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # grouped-query attention: SDPA reads each key/value head for its group of query heads (enable_gqa), where
    # repeating them first kept copies 3x the size for the backward pass (SmolLM2: 9 query heads, 3 key/value)
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    position_ids = position_ids.expand(query.shape[0], -1).tolist()
    rows = []
    # unbind + split, not one slice per example: their backward is a single stack / cat of the pieces' grads,
    # where each slice's backward would zero-fill a whole (batch, heads, seq, dim) gradient and add it up
    # (the same numbers, bit for bit; ~6% of a SmolLM2 LoRA step on CPU went to those fills and adds)
    dropout_p = dropout if module.training else 0.0
    for q_row, k_row, v_row, positions in zip(query.unbind(0), key.unbind(0), value.unbind(0), position_ids):
        spans = segments(positions)
        lengths = [e - s for s, e in spans]
        keys, values = k_row.split(lengths, dim=1), v_row.split(lengths, dim=1)
        pieces, trunk = [], None  # trunk: the last segment that started at position 0
        for n, ((start, _), q) in enumerate(zip(spans, q_row.split(lengths, dim=1))):
            shared = positions[start]  # > 0: a branch continuing the trunk's first `shared` tokens
            trunk = n if shared == 0 else trunk
            k, v, mask = keys[n], values[n], None
            if shared > 0 and trunk is not None and lengths[trunk] >= shared:
                k = torch.cat([keys[trunk][:, :shared], k], dim=1)
                v = torch.cat([values[trunk][:, :shared], v], dim=1)
                # causal, aligned to the last key: query i sees the shared keys and its own first i + 1
                # (is_causal=True would align it to the first key)
                mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(shared)
            pieces.append(torch.nn.functional.scaled_dot_product_attention(
                q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, dropout_p=dropout_p, scale=scaling,
                is_causal=mask is None and q.shape[1] > 1, enable_gqa=gqa))
        rows.append(torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0])
    out = torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]
    return out.transpose(1, 2).contiguous(), None


def varlen_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                attention_mask=None, **kwargs):
    """No mask for packed rows (the attention function reads position_ids); SDPA's mask when padded, and when
    several queries follow a cache (a continued row: SDPA's is_causal would align them to the cache's first key)."""
    from finetune.compat import sdpa_functions

    sdpa_mask = sdpa_functions()[1]
    unpadded = attention_mask is None or (attention_mask.shape[-1] == kv_length and bool(attention_mask.all()))
    if unpadded and q_length == kv_length:
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(NAME, varlen_sdpa_forward)
        AttentionMaskInterface.register(NAME, varlen_mask)
        _registered = True


def supported(config) -> bool:
    """A family whose attention is plain causal softmax(QK^T * scaling) V, with no sliding window, soft-cap, sinks
    or position bias that a per-example call would have to reproduce: its row says so (finetune/model/families.py)."""
    from finetune.model.families import per_example_attention

    return per_example_attention(config)[0]


def use_varlen_attention(causal_lm) -> bool:
    """Switch an SDPA model to per-example attention for packed rows; False when the model is not eligible."""
    if attn_implementation(causal_lm.config) != "sdpa" or not supported(causal_lm.config):
        return False
    _register()
    causal_lm.set_attn_implementation(NAME)
    return attn_implementation(causal_lm.config) == NAME


def restore_sdpa(causal_lm) -> None:
    """Back to stock SDPA, so that what is saved or served afterwards names an implementation everyone has."""
    if attn_implementation(causal_lm.config) == NAME:
        causal_lm.set_attn_implementation("sdpa")
