"""What the LoRA variants do to a learning rate (pure math; `finetune lr` prints it, a run logs it).

The LoRA figure (`finetune lr`: the formula x 10, or a method's LoRA default) is for plain LoRA, whose update is
scaled by alpha / r. With Adam each step moves A and B by about the learning rate whatever the gradient's size,
so the change in the weight per step scales with that factor:
- rsLoRA scales by alpha / sqrt(r), sqrt(r) times plain LoRA's: at one learning rate its steps are sqrt(r)x
  larger; learning_rate / sqrt(r) moves the weights as plain LoRA at learning_rate does.
- LoRA+ gives the B matrices learning_rate x loraplus_lr_ratio (A keeps learning_rate; LoRA on embeddings
  loraplus_lr_embedding). peft's docstring: set learning_rate "slightly smaller (e.g. by a factor of 2) than
  typical vanilla LoRA learning rates" when the ratio is large.
- DoRA and the initialisations (PiSSA, OLoRA, gaussian) keep plain LoRA's learning rate (the DoRA and PiSSA
  papers compare against LoRA at the same learning rate); DoRA's magnitudes train at learning_rate (x ratio
  under LoRA+: peft puts every 1-D tensor with the B matrices).
"""

from __future__ import annotations

import math

PEFT_LORAPLUS_LR_EMBEDDING = 1e-6  # peft.optimizers.create_loraplus_optimizer's default
LABEL_WIDTH = 27  # the table's first column (`finetune lr` prints these lines under its own)


def lora_variant_lines(recipe, learning_rate: float | None) -> list[str]:
    """Lines for the recipe's LoRA variants, given the learning rate it trains with (None: not known yet)."""
    from finetune.plan.lr import format_lr

    if recipe.adapter == "none":
        return []
    lr = (lambda factor: format_lr(learning_rate * factor)) if learning_rate is not None else (lambda _: "-")
    lines = []
    if recipe.peft_use_rslora:
        root = math.sqrt(recipe.lora_r)
        lines.append(f"rsLoRA                     scale alpha/sqrt(r) = {recipe.lora_alpha / root:.3g} instead of "
                     f"alpha/r = {recipe.lora_alpha / recipe.lora_r:.3g}: steps {root:.2f}x plain LoRA's; "
                     f"learning_rate {lr(1 / root)} would move the weights as plain LoRA at {lr(1)}")
    if recipe.loraplus_lr_ratio is not None:
        embedding = recipe.loraplus_lr_embedding or PEFT_LORAPLUS_LR_EMBEDDING
        lines.append(f"LoRA+                      B matrices (and 1-D tensors) at {lr(recipe.loraplus_lr_ratio)} "
                     f"(learning_rate x {recipe.loraplus_lr_ratio:g}), A at {lr(1)}, LoRA on embeddings at "
                     f"{format_lr(embedding)}; with a large ratio, about half the plain-LoRA learning rate (peft)")
    if recipe.peft_use_dora:
        lines.append("DoRA                       keeps the plain-LoRA learning rate (the DoRA paper's comparison); "
                     "the magnitudes train at it too")
    init = recipe.peft_init_lora_weights
    if init == "eva":
        lines.append("eva                        A starts at the principal directions of each layer's inputs, B at "
                     "zero; keeps the plain-LoRA learning rate (the EVA paper's comparison)")
    elif isinstance(init, str) and init != "gaussian":
        lines.append(f"{init:<{LABEL_WIDTH}}the adapters start from the weight's decomposition, not at zero; keeps the "
                     "plain-LoRA learning rate (the PiSSA paper's comparison)")
    return lines


def as_sentence(line: str) -> str:
    """A line of lora_variant_lines' table as one log line: `LABEL: text` (the table's column becomes a colon)."""
    return f"{line[:LABEL_WIDTH].strip()}: {' '.join(line[LABEL_WIDTH:].split())}"
