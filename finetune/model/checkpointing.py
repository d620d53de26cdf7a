"""Selective activation checkpointing: recompute only the MLP blocks in the backward pass.

The MLP of a decoder layer holds most of its activations (the intermediate is ~3-4x the hidden size, and a
gated MLP keeps three such tensors) yet is cheap to recompute next to attention. Checkpointing just the MLP
saves much of the memory of full checkpointing for a fraction of its recompute cost.

`full` checkpointing is the Trainer's own (`activation_checkpointing`, non-reentrant); see train.py.
Here each MLP *instance* gets a checkpointed forward; no library class is patched, parameter names do not
change, so state dicts and adapters stay loadable by plain transformers / peft.
"""

from __future__ import annotations

from finetune.compat import replace_forward
from finetune.errors import ModelError

# attribute names of a decoder layer's feed-forward block across architectures
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")


class CheckpointedForward:
    """Calls a module's own forward under torch.utils.checkpoint (non-reentrant) while training."""

    def __init__(self, forward):
        self.forward = forward  # the bound forward of the module instance

    def __call__(self, *args, **kwargs):
        import torch
        from torch.utils.checkpoint import checkpoint

        module = self.forward.__self__
        if module.training and torch.is_grad_enabled():
            # non-reentrant: works when the inputs need no grad (frozen base + LoRA) and with kwargs
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        return self.forward(*args, **kwargs)


def mlp_modules(model) -> list[tuple[str, object]]:
    """(qualified name, module) of every decoder layer's MLP block."""
    found = []
    for name, module in model.named_modules():
        for attr in MLP_NAMES:
            child = getattr(module, attr, None)
            if child is not None and child in module.children() and not _inside(name, found):
                found.append((f"{name}.{attr}" if name else attr, child))
    return found


def _inside(name: str, found: list) -> bool:
    return any(name == outer or name.startswith(outer + ".") for outer, _ in found)


def checkpoint_mlps(model) -> int:
    """Give every MLP block a checkpointed forward; returns how many. Idempotent."""
    blocks = mlp_modules(model)
    if not blocks:
        raise ModelError(
            f"`gradient_checkpointing: mlp` found no MLP block (an attribute named one of {', '.join(MLP_NAMES)}) "
            f"in {type(model).__name__}; use `gradient_checkpointing: full` for this model"
        )
    for _, block in blocks:
        if not isinstance(block.forward, CheckpointedForward):
            replace_forward(block, CheckpointedForward(block.forward))
    return len(blocks)
