"""The fine-tuning learning rate from the pretraining one, scaled by batch size (pure math).

    lr = base_lr x sqrt(supervised_tokens_per_step / pretrained_batch_tokens)
    supervised_tokens_per_step = total supervised tokens / (total optimizer steps / epochs)

Square-root scaling keeps the update noise comparable when the batch is smaller than in pretraining
(Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms": Adam's LR scales
with the square root of the batch size). Only supervised tokens (labels != -100) carry gradient, so
they, not padded or prompt tokens, measure the batch.

Worked example (Mistral-style base LR 5e-5, 4M-token pretraining batch): 2,000,000 supervised tokens over
350 steps in 1 epoch = 5,714 tokens per step; 5e-5 x sqrt(5,714 / 4,000,000) = 1.89e-6.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from finetune.errors import FinetuneError


@dataclass(frozen=True)
class FamilyLR:
    """A pretraining run's peak learning rate and global batch (in tokens), with where the figures come from."""

    name: str
    base_lr: float
    pretrained_batch_tokens: int
    source: str
    patterns: tuple[str, ...]  # regexes matched against the lower-cased model id / path


# Each row: published peak LR and global batch size of the pretraining run. Sizes matter: within a family
# the LR falls as the model grows. Longest/most specific patterns first.
FAMILIES: tuple[FamilyLR, ...] = (
    FamilyLR("llama-2-7b", 3.0e-4, 4_000_000, "Touvron et al. 2023, Llama 2, Table 1 (7B/13B: 3.0e-4; 4M tokens)",
             (r"llama-?2.*\b7b", r"llama-?2.*\b13b")),
    FamilyLR("llama-2-70b", 1.5e-4, 4_000_000, "Touvron et al. 2023, Llama 2, Table 1 (34B/70B: 1.5e-4; 4M tokens)",
             (r"llama-?2.*\b(34|70)b",)),
    FamilyLR("llama-1-7b", 3.0e-4, 4_000_000, "Touvron et al. 2023, LLaMA, Table 2 (6.7B/13B: 3.0e-4; 4M tokens)",
             (r"llama-?7b", r"llama-?13b")),
    FamilyLR("llama-1-65b", 1.5e-4, 4_000_000, "Touvron et al. 2023, LLaMA, Table 2 (32.5B/65.2B: 1.5e-4; 4M tokens)",
             (r"llama-?(30|33|65)b",)),
    FamilyLR("tinyllama-1.1b", 4.0e-4, 2_000_000,
             "Zhang et al. 2024, TinyLlama, section 2.3 (max LR 4.0e-4; batch 2M tokens)", (r"tinyllama",)),
    FamilyLR("olmo-1b", 4.0e-4, 4_000_000, "Groeneveld et al. 2024, OLMo, Table 1 (1B: 4.0e-4; ~4M tokens)",
             (r"olmo.*\b1b",)),
    FamilyLR("olmo-7b", 3.0e-4, 4_000_000, "Groeneveld et al. 2024, OLMo, Table 1 (7B: 3.0e-4; ~4M tokens)",
             (r"olmo.*\b7b",)),
    FamilyLR("pythia-160m", 6.0e-4, 2_097_152,
             "Biderman et al. 2023, Pythia, Table 1 (160M: 6.0e-4; 1024 x 2048 = 2,097,152 tokens)", (r"pythia-?160m",)),
    FamilyLR("pythia-410m", 3.0e-4, 2_097_152, "Biderman et al. 2023, Pythia, Table 1 (410M/1B: 3.0e-4; 2M tokens)",
             (r"pythia-?(410m|1b)\b",)),
    FamilyLR("pythia-1.4b", 2.0e-4, 2_097_152, "Biderman et al. 2023, Pythia, Table 1 (1.4B: 2.0e-4; 2M tokens)",
             (r"pythia-?1\.4b",)),
    FamilyLR("pythia-6.9b", 1.2e-4, 2_097_152, "Biderman et al. 2023, Pythia, Table 1 (6.9B/12B: 1.2e-4; 2M tokens)",
             (r"pythia-?(6\.9|12)b",)),
    FamilyLR("gpt3-125m", 6.0e-4, 500_000, "Brown et al. 2020, GPT-3, Table 2.1 (Small 125M: 6.0e-4; 0.5M tokens)",
             (r"gpt-?3.*125m",)),
    FamilyLR("gpt3-1.3b", 2.0e-4, 1_000_000, "Brown et al. 2020, GPT-3, Table 2.1 (XL 1.3B: 2.0e-4; 1M tokens)",
             (r"gpt-?3.*1\.3b",)),
    FamilyLR("gpt3-6.7b", 1.2e-4, 2_000_000, "Brown et al. 2020, GPT-3, Table 2.1 (6.7B: 1.2e-4; 2M tokens)",
             (r"gpt-?3.*6\.7b",)),
    FamilyLR("smollm2-1.7b", 5.0e-4, 2_097_152,
             "Allal et al. 2025, SmolLM2: pretraining config huggingface/smollm text/pretraining/smollm2/"
             "config_smollm2_1B.yaml (5.0e-4; 256 x 4 x 2048 = 2M tokens)", (r"smollm2.*1\.7b",)),
    FamilyLR("smollm2-360m", 3.0e-3, 1_572_864,
             "Allal et al. 2025, SmolLM2: pretraining config huggingface/smollm text/pretraining/smollm2/"
             "config_smollm2_360M.yaml (3.0e-3; 128 x 6 x 2048 = 1.6M tokens)", (r"smollm2.*360m",)),
    FamilyLR("smollm2-135m", 3.0e-3, 1_048_576,
             "Allal et al. 2025, SmolLM2: pretraining config huggingface/smollm text/pretraining/smollm2/"
             "config_smollm2_135M.yaml (3.0e-3; 64 x 8 x 2048 = 1M tokens)", (r"smollm2.*135m",)),
    FamilyLR("mistral-7b", 5.0e-5, 4_000_000,
             "Not published by Mistral AI: the convention used in finetune's worked example (5e-5, 4M tokens); "
             "set lr_base / lr_pretrained_batch_tokens if you know better", (r"mistral",)),
)


