"""Per-GPU training memory, by component (pure math over counts and byte sizes).

Model states, bytes per parameter (Rajbhandari et al. 2020, "ZeRO", section 3.1):

    fp32 AdamW                   4 weights + 4 gradients + 8 Adam (m, v in fp32)         = 16
    mixed precision + fp32 master 2 weights + 2 gradients + 12 (4 master + 4 m + 4 v)    = 16
    HF Trainer autocast (fp32 weights, bf16 matmuls): 4 + 4 + 8                          = 16
    pure bf16 (weights loaded in bf16, no master copy): 2 + 2 + 4 (m, v follow the weights) = 8

The "optimizer states are ~3x the weights" rule (12 vs 4 bytes) already contains the fp32 master copy,
so 7B in fp32 is 28 GB weights + 28 GB gradients + 56 GB Adam = 112 GB, not "28 + 28 + 84 = 140 GB".

ZeRO partitions across N data-parallel GPUs: stage 1 the optimizer states (with the master copy),
stage 2 also the gradients, stage 3 also the weights. 7.5B params, mixed precision, N = 64:
120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from finetune.errors import FinetuneError
from finetune.plan.shape import Trainable

GB = 1e9
GIB = 2**30

# Optimizer state bytes per trainable parameter, given the bytes of the state dtype (see state_dtype_bytes).
# 8-bit: bitsandbytes keeps m and v in uint8 with one fp32 absmax per 256-value block (blockwise quantization).
OPTIMIZER_STATES = {
    "adamw_torch": "2 states",
    "adamw_torch_fused": "2 states",
    "paged_adamw_32bit": "2 states",
    "adamw_bnb_8bit": "8-bit",
    "adamw_8bit": "8-bit",
    "paged_adamw_8bit": "8-bit",
    "sgd": "none",  # HF's `sgd` is torch SGD without momentum: no state
    "adafactor": "factored",
}
BNB_BLOCK = 256
NF4_BLOCK = 64  # QLoRA: one absmax per 64 weights
DOUBLE_QUANT_BLOCK = 256  # ... and those absmaxes quantized to 8 bits in blocks of 256


def optimizer_state_bytes_per_param(optimizer: str, state_dtype_bytes: int, hidden_size: int = 4096) -> float:
    kind = OPTIMIZER_STATES.get(optimizer)
    if kind is None:
        raise FinetuneError(f"unknown optimizer `{optimizer}`; known: {', '.join(OPTIMIZER_STATES)}")
    if kind == "2 states":
        return 2 * state_dtype_bytes
    if kind == "8-bit":
        return 2 * (1 + 4 / BNB_BLOCK)
    if kind == "factored":  # row + column second-moment factors of a ~hidden x hidden matrix, fp32
        return 4 * 2 / hidden_size
    return 0.0


def quantized_bytes_per_param(bits: int, double_quant: bool = True) -> float:
    """Storage of a bitsandbytes-quantized weight, constants included.

    4-bit NF4: 0.5 B + an fp32 absmax per 64 weights (0.0625 B = 0.5 bits); double quantization stores
    those absmaxes in 8 bits plus an fp32 constant per 256 of them: 8/64 + 32/(64 x 256) = 0.127 bits.
    8-bit (LLM.int8): 1 B + an fp32 scale per output row (negligible; counted as 0).
    """
    if bits == 8:
        return 1.0
    if bits != 4:
        raise FinetuneError(f"quantized weights are 4 or 8 bits, got {bits}")
    constants_bits = (8 / NF4_BLOCK + 32 / (NF4_BLOCK * DOUBLE_QUANT_BLOCK)) if double_quant else 32 / NF4_BLOCK
    return 0.5 + constants_bits / 8


@dataclass(frozen=True)
class TrainingSetup:
    """How the weights are held and trained. Byte sizes are per parameter."""

    trainable: Trainable
    frozen_params: int = 0  # frozen weights besides the quantized ones (a LoRA base; 0 for a full fine-tune)
    trainable_bytes: int = 4  # dtype of the trainable weights (and so of their gradients)
    frozen_bytes: float = 2  # dtype of frozen, unquantized weights
    master_weights: bool = False  # an extra fp32 copy kept by a mixed-precision optimizer (DeepSpeed)
    optimizer: str = "adamw_torch"
    quant_bits: int | None = None  # 4 (QLoRA NF4) or 8: how `trainable.quantized_params` are stored
    double_quant: bool = True
    zero_stage: int = 0
    num_gpus: int = 1
    hidden_size: int = 4096  # only for Adafactor's factored states


@dataclass
class MemoryEstimate:
    """Per-GPU bytes by component. `peak_allocated` is comparable to torch.cuda.max_memory_allocated."""

    components: dict[str, float] = field(default_factory=dict)
    overhead: float = 0.0  # CUDA context, kernels, allocator slack: reserved, not allocated

    @property
    def model_states(self) -> float:
        return sum(self.components.get(k, 0.0) for k in ("weights", "gradients", "master weights", "optimizer states",
                                                         "FSDP gathered weights",  # FSDP2: the layers it gathers
                                                         "reward models"))  # GRPO's, loaded the whole run

    @property
    def peak_allocated(self) -> float:
        states = self.model_states
        live = self.components.get("activations", 0.0) + self.components.get("autocast weight cache", 0.0)
        step = self.components.get("optimizer step temporaries", 0.0)
        # GRPO generates (no grad) before a step's forward/backward passes: its KV cache and the activations are
        # never held together (plan/grpo.py)
        generating = self.components.get("generation KV cache", 0.0)
        scoring = self.components.get("reward model scoring", 0.0)  # after generation, before the step's passes
        return states + max(live, step, generating, scoring)

    @property
    def total(self) -> float:
        return self.peak_allocated + self.overhead


def model_state_memory(setup: TrainingSetup) -> dict[str, float]:
    """Bytes per GPU for weights, gradients, master weights and optimizer states, after ZeRO partitioning."""
    if setup.zero_stage not in (0, 1, 2, 3):
        raise FinetuneError(f"ZeRO stage must be 0, 1, 2 or 3, got {setup.zero_stage}")
    if setup.num_gpus < 1:
        raise FinetuneError(f"num_gpus must be at least 1, got {setup.num_gpus}")
    t = setup.trainable
    frozen_plain = setup.frozen_params
    quantized = t.quantized_params * quantized_bytes_per_param(setup.quant_bits, setup.double_quant) \
        if t.quantized_params else 0.0
    weights = t.trainable_params * setup.trainable_bytes + frozen_plain * setup.frozen_bytes + quantized
    gradients = float(t.trainable_params * setup.trainable_bytes)
    master = float(t.trainable_params * 4) if setup.master_weights else 0.0
    state_dtype = 4 if setup.master_weights else setup.trainable_bytes  # torch keeps m, v in the param's dtype
    per_param = optimizer_state_bytes_per_param(setup.optimizer, state_dtype, setup.hidden_size)
    states = t.trainable_params * per_param
    if OPTIMIZER_STATES[setup.optimizer] != "none":
        states += 4 * t.trainable_tensors  # torch keeps a float32 `step` per tensor
    n = setup.num_gpus
    if setup.zero_stage >= 1:
        states, master = states / n, master / n
    if setup.zero_stage >= 2:
        gradients /= n
    if setup.zero_stage >= 3:
        weights /= n
    return {"weights": weights, "gradients": gradients, "master weights": master, "optimizer states": states}


def step_temporaries(setup: TrainingSetup) -> float:
    """torch's foreach AdamW builds sqrt(v) for every parameter at once: one state-sized buffer."""
    if OPTIMIZER_STATES[setup.optimizer] != "2 states" or setup.optimizer == "adamw_torch_fused":
        return 0.0
    state_dtype = 4 if setup.master_weights else setup.trainable_bytes
    shard = setup.num_gpus if setup.zero_stage >= 1 else 1
    return setup.trainable.trainable_params * state_dtype / shard


CUDA_CONTEXT_BYTES = 0.5 * GIB  # CUDA context + cuBLAS/cuDNN workspaces, outside the caching allocator
FRAGMENTATION = 0.05  # allocator slack between what is allocated and what is reserved


def estimate_memory(setup: TrainingSetup, activation_bytes: float = 0.0, autocast_cache_bytes: float = 0.0,
                    cuda_overhead: bool = True, generation_bytes: float = 0.0, reward_model_bytes: float = 0.0,
                    reward_scoring_bytes: float = 0.0) -> MemoryEstimate:
    estimate = MemoryEstimate(components=model_state_memory(setup))
    estimate.components["activations"] = float(activation_bytes)
    estimate.components["autocast weight cache"] = float(autocast_cache_bytes)
    estimate.components["optimizer step temporaries"] = step_temporaries(setup)
    if generation_bytes:
        estimate.components["generation KV cache"] = float(generation_bytes)
    if reward_model_bytes:
        estimate.components["reward models"] = float(reward_model_bytes)
        estimate.components["reward model scoring"] = float(reward_scoring_bytes)
    if cuda_overhead:
        estimate.overhead = CUDA_CONTEXT_BYTES + FRAGMENTATION * estimate.peak_allocated
    return estimate

