"""A whole memory plan from high-level knobs, the fits / doesn't verdict and concrete suggestions.

The knobs map to how finetune builds the model (finetune/model): a full fine-tune loads fp32 weights and
lets autocast run bf16 matmuls (DeepSpeed instead keeps 16-bit weights and an fp32 master copy); LoRA
holds the frozen base in the compute dtype and the adapters in fp32; QLoRA stores the block Linear
weights in 4-bit NF4 with double quantization and peft's prepare_model_for_kbit_training upcasts the
remaining frozen weights (embeddings, norms, lm_head) to fp32.

Preference methods read each pair as two sequences (chosen and rejected, one forward pass over both): a micro
batch of B pairs is 2B sequences of up to seq_len tokens unpacked, or B packed rows of 2 x seq_len tokens
(finetune/data/preference/rows.py); a KTO example is one sequence, as in SFT. No reference model is held: the
reference log-probs are computed once before training and cached (finetune/train/preference/reference.py).

GRPO scores micro_batch_size completions of up to seq_len tokens (prompt + completion) per micro batch, as SFT does
its examples, and before each step generates the step's completions, whose KV cache is its own line
(finetune/plan/grpo.py).

FSDP2 (`fsdp:`) shards weights, gradients and optimizer states over the GPUs as ZeRO-3 does, in the dtype the
model was built in (no extra master copy: a full fine-tune's fp32 weights are the master), and gathers each
decoder layer's weights in the compute dtype for its pass: two layers at a time (the one computing and the one
prefetched) plus the root unit (embeddings, final norm, lm_head), or every layer at the peak when
reshard_after_forward is false. offload_params moves the shards, their gradients and the optimizer to CPU RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from finetune.plan.activations import activation_memory, checkpointing_mode
from finetune.plan.grpo import Generation, kv_cache_bytes
from finetune.plan.memory import CUDA_CONTEXT_BYTES, FRAGMENTATION, GIB, MemoryEstimate, TrainingSetup, estimate_memory
from finetune.plan.shape import ModelShape, Trainable
from finetune.plan.vision import VisionShape, activation_bytes


@dataclass(frozen=True)
class PlanInputs:
    shape: ModelShape
    full: Trainable  # counts for a full fine-tune
    lora: Trainable | None  # counts for LoRA at the chosen rank and targets (None: unknown)
    adapter: str = "none"  # none | lora | qlora
    precision: str = "bf16"  # fp32 | bf16 | fp16
    optimizer: str = "adamw_torch"
    seq_len: int = 2048
    micro_batch_size: int = 1
    gradient_checkpointing: str = "off"  # off | mlp | full (true/false accepted)
    attn: str = "sdpa"
    zero_stage: int = 0
    num_gpus: int = 1
    lora_dropout: bool = True
    sequences_per_item: int = 1  # sequences a micro-batch item is read as: 2 for a preference pair, else 1
    packed: bool = False  # sample_packing: an item's sequences share one row (what eager attention sees)
    # GRPO: completions a process generates at once (G x its prompts of a step = micro_batch_size x accumulation),
    # each of up to seq_len tokens, the last completion_tokens of them generated; 0: nothing is generated
    generated_sequences: int = 0
    completion_tokens: int = 0
    # GRPO's reward models (plan/grpo.py): loaded beside the policy for the whole run, scoring after generation
    reward_models: tuple = ()
    fsdp: bool = False  # FSDP2 shards over num_gpus (the recipe's `fsdp:`); its two knobs below
    fsdp_reshard_after_forward: bool = True
    fsdp_offload_params: bool = False
    vision: VisionShape | None = None  # a vision-language model's vision side: one image a sequence (plan/vision.py)

    def generation(self) -> Generation | None:
        """What a GRPO step generates, in the compute dtype (bf16 / fp16, autocast's too: 2 bytes; fp32: 4)."""
        if not self.generated_sequences:
            return None
        return Generation(self.generated_sequences, self.seq_len - self.completion_tokens, self.completion_tokens,
                          4 if self.precision == "fp32" else 2)

    def micro_batch_rows(self) -> tuple[int, int]:
        """(rows, tokens per row) of one micro batch at its longest. A pair (2 sequences) is 2 rows of seq_len
        unpacked, and a packed row holds 2 x seq_len tokens; either way 2 x seq_len tokens per pair."""
        if self.packed:
            return self.micro_batch_size, self.seq_len * self.sequences_per_item
        return self.micro_batch_size * self.sequences_per_item, self.seq_len

    @property
    def trainable(self) -> Trainable:
        if self.adapter == "none":
            return self.full
        if self.lora is None:
            raise ValueError("LoRA parameter counts are needed for adapter plans")
        if self.adapter == "qlora":
            return replace(self.lora, quantized_params=self.shape.quantizable_params)
        return self.lora


def training_setup(inputs: PlanInputs) -> TrainingSetup:
    half = inputs.precision in ("bf16", "fp16")
    deepspeed = inputs.zero_stage > 0
    trainable = inputs.trainable
    # peft adds adapters beside the base (modules_to_save as copies), so the whole base stays, frozen; a full
    # fine-tune's frozen weights are a vision-language model's frozen parts (its tower), held as the rest are
    frozen = inputs.shape.total_params - (trainable.quantized_params if inputs.adapter != "none"
                                          else trainable.trainable_params)
    common = dict(trainable=trainable, frozen_params=frozen, optimizer=inputs.optimizer,
                  zero_stage=3 if inputs.fsdp else inputs.zero_stage,  # FSDP2 shards what ZeRO-3 shards
                  num_gpus=inputs.num_gpus, hidden_size=inputs.shape.hidden_size)
    if inputs.adapter == "none":
        if deepspeed and half:  # DeepSpeed: 16-bit weights and gradients, fp32 master + states
            return TrainingSetup(trainable_bytes=2, frozen_bytes=2, master_weights=True, **common)
        return TrainingSetup(trainable_bytes=4, frozen_bytes=4, **common)  # fp32 weights; autocast does the 16-bit math
    if inputs.adapter == "qlora":
        return TrainingSetup(trainable_bytes=4, frozen_bytes=4, quant_bits=4, double_quant=True, **common)
    return TrainingSetup(trainable_bytes=4, frozen_bytes=2 if half else 4, **common)


def compute_mode(inputs: PlanInputs) -> str:
    if inputs.precision == "fp32":
        return "fp32"
    if inputs.adapter == "lora" or (inputs.adapter == "none" and (inputs.zero_stage > 0 or inputs.fsdp)):
        return "bf16"  # weights held (FSDP2: gathered) in 16 bits
    return "autocast"  # fp32 weights (full) or fp32 residual stream around 4-bit matmuls (QLoRA)


def plan_memory(inputs: PlanInputs) -> MemoryEstimate:
    setup = training_setup(inputs)
    mode = compute_mode(inputs)
    rows, row_tokens = inputs.micro_batch_rows()
    acts = activation_memory(inputs.shape, row_tokens, rows, compute=mode,
                             attn=inputs.attn, gradient_checkpointing=inputs.gradient_checkpointing)
    extra = 0
    trainable = inputs.trainable
    if inputs.adapter != "none" and trainable.adapter_input_features:
        # each adapted Linear saves its (dropped-out) input, and the bool mask when dropout > 0
        e = 4 if mode == "fp32" else 2
        per_token = trainable.adapter_input_features * (e + (1 if inputs.lora_dropout else 0))
        # DoRA (peft's DoraLinearLayer): the base output and the scaled LoRA output of each adapted layer are saved
        # for the magnitude's gradient, two (tokens x out_features) tensors
        per_token += 2 * trainable.dora_output_features * e
        extra = per_token * row_tokens * rows
        if checkpointing_mode(inputs.gradient_checkpointing) == "full":
            extra //= inputs.shape.num_layers  # only the recomputed layer holds them
        # and, one layer at a time, B@A (through an in x in identity) and W + s*B@A for the column norms
        extra += 3 * trainable.dora_weight_elements * e
    if inputs.adapter != "none" and trainable.rebuilt_weight_elements:
        # adapters on fused experts (peft's ParamWrapper): each forward rebuilds the adapted expert weights, W + s*B@A,
        # and the expert matmuls keep them for the backward pass: up to every MoE layer's (one, recomputed, under
        # full checkpointing). Measured: 65% of this bound held on a 2-layer qwen3_moe (gate_up kept, most of down)
        e = 4 if mode == "fp32" else 2
        rebuilt = trainable.rebuilt_weight_elements * e
        full = checkpointing_mode(inputs.gradient_checkpointing) == "full"
        extra += rebuilt // inputs.shape.num_layers if full else rebuilt
    if inputs.vision is not None:  # the tower's and projector's saved tensors, one image a sequence
        extra += activation_bytes(inputs.vision, rows, 4 if mode == "fp32" else 2)
    # QLoRA's 4-bit matmuls bypass autocast, so no bf16 weight cache; LoRA's frozen base is already 16-bit.
    cache = acts.autocast_cache_bytes if inputs.adapter == "none" else 0
    generation = inputs.generation()
    kv_cache = kv_cache_bytes(inputs.shape, generation) if generation else 0
    estimate = estimate_memory(setup, acts.saved_bytes + acts.transient_bytes + extra, cache, generation_bytes=kv_cache,
                               **_reward_models(inputs))
    return _fsdp(estimate, inputs) if inputs.fsdp else estimate


def _reward_models(inputs: PlanInputs) -> dict:
    """estimate_memory's reward-model terms: their weights, and the largest scoring pass."""
    if not inputs.reward_models:
        return {}
    e = 4 if inputs.precision == "fp32" else 2
    return {"reward_model_bytes": sum(m.weights_bytes(e) for m in inputs.reward_models),
            "reward_scoring_bytes": max(m.scoring_bytes(e) for m in inputs.reward_models)}


def fsdp_gathered_bytes(inputs: PlanInputs) -> float:
    """The weights FSDP2 holds unsharded at its peak, in the compute dtype (2 bytes, fp32: 4): each decoder layer
    is one unit (its Linear weights: quantizable_params / num_layers), the root unit (embeddings, norms, lm_head:
    the rest) stays gathered through forward and backward."""
    shape = inputs.shape
    e = 4 if inputs.precision == "fp32" else 2
    per_layer = shape.quantizable_params / shape.num_layers
    root = shape.total_params - shape.quantizable_params
    layers = shape.num_layers if not inputs.fsdp_reshard_after_forward else min(2, shape.num_layers)
    return (root + layers * per_layer) * e


def _fsdp(estimate: MemoryEstimate, inputs: PlanInputs) -> MemoryEstimate:
    planned = MemoryEstimate(components=dict(estimate.components))
    if inputs.fsdp_offload_params:  # the shards, their gradients and the optimizer step live in CPU RAM
        for name in ("weights", "gradients", "master weights", "optimizer states", "optimizer step temporaries"):
            planned.components[name] = 0.0
    planned.components["FSDP gathered weights"] = fsdp_gathered_bytes(inputs)
    planned.overhead = CUDA_CONTEXT_BYTES + FRAGMENTATION * planned.peak_allocated
    return planned


@dataclass(frozen=True)
class Verdict:
    fits: bool
    estimate: MemoryEstimate
    budget_bytes: float
    suggestions: list[str]

    def headline(self) -> str:
        need, have = self.estimate.total / GIB, self.budget_bytes / GIB
        word = "FITS" if self.fits else "DOES NOT FIT"
        return f"{word}: about {need:.1f} GiB needed per GPU of {have:.1f} GiB ({100 * need / have:.0f}%)"


def _candidates(inputs: PlanInputs) -> list[tuple[str, PlanInputs]]:
    """One change at a time, cheapest (least disruptive) first."""
    out = []
    if inputs.micro_batch_size > 1:
        mbs = max(1, inputs.micro_batch_size // 2)
        out.append((f"micro_batch_size: {mbs} and twice the gradient_accumulation_steps (same global batch)",
                    replace(inputs, micro_batch_size=mbs)))
    if checkpointing_mode(inputs.gradient_checkpointing) != "full":
        out.append(("gradient_checkpointing: full (~30% more compute)", replace(inputs, gradient_checkpointing="full")))
    if inputs.attn == "eager":
        out.append(("attn_implementation: sdpa (no s x s attention matrix kept)", replace(inputs, attn="sdpa")))
    if inputs.optimizer in ("adamw_torch", "adamw_torch_fused", "paged_adamw_32bit"):
        out.append(("optimizer: adamw_8bit (bitsandbytes; 2 bytes of state per parameter instead of 8)",
                    replace(inputs, optimizer="adamw_8bit")))
    if inputs.fsdp and not inputs.fsdp_offload_params:
        out.append(("fsdp: {offload_params: true} (shards, gradients and optimizer in CPU RAM; slower)",
                    replace(inputs, fsdp_offload_params=True)))
    top = 2 if inputs.generated_sequences else 3  # GRPO is refused under ZeRO-3 (recipe/grpo.py)
    if inputs.num_gpus > 1 and inputs.zero_stage < top and not inputs.fsdp:
        stage = inputs.zero_stage + 1 if inputs.adapter == "none" else top
        out.append((f"DeepSpeed ZeRO stage {stage} across the {inputs.num_gpus} GPUs", replace(inputs, zero_stage=stage)))
    if inputs.adapter == "none" and inputs.lora is not None:
        out.append(("adapter: lora (train low-rank adapters, base frozen in 16-bit)", replace(inputs, adapter="lora")))
    if inputs.adapter != "qlora" and inputs.lora is not None:
        out.append(("adapter: qlora (4-bit NF4 base, double quantization)", replace(inputs, adapter="qlora")))
    if inputs.seq_len > 512 and inputs.seq_len // 2 > inputs.completion_tokens:  # GRPO: room left for the prompt
        out.append((f"sequence_len: {inputs.seq_len // 2} (if your examples allow it)",
                    replace(inputs, seq_len=inputs.seq_len // 2)))
    return out


def verdict(inputs: PlanInputs, budget_bytes: float) -> Verdict:
    estimate = plan_memory(inputs)
    fits = estimate.total <= budget_bytes
    suggestions: list[str] = []
    if not fits:
        for text, changed in _candidates(inputs):
            need = plan_memory(changed).total
            mark = "fits" if need <= budget_bytes else "still too big"
            suggestions.append(f"{text}: ~{need / GIB:.1f} GiB ({mark})")
        if not any(s.endswith("(fits)") for s in suggestions):
            suggestions.append(_combined(inputs, budget_bytes))
        if (inputs.num_gpus > 1 or inputs.zero_stage > 0) and not inputs.fsdp:
            suggestions.append("ZeRO-Offload (offload_optimizer: cpu) moves optimizer states to CPU RAM")
    return Verdict(fits, estimate, budget_bytes, suggestions)


def _combined(inputs: PlanInputs, budget_bytes: float) -> str:
    """Apply the changes one after another until the plan fits (or they run out)."""
    applied, current = [], inputs
    while True:
        options = [(text, changed) for text, changed in _candidates(current) if not text.startswith("adapter: lora")]
        if not options:
            break
        text, current = options[0]
        applied.append(text.split(" (")[0])  # the change, without its reason in brackets
        need = plan_memory(current).total
        if need <= budget_bytes:
            return f"together: {'; '.join(applied)}: ~{need / GIB:.1f} GiB (fits)"
    return f"even with all of these (~{plan_memory(current).total / GIB:.1f} GiB) it does not fit: use more or bigger GPUs"
