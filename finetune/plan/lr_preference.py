"""`learning_rate: auto` for preference methods, reward models and GRPO: a published default per method, with where it
comes from.

The SFT formula (finetune/plan/lr.py) scales a pretraining LR by the supervised tokens of a step; a preference
loss is not next-token prediction on those tokens, and the learning rates that work for it are far lower and
set by practice. So each method gets the peak LR its authors and the reference recipes train with, for a full
fine-tune (of 7-8B models, the size nearly every recipe reports) and for LoRA / QLoRA adapters:

    method   full    LoRA    sources (the figures are the recipes' own)
    dpo      5e-7    5e-6    Zephyr-7B-beta, Tulu 2 and Tulu 3 8B: 5e-7 full; TRL's dpo script and the
                             alignment-handbook's Zephyr QLoRA recipe: 5e-6 with adapters
    ipo      5e-7    5e-6    the alignment-handbook's DPO / IPO / KTO comparison trains all three at 5e-7
    kto      5e-7    5e-6    TRL's KTO guide: keep the LR in 5e-7..5e-6, and at most 1e-6 with beta 0.1
    simpo    5e-7    5e-6    SimPO's authors: grid 3e-7 / 5e-7 / 1e-6 (released models 3e-7 to 1e-6)
    orpo     8e-6    8e-5    TRL's ORPO example: 8e-6 full, 8e-5 with LoRA (ORPO learns the SFT part too)
    grpo     1e-6    1e-5    TRL's GRPOConfig default (1e-6); TRL's "LoRA Without Regret" GRPO runs: 1e-6 full,
                             1e-5 LoRA; axolotl's GRPO quick start and unsloth's Qwen2.5 GRPO notebook: 5e-6 LoRA
    reward   1e-5    1e-4    Llama 2's reward models (1e-5 up to 34B, 5e-6 at 70B), InstructGPT's 6B RM (9e-6);
                             TRL's RewardConfig default (1e-4), which its docs pair with a LoRA adapter

A reward model trains a new head (and the model under it) on a classification loss; its rates sit between SFT's and
the preference methods' (the head starts at random, the decoder should move little). GRPO is not a preference loss
either, but the same holds: its policy-gradient update is not next-token
prediction on counted tokens (the completions are the model's own), and its LR is set by practice.

Larger models want less (Tulu 3: 5e-7 at 8B, 2e-7 at 70B), and every source treats the LR as the first
thing to sweep; these are starting points. The LoRA figures are 10x the full ones, the factor LoRA's optimum
sits above full fine-tuning's ("LoRA Without Regret", finetune/plan/lr_recipe.py), and match the LoRA recipes
above where there is one. Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.plan.lr import format_lr


@dataclass(frozen=True)
class MethodLR:
    """A method's default peak LRs, full fine-tune and adapters, each with its sources."""

    method: str
    full: float
    lora: float
    usual: str  # the range the sources span, in words
    full_source: str
    lora_source: str