def family_by_name(name: str) -> FamilyLR:
    for family in FAMILIES:
        if family.name == name:
            return family
    names = ", ".join(f.name for f in FAMILIES)
    raise FinetuneError(f"unknown model family `{name}`; known families: {names}")


def find_family(model_id: str) -> FamilyLR | None:
    """The table row whose pattern matches a model id or path (e.g. `meta-llama/Llama-2-7b-hf`), or None."""
    text = model_id.lower()
    for family in FAMILIES:
        if any(re.search(p, text) for p in family.patterns):
            return family
    return None


def supervised_tokens_per_step(supervised_tokens: int, total_steps: int, num_epochs: float) -> float:
    """Supervised tokens one optimizer step sees: total supervised tokens / steps per epoch."""
    if supervised_tokens <= 0:
        raise FinetuneError(f"supervised token count must be positive, got {supervised_tokens}: "
                            "are all labels masked? (train_on_inputs, chat roles)")
    if total_steps <= 0 or num_epochs <= 0:
        raise FinetuneError(f"steps ({total_steps}) and epochs ({num_epochs}) must be positive")
    return supervised_tokens / (total_steps / num_epochs)


def scaled_learning_rate(base_lr: float, tokens_per_step: float, pretrained_batch_tokens: float) -> float:
    """base_lr x sqrt(tokens_per_step / pretrained_batch_tokens)."""
    if base_lr <= 0 or pretrained_batch_tokens <= 0 or tokens_per_step <= 0:
        raise FinetuneError(
            f"base LR ({base_lr}), tokens per step ({tokens_per_step}) and pretraining batch tokens "
            f"({pretrained_batch_tokens}) must all be positive"
        )
    return base_lr * math.sqrt(tokens_per_step / pretrained_batch_tokens)


@dataclass(frozen=True)
class LrPlan:
    supervised_tokens: int
    total_steps: int
    num_epochs: float
    tokens_per_step: float
    base_lr: float
    pretrained_batch_tokens: int
    learning_rate: float
    source: str

    def describe(self) -> str:
        return "\n".join([
            f"supervised tokens          {self.supervised_tokens:,}",
            f"optimizer steps            {self.total_steps:,} over {self.num_epochs:g} epoch(s)",
            f"supervised tokens / step   {self.tokens_per_step:,.0f}",
            f"base LR                    {self.base_lr:.3g}",
            f"pretraining batch tokens   {self.pretrained_batch_tokens:,}",
            f"source                     {self.source}",
            f"learning rate              {format_lr(self.learning_rate)}"
            f"   (= {self.base_lr:.3g} x sqrt({self.tokens_per_step:,.0f} / {self.pretrained_batch_tokens:,}))",
        ])


def plan_learning_rate(supervised_tokens: int, total_steps: int, num_epochs: float, base_lr: float,
                       pretrained_batch_tokens: int, source: str = "given") -> LrPlan:
    per_step = supervised_tokens_per_step(supervised_tokens, total_steps, num_epochs)
    lr = scaled_learning_rate(base_lr, per_step, pretrained_batch_tokens)
    return LrPlan(supervised_tokens, total_steps, num_epochs, per_step, base_lr, pretrained_batch_tokens, lr, source)


def format_lr(lr: float) -> str:
    """Three significant figures, scientific: 1.89e-06 -> '1.89e-6'."""
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"
