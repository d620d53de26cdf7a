"""The numbers about a model that planning needs (pure data; filled from a config by plan/model_size.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, by its sizes and parameter counts."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    total_params: int
    embedding_params: int  # the input embedding (a lookup, not a matmul)
    quantizable_params: int  # weights of the Linear layers inside the blocks (what bitsandbytes quantizes)
    tied_embeddings: bool = False
    # mixture-of-experts (plan/moe.py): the routed experts' weights, and the share of them one token uses (top-k)
    expert_params: int = 0
    active_expert_params: int = 0
    non_matmul_params: int = 0  # norms, biases, attention sinks: no matmul (model_size.py fills it; 0: not counted)
    head_outputs: int | None = None  # the output layer's width per token: None, a causal LM's vocabulary; 1, a reward
    #                                  model's score head (`method: reward`)

    @property
    def head_width(self) -> int:
        return self.vocab_size if self.head_outputs is None else self.head_outputs

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * (self.hidden_size // self.num_attention_heads)

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: all but the input embedding (which the
        lm_head reuses, as a matmul, when tied)."""
        return self.total_params - (0 if self.tied_embeddings else self.embedding_params)

    @property
    def active_matmul_params(self) -> int:
        """The weights one token multiplies with: no norms or biases, and of an MoE's routed experts only its
        top-k (FLOPs count these; memory holds every weight)."""
        return self.matmul_params - self.non_matmul_params - (self.expert_params - self.active_expert_params)


@dataclass(frozen=True)
class Trainable:
    """What a training setup trains and how the frozen rest is stored."""

    trainable_params: int
    trainable_tensors: int = 0  # each tensor's Adam state carries a 4-byte `step` scalar
    quantized_params: int = 0  # frozen weights stored in 4 or 8 bits (QLoRA / load_in_8bit)
    adapter_input_features: int = 0  # sum of in_features over all LoRA-adapted Linears (their saved inputs)
    # DoRA only (0 otherwise): sum of out_features over the adapted Linears (two outputs each saved for the
    # magnitude's gradient), and the largest adapted weight's elements (W + s*B@A, rebuilt each forward for its norm)
    dora_output_features: int = 0
    dora_weight_elements: int = 0
    # the adapters on routed experts that one token does not use (all but its top-k experts): not in its FLOPs
    inactive_adapter_params: int = 0
    # parameter targets (fused experts): peft rebuilds each adapted weight as W + s*B@A in every forward, and the
    # expert matmuls keep it for the backward pass; all of them together, elements
    rebuilt_weight_elements: int = 0

    @property
    def active_adapter_params(self) -> int:
        return self.trainable_params - self.inactive_adapter_params

