"""What `finetune plan` prints from a plan: the model and setup lines, the reference or reward-model line, GRPO's
generation KV cache, the per-GPU memory table, and the compute line (model FLOPs per trained token). Pure
formatting of plan/'s numbers; commands/plan.py gathers the inputs.
"""

from __future__ import annotations

from finetune.plan.memory import GIB


def micro_batch_line(knobs: dict) -> str:
    """The setup line's micro batch, in the method's unit."""
    from finetune.recipe.methods import PAIRED_METHODS

    mbs, seq = knobs["micro_batch_size"], knobs["seq_len"]
    if knobs["method"] == "grpo":
        completion = knobs["completion_tokens"]
        return (f"{mbs} completions x {seq} tokens (prompt <= {seq - completion} + completion <= {completion}) per "
                "micro batch")
    if knobs["method"] not in PAIRED_METHODS:
        return f"{mbs} x {seq} tokens per micro batch"
    if knobs["packed"]:
        return f"{mbs} packed row(s) of 2 x {seq} tokens (whole pairs) per micro batch"
    return f"{mbs} pair(s) x 2 sequences x {seq} tokens per micro batch ({2 * mbs} sequences)"


def reference_line(method: str, rl_beta: float = 0.0) -> str | None:
    from finetune.recipe.methods import PREFERENCE_METHODS, REFERENCE_METHODS

    if method == "grpo":
        return ("reference: none (rl_beta 0: no KL term)" if not rl_beta else
                f"reference: the starting model, read with the adapter switched off (rl_beta {rl_beta:g}): no second "
                "copy of the weights, one more no-grad pass per step")
    if method in REFERENCE_METHODS:
        return (f"reference: no reference weights in memory: `method: {method}`'s reference log-probs are computed "
                "once before training (one no-grad pass with the starting model) and cached, so one model is held")
    if method in PREFERENCE_METHODS:
        return f"reference: none (`method: {method}` does not use a reference model)"
    if method == "reward":
        return ("reward model: the score head (hidden -> 1) in place of the LM head, so no logits over the vocabulary; "
                "each pair is two sequences, no reference")
    return None


def generation_line(knobs: dict, shape) -> str:
    """The KV cache of a step's generation, factor by factor (not held with the activations: the peak is the larger)."""
    from finetune.plan.grpo import Generation, kv_cache_arithmetic

    completion = knobs["completion_tokens"]
    generation = Generation(knobs["generated_sequences"], knobs["seq_len"] - completion, completion,
                            4 if knobs["precision"] == "fp32" else 2)
    return (f"generation: KV cache = {kv_cache_arithmetic(shape, generation, knobs['group'])}; held while a step's "
            "completions are generated (no grad), before its forward/backward passes")


def format_plan(estimate, knobs: dict, shape, trainable) -> list[str]:
    method = knobs.get("method", "sft")
    lines = [f"model: {shape.total_params / 1e9:.3f}B parameters ({shape.num_layers} layers, hidden "
             f"{shape.hidden_size}, vocab {shape.vocab_size}); training {trainable.trainable_params:,} "
             f"({100 * trainable.trainable_params / shape.total_params:.2f}%)",
             f"setup: adapter {knobs['adapter']}{' with DoRA' if trainable.dora_output_features else ''}, "
             f"{knobs['precision']}"
             f"{' (' + knobs['precision_from'] + ')' if knobs.get('precision_from') else ''}, {knobs['optimizer']}, "
             f"{micro_batch_line({'method': method, 'packed': False, **knobs})}, checkpointing "
             f"{knobs['gradient_checkpointing']}, attention {knobs['attn']}"
             + (f", method {method}" if method != "sft" else "")]
    reference = reference_line(method, knobs.get("rl_beta", 0.0))
    if reference:
        lines.append(reference)
    if method == "grpo":
        lines.append(generation_line(knobs, shape))
        for load in knobs.get("reward_models") or ():
            lines.append(f"reward model: {load.params / 1e9:.3f}B parameters, held the whole run; scoring "
                         f"{load.tokens:,} tokens a pass (batch_size x max_length), no grad")
    lines.append("per-GPU memory:")
    for name, value in estimate.components.items():
        if value:
            lines.append(f"  {name:<28} {value / GIB:8.2f} GiB")
    lines.append(f"  {'peak allocated':<28} {estimate.peak_allocated / GIB:8.2f} GiB   "
                 "(compare torch.cuda.max_memory_allocated)")
    lines.append(f"  {'+ CUDA context, fragmentation':<28} {estimate.overhead / GIB:8.2f} GiB")
    lines.append(f"  {'total':<28} {estimate.total / GIB:8.2f} GiB")
    return lines


def compute_line(shape, trainable, seq_len: int) -> str:
    """Model FLOPs per trained token (plan/flops.py): a mixture-of-experts token counts its top-k experts only."""
    from finetune.plan.flops import flops_per_token

    flops = flops_per_token(shape, seq_len, trainable.active_adapter_params if trainable is not None else None)
    amount = f"{flops / 1e9:,.3f} GFLOP" if flops >= 1e8 else f"{flops / 1e6:,.3f} MFLOP"
    line = (f"compute: {amount} per trained token at {seq_len} tokens (forward + backward; "
            f"{shape.active_matmul_params:,} weights in its matmuls")
    if shape.expert_params:
        line += (f": of the experts' {shape.expert_params:,} weights the token's top-k use "
                 f"{shape.active_expert_params:,}; memory holds them all")
    return line + "); MFU and tokens/s in the training logs count the same"
