"""Model FLOPs per trained token and model FLOP utilisation (pure math).

Per token, a matmul weight costs 2 FLOPs forward, 2 for the input gradient and 2 for its own gradient:
6 x params for trained weights (Kaplan et al. 2020; Chinchilla's 6ND), but only 4 x params for frozen
ones, which need no weight gradient (LoRA/QLoRA bases). The input embedding is a lookup, not a matmul.
Attention scores add 12 x layers x hidden x seq_len per token (QK^T and AV: 2 x 2 x s x h forward, x3
with backward; PaLM, Chowdhery et al. 2022, appendix B). Recomputation under gradient checkpointing is
not counted (that would be hardware FLOPs): MFU measures useful work.

Mixture-of-experts: a token goes through its top-k routed experts only, so the weights counted are the ACTIVE ones
(shape.active_matmul_params: all but the experts the token skips; plan/moe.py), and `lora_params` are the adapters
the token uses (Trainable.active_adapter_params). Norms and biases are not matmuls and are not counted.

    MFU = achieved model FLOP/s / (peak FLOP/s per GPU x GPUs)
"""

from __future__ import annotations

from finetune.plan.shape import ModelShape


def attention_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    return 12.0 * shape.num_layers * shape.hidden_size * seq_len


def _weights(shape: ModelShape, lora_params: int | None) -> float:
    active = shape.active_matmul_params
    return 6.0 * active if lora_params is None else 4.0 * active + 6.0 * lora_params


def flops_per_token(shape: ModelShape, seq_len: int, lora_params: int | None = None) -> float:
    """Training FLOPs (forward + backward) per token: a full fine-tune when `lora_params` is None,
    else a frozen base (4 x its active matmul params) plus trained adapters (6 x lora_params)."""
    return _weights(shape, lora_params) + attention_flops_per_token(shape, seq_len)


def forward_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """The forward pass alone, per token: 2 FLOPs per active weight, attention's QK^T and AV (4 x layers x hidden
    x seq_len). What torch.utils.flop_counter counts for one token's forward (tests/test_moe.py)."""
    return 2.0 * shape.active_matmul_params + attention_flops_per_token(shape, seq_len) / 3


def mfu(achieved_flops_per_s: float, peak_flops_per_device: float, num_devices: int = 1) -> float:
    """Model FLOP utilisation as a fraction (0.45 = 45%)."""
    return achieved_flops_per_s / (peak_flops_per_device * num_devices)


def attention_flops(shape: ModelShape, segment_lengths_squared: int) -> float:
    """Attention FLOPs (forward + backward) for a batch, from the sum over its examples of length squared.

    A packed row of examples a, b, c attends only within each example: a^2 + b^2 + c^2 score pairs, not
    (a + b + c)^2. One 4096-token row of 20 examples of ~200 tokens does 20 x 200^2 = 0.8M pairs instead of
    16.8M: counting the whole row would overstate this term 20x. Per example of length s this equals
    attention_flops_per_token(shape, s) x s tokens.
    """
    return 12.0 * shape.num_layers * shape.hidden_size * segment_lengths_squared


def training_flops(shape: ModelShape, tokens: int, segment_lengths_squared: int,
                   lora_params: int | None = None) -> float:
    """Model FLOPs to train on `tokens` real tokens made of examples whose squared lengths sum as given
    (padding excluded: it is not useful work, and MFU counts useful work)."""
    return _weights(shape, lora_params) * tokens + attention_flops(shape, segment_lengths_squared)
