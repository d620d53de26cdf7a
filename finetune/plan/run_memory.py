"""`finetune plan`'s memory prediction for the run about to start, so run.json shows plan vs real.

Takes what the run resolved (precision, attention, optimizer) rather than the recipe's `auto`s, so the
prediction is for the same setup the run measures. DeepSpeed runs are not predicted here: the ZeRO stage
lives in the DeepSpeed JSON (`finetune plan --zero-stage N` plans them); FSDP2 runs are, from the recipe's `fsdp:`.
A preference run (and a reward model's) is planned with two sequences per pair (recipe_shape below), a GRPO run with
its generation's KV cache and its reward models, as `finetune plan` plans them.
"""

from __future__ import annotations

from finetune.plan.memory import GIB


def planned_memory(recipe, config, precision: str, attn: str, optimizer: str, num_gpus: int) -> dict | None:
    """{"peak_allocated_gib", "total_gib"} as `finetune plan` would print them; None where it cannot plan."""
    from finetune.errors import FinetuneError
    from finetune.plan.budget import PlanInputs, plan_memory
    from finetune.plan.model_size import count_model

    if recipe.deepspeed or recipe.load_in_8bit:  # the planner has no 8-bit base
        return None
    adapter = "qlora" if recipe.load_in_4bit and recipe.adapter != "none" else recipe.adapter
    shape, full, lora = count_model(config, recipe.lora_r, recipe.lora_target_modules, recipe.lora_modules_to_save,
                                    dora=recipe.peft_use_dora, target_parameters=recipe.lora_target_parameters,
                                    reward=recipe.method == "reward")
    inputs = PlanInputs(shape, full, lora, adapter=adapter, precision=precision, optimizer=optimizer,
                        seq_len=recipe.sequence_len, micro_batch_size=recipe.micro_batch_size,
                        gradient_checkpointing=recipe.gradient_checkpointing,
                        attn=attn if attn in ("eager", "sdpa", "flash_attention_2") else "sdpa",
                        num_gpus=num_gpus, lora_dropout=recipe.lora_dropout > 0, **recipe_shape(recipe),
                        **fsdp_shape(recipe))
    try:
        estimate = plan_memory(inputs)
    except (FinetuneError, ValueError):  # an optimizer or adapter the planner has no table for
        return None
    return {"peak_allocated_gib": estimate.peak_allocated / GIB, "total_gib": estimate.total / GIB}


def fsdp_shape(recipe) -> dict:
    """PlanInputs' FSDP2 knobs from the recipe's `fsdp:` ({} without one)."""
    spec = getattr(recipe, "fsdp", None)
    if spec is None:
        return {}
    return {"fsdp": True, "fsdp_reshard_after_forward": spec.reshard_after_forward,
            "fsdp_offload_params": spec.offload_params}


def recipe_shape(recipe) -> dict:
    """PlanInputs' `sequences_per_item` and `packed` for a recipe: a preference pair is read as two sequences
    (chosen and rejected), a KTO example or an SFT example as one; GRPO's completions, and what it generates."""
    from finetune.recipe.methods import PAIRED_METHODS, method_setting

    shape = {"sequences_per_item": 2 if recipe.method in PAIRED_METHODS else 1, "packed": bool(recipe.sample_packing)}
    if recipe.method == "grpo":  # G completions for each of a step's prompts: micro_batch_size x accumulation
        from finetune.plan.model_size import reward_model_loads

        shape["generated_sequences"] = recipe.micro_batch_size * recipe.gradient_accumulation_steps
        shape["completion_tokens"] = method_setting(recipe, "max_completion_length")
        loads = reward_model_loads(recipe)  # loaded beside the policy (plan/grpo.py)
        if loads:
            shape["reward_models"] = loads
    return shape
