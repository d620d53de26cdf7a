"""LoRA dropout on CPU that keeps its mask in a byte per element, not a float: the same numbers, a quarter of the memory.

peft gives every LoRA layer its own `nn.Dropout` (q, k, v, o, gate, up, down: seven a decoder layer). On CUDA,
PyTorch's dropout is a fused kernel that saves a bool mask for the backward pass; on CPU it draws a float32 noise
tensor (`bernoulli_`, then `div_(1 - p)`), multiplies, and autograd keeps that noise: 4 bytes per element of every
LoRA layer's input, ~20 KB per token and decoder layer of SmolLM2-135M, 1.7 GB of a 2,900-token DPO micro batch
(docs/performance.md, "DPO peak memory"). `MaskDropout` draws the same noise the same way (the same random numbers,
the same output bit for bit), keeps `noise != 0` as bool, and multiplies the gradient by the mask and the same
float32 scale: the same gradient bit for bit. `torch.native_dropout` also keeps a bool mask, but its CPU
`bernoulli_` on bool runs ~2.4x slower than the float one.
"""

from __future__ import annotations

import torch


class _MaskDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p: float):
        noise = torch.empty_like(x).bernoulli_(1 - p)  # what ATen's CPU dropout draws (aten/src/ATen/native/Dropout.cpp)
        noise.div_(1 - p)
        ctx.save_for_backward(noise != 0)
        ctx.scale = noise.new_ones(()).div_(1 - p)  # the same float32 rounding of 1 / (1 - p) as the noise
        return x * noise

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None


class MaskDropout(torch.nn.Dropout):
    """`nn.Dropout(p)` for training on CPU, its backward mask kept as bool. A subclass, so that whatever recognises a
    dropout module (finetune's step-1 note on dropout, peft, TRL's `disable_dropout`) still does."""

    def forward(self, x):
        if not self.training or self.p == 0 or x.numel() == 0:
            return x
        if self.p == 1:  # as ATen does: no 1 / 0 scale
            return x * x.new_zeros(())
        return _MaskDropoutFn.apply(x, self.p)


def use_mask_dropout(model) -> int:
    """Swap every LoRA layer's `nn.Dropout` for MaskDropout (CPU training); returns how many were swapped."""
    from finetune.compat import replace_lora_dropout

    return replace_lora_dropout(model, lambda dropout: MaskDropout(dropout.p))
