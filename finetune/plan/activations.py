"""Activation memory of a Llama-style decoder in training (pure math).

Bytes per token that autograd keeps for the backward pass, fitted term by term against the tensors
PyTorch actually saves (torch.autograd.graph.saved_tensors_hooks on CPU, transformers 5.x Llama; the
test suite re-measures them). h = hidden, I = intermediate, kv = kv heads x head dim, a = heads,
s = sequence length, V = vocabulary, e = bytes of the compute dtype.

per layer, sdpa / flash attention:
    e x (8h + 4I + 2kv)       norm inputs and outputs, q k v, attention output, MLP gate/up/act/product
    + 4h   (16-bit weights)   RMSNorm upcasts its input to fp32
    + 4a + 8                  attention log-sum-exp (fp32) and the two norms' rsqrt
eager attention: k and v are saved after repeat_kv (2h instead of 2kv), no log-sum-exp, plus the
    a x s probability matrix per token: fp32 softmax (4 B) and in 16-bit also its cast copy (+2 B).
autocast (fp32 weights, bf16 matmuls, the Trainer's full fine-tune): the 16-bit figure + 10h for the
    fp32 residual stream, + a bf16 copy of every weight used (autocast's cast cache) kept until backward.
head: fp32 log-softmax over the vocabulary (4V) + final norm (8-12h); at the start of backward the
    logits' gradient adds another 4V per token (transient).
gradient checkpointing keeps only each layer's input (4h fp32 / 2h bf16 per token) and recomputes one
    layer at a time in backward, so one full layer is live on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.plan.shape import ModelShape

COMPUTE_MODES = ("fp32", "bf16", "fp16", "autocast")
ATTENTION = ("eager", "sdpa", "flash_attention_2")


@dataclass(frozen=True)
class ActivationEstimate:
    saved_bytes: int  # what autograd holds at the end of the forward pass
    transient_bytes: int  # extra live at the start of backward (logit gradients, one recomputed layer)
    autocast_cache_bytes: int  # bf16 weight copies autocast keeps for the backward pass

    @property
    def peak_bytes(self) -> int:
        return self.saved_bytes + self.transient_bytes + self.autocast_cache_bytes


def _layer_bytes_per_token(shape: ModelShape, seq_len: int, compute: str, attn: str) -> float:
    h, inter, a = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads
    e = 4 if compute == "fp32" else 2
    kv_saved = 2 * h if attn == "eager" else 2 * shape.kv_dim
    per_token = e * (8 * h + 4 * inter + kv_saved) + 8
    if compute != "fp32":
        per_token += 4 * h  # RMSNorm's fp32 upcast
    if compute == "autocast":
        per_token += 10 * h  # fp32 residual stream around bf16 matmuls
    if attn == "eager":
        per_token += a * seq_len * (4 if compute == "fp32" else 6)
    else:
        per_token += 4 * a  # log-sum-exp per head
    return per_token


def _head_bytes_per_token(shape: ModelShape, compute: str) -> float:
    h, vocab = shape.hidden_size, shape.head_width
    return 4 * vocab + {"fp32": 12 * h + 64, "autocast": 11 * h + 40}.get(compute, 8 * h + 40)


def checkpointing_mode(value: bool | str) -> str:
    """`off`, `mlp` or `full`, from the recipe's value (older recipes: true/false)."""
    if isinstance(value, bool):
        return "full" if value else "off"
    if value not in ("off", "mlp", "full"):
        raise ValueError(f"gradient_checkpointing must be off, mlp or full, got {value!r}")
    return value


def activation_memory(shape: ModelShape, seq_len: int, micro_batch_size: int, compute: str = "bf16",
                      attn: str = "sdpa", gradient_checkpointing: bool | str = False) -> ActivationEstimate:
    """Activation bytes for one micro batch of `micro_batch_size` sequences of `seq_len` tokens.
    gradient_checkpointing: False/"off", True/"full" (every layer) or "mlp" (only the MLP blocks)."""
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {COMPUTE_MODES}, got {compute!r}")
    if attn not in ATTENTION:
        raise ValueError(f"attn must be one of {ATTENTION}, got {attn!r}")
    tokens = seq_len * micro_batch_size
    layer = _layer_bytes_per_token(shape, seq_len, compute, attn) * tokens
    head = _head_bytes_per_token(shape, compute) * tokens
    transient = 4 * shape.head_width * tokens  # d(loss)/d(logits) in fp32
    mode = checkpointing_mode(gradient_checkpointing)
    if mode == "mlp":  # the MLP's gate/up/act/product (4I) are recomputed; its input is kept
        e = 4 if compute == "fp32" else 2
        mlp = e * 4 * shape.intermediate_size * tokens
        saved = (layer - mlp + e * shape.hidden_size * tokens) * shape.num_layers + head
        transient += mlp
    elif mode == "full":
        kept_per_layer = (2 if compute in ("bf16", "fp16") else 4) * shape.hidden_size * tokens
        saved = kept_per_layer * shape.num_layers + head
        transient += layer  # the one layer being recomputed
    else:
        saved = layer * shape.num_layers + head
    cache = 0
    if compute == "autocast":
        cache = 2 * shape.matmul_params
    return ActivationEstimate(int(saved), int(transient), int(cache))
