"""LoRA+ (`loraplus_lr_ratio`): the B matrices learn at learning_rate x ratio, an optimizer parameter-group change.

The groups are peft's (`peft.optimizers.create_loraplus_optimizer`): A at learning_rate; B, and every 1-D
trainable tensor (DoRA magnitudes, biases), at learning_rate x ratio; LoRA on embedding layers at
`loraplus_lr_embedding`. The optimizer class and its settings (AdamW fused / 8-bit / paged, betas, eps) stay the
Trainer's own (`Trainer.get_optimizer_cls_and_kwargs`), and the Trainer's scheduler scales each group's rate.

It reaches the Trainer as `optimizer_cls_and_kwargs` with a factory (transformers calls a non-Optimizer there
with no arguments, then with the model it optimizes), so the groups are built from the model the Trainer really
optimizes, when it optimizes it (after FSDP wraps it, inside the DeepSpeed engine's setup), by SFT, preference
and GRPO trainers alike. The groups come out in the same order every time (named_parameters order), so a
resumed run's optimizer.pt loads into them as it was saved.
"""

from __future__ import annotations


class LoraPlusOptimizer:
    """The Trainer's optimizer factory: `factory()` returns the builder the Trainer calls with its model."""

    def __init__(self, args, ratio: float, lr_embedding: float | None):
        self.args, self.ratio, self.lr_embedding = args, ratio, lr_embedding

    def __call__(self):
        return self.build

    def build(self, model, **_unused):
        from peft.optimizers import create_loraplus_optimizer
        from transformers import Trainer

        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, model)
        kwargs = dict(kwargs)
        lr = kwargs.pop("lr")
        if self.lr_embedding is not None:
            kwargs["loraplus_lr_embedding"] = self.lr_embedding
        # the recipe's weight_decay on A and B (peft's own default is none); biases and 1-D tensors get none
        return create_loraplus_optimizer(model, optimizer_cls, lr=lr, loraplus_lr_ratio=self.ratio,
                                         loraplus_weight_decay=self.args.weight_decay, **kwargs)


def optimizer_cls_and_kwargs(recipe, args):
    """The Trainer's `optimizer_cls_and_kwargs`: LoRA+'s factory, or None (the Trainer's usual AdamW groups)."""
    if recipe.adapter == "none" or recipe.loraplus_lr_ratio is None:
        return None
    return LoraPlusOptimizer(args, recipe.loraplus_lr_ratio, recipe.loraplus_lr_embedding), {}