# Sources (each checked in the file named):
#   Zephyr: Tunstall et al. 2023, "Zephyr: Direct Distillation of LM Alignment"; huggingface/alignment-handbook
#     recipes/zephyr-7b-beta/dpo/config_full.yaml (learning_rate 5.0e-7) and config_qlora.yaml (5.0e-6, QLoRA r16).
#   Tulu 2: Ivison et al. 2023, "Camels in a Changing Climate"; its DPO recipe is Zephyr-beta's (model card).
#   Tulu 3: Lambert et al. 2024; allenai/open-instruct configs/train_configs/dpo/final_best_8b_dpo_config.yaml
#     (5.0e-7) and final_best_70b_dpo_config.yaml (2.0e-7).
#   TRL's DPO script (trl/scripts/dpo.py usage): 5.0e-7 full, 5.0e-6 with --use_peft.
#   alignment-handbook recipes/pref_align_scan (HF's 2024 DPO / IPO / KTO comparison, "Preference Tuning LLMs
#     with Direct Preference Optimization Methods"): loss_type sigmoid / ipo / kto_pair, all at 5.0e-7.
#   TRL KTOTrainer docs, "Learning rate recommendations": for beta 0.1 the LR "should typically not exceed 1e-6";
#     "we strongly recommend keeping the learning rate between 5e-7 and 5e-6".
#   SimPO: Meng et al. 2024; princeton-nlp/SimPO README: "We recommend grid searching over 3e-7, 5e-7, and 1e-6";
#     released models 3e-7 (Mistral-Base), 5e-7 (Mistral-Instruct), 6e-7 (Llama3-Base), 1e-6 (Llama3-Instruct);
#     "a large learning rate (e.g., 1e-5) can significantly degrade performance".
#   ORPO: Hong et al. 2024; TRL examples/scripts/orpo.py: 8e-6, and 8e-5 with LoRA; the ORPO authors'
#     Mistral-ORPO-beta (xfactlab/orpo scripts/run_mistral_orpo_beta.sh): 5e-6, full fine-tune.
#   GRPO: Shao et al. 2024 (DeepSeekMath). TRL 1.16 trl/trainer/grpo_config.py: `learning_rate` "Defaults to 1e-6
#     instead of 5e-5" (checked in the installed package). TRL docs/source/lora_without_regret.md, the GRPO
#     reproduction on SmolLM3-3B (OpenR1-Math): "we used 1.0e-5 for LoRA and 1.0e-6 for full fine-tuning" (LoRA r 1,
#     alpha 32, all-linear; the page's short Python snippet shows 5e-5, its runs and table 1e-5). With adapters,
#     5e-6: axolotl docs/grpo.qmd quick start (commit 067b021;
#     Qwen2.5-1.5B-Instruct, LoRA r32) and unslothai/notebooks python_scripts/Qwen2.5_(3B)-GRPO.py (QLoRA r64).
#     Not checked here: the DeepSeekMath paper's own policy LR (1e-6 as recalled, not re-read).
#   Reward models: TRL 1.16 trl/trainer/reward_config.py: `learning_rate` "Defaults to 1e-4 instead of 5e-5" (checked in
#     the installed package). Llama 2 (Touvron et al. 2023, section 3.2.2): reward models trained one epoch at a maximum
#     LR of 5e-6 for 70B and 1e-5 for the rest; InstructGPT (Ouyang et al. 2022, appendix C.2): the 6B RM at 9e-6.
#     The two papers' figures are as recalled, not re-read here.
METHOD_LRS: dict[str, MethodLR] = {m.method: m for m in (
    MethodLR("dpo", 5e-7, 5e-6, "5e-7 full (7-8B; 2e-7 at 70B) to 5e-6 with LoRA",
             "Zephyr-7B-beta, Tulu 2 and Tulu 3 8B DPO (5e-7; Tulu 3 70B: 2e-7)",
             "TRL's DPO script with PEFT and the alignment-handbook Zephyr QLoRA recipe (5e-6)"),
    MethodLR("ipo", 5e-7, 5e-6, "as DPO: 5e-7 full to 5e-6 with LoRA",
             "alignment-handbook pref_align_scan: DPO, IPO and KTO all at 5e-7 (HF, 2024)",
             "DPO's LoRA figure, 10x full (no IPO-specific LoRA recipe found)"),
    MethodLR("kto", 5e-7, 5e-6, "5e-7 to 5e-6 (TRL); at most 1e-6 full with rl_beta 0.1",
             "TRL KTO guide (keep 5e-7..5e-6, <= 1e-6 at beta 0.1); pref_align_scan kto_pair at 5e-7",
             "the top of TRL's KTO range, 10x full"),
    MethodLR("simpo", 5e-7, 5e-6, "3e-7 to 1e-6 full, by model (1e-5 degrades it)",
             "SimPO authors' grid 3e-7 / 5e-7 / 1e-6 (Meng et al. 2024, princeton-nlp/SimPO)",
             "10x full, LoRA's usual factor (\"LoRA Without Regret\", 2025)"),
    MethodLR("orpo", 8e-6, 8e-5, "5e-6 to 8e-6 full; 8e-5 with LoRA",
             "TRL's ORPO example (8e-6; the ORPO authors' Mistral-ORPO-beta: 5e-6)",
             "TRL's ORPO example with PEFT (8e-5)"),
    MethodLR("grpo", 1e-6, 1e-5, "1e-6 full; 5e-6 to 1e-5 with LoRA",
             "TRL's GRPOConfig default (TRL 1.16) and its LoRA Without Regret full-FT GRPO run (1e-6)",
             "TRL's LoRA Without Regret GRPO run (1e-5, 10x full); axolotl's and unsloth's GRPO LoRA examples: 5e-6"),
    MethodLR("reward", 1e-5, 1e-4, "5e-6 to 1e-5 full (Llama 2, InstructGPT); 1e-4 with LoRA",
             "Llama 2's reward models (1e-5 to 34B, 5e-6 at 70B; InstructGPT's 6B RM: 9e-6)",
             "TRL's RewardConfig default (TRL 1.16: 1e-4), 10x full"),
)}


@dataclass(frozen=True)
class PreferenceLrPlan:
    """The LR `learning_rate: auto` trains a preference method with, and why (run.json records it)."""

    method: str
    setup: str  # "full fine-tune" or "LoRA / QLoRA adapters"
    learning_rate: float
    usual: str
    source: str
    other_setup: str  # the other setup's figure, for reference

    def describe(self) -> str:
        return "\n".join([
            f"method                     {self.method} ({self.setup})",
            f"method default             {format_lr(self.learning_rate)}   ({self.source})",
            f"usual range                {self.usual}",
            f"{'':27}{self.other_setup}",
            "the SFT formula (lr_base x sqrt(tokens per step / pretraining batch)) is not used for preference methods "
            "or GRPO",
        ])


def uses_adapter(recipe) -> bool:
    return recipe.adapter != "none" or recipe.load_in_4bit or recipe.load_in_8bit


def preference_lr_plan(recipe) -> PreferenceLrPlan:
    """The method's default for the recipe's setup (full fine-tune, or LoRA / QLoRA adapters)."""
    row = METHOD_LRS[recipe.method]
    if uses_adapter(recipe):
        return PreferenceLrPlan(row.method, "LoRA / QLoRA adapters", row.lora, row.usual, row.lora_source,
                                f"(full fine-tune: {format_lr(row.full)}, {row.full_source})")
    return PreferenceLrPlan(row.method, "full fine-tune", row.full, row.usual, row.full_source,
                            f"(LoRA / QLoRA adapters: {format_lr(row.lora)}, {row.lora_source})")
