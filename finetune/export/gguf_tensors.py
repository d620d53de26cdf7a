"""The model half of a GGUF file: which families llama.cpp runs, their hyperparameters, and each weight
named, laid out and quantized the way llama.cpp reads it.

Names come from the `gguf` package's own maps (`gguf.TensorNameMap` for the architecture llama.cpp uses), so
a tensor we cannot name is a tensor llama.cpp would not know what to do with: the export refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ModelError

# transformers model_type -> llama.cpp architecture name. Mistral is a Llama to llama.cpp (same blocks; the
# sliding window is ignored there, as in llama.cpp's own converter). Each needs `permute_qk`: see _to_llama_rope.
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
# the heads a GGUF of these architectures can hold: a causal LM head (tied or not), nothing else
CAUSAL_LM_CLASSES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}

# --quant choice -> GGML type. These are the types gguf-py can *write* (gguf.quants.quantize) that llama.cpp
# runs on every backend; the k-quants (Q4_K_M ...) exist there only as dequantizers: use llama-quantize for them.
QUANT_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# general.file_type values (llama_ftype in llama.h): what a runtime shows as the file's type
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32}


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers'
    arch: str  # llama.cpp's
    permute_qk: bool


def family_of(config) -> Family:
    """The supported family for a transformers config, or a ModelError naming it and what is supported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ModelError(
            f"cannot export a `{model_type}` model to GGUF: supported families are "
            f"{', '.join(sorted(FAMILIES))} (SmolLM is a llama). Export the merged HF model instead "
            "(`finetune merge`) and convert it with llama.cpp's convert_hf_to_gguf.py if it supports the family."
        )
    heads = [a for a in (getattr(config, "architectures", None) or []) if a not in CAUSAL_LM_CLASSES]
    if heads:
        raise ModelError(
            f"the model is a `{heads[0]}`: a GGUF holds a causal language model (a ...ForCausalLM with its "
            "lm_head), not a classification or value head. Export the causal LM the run started from instead."
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ModelError(f"the model uses `{rope_type}` RoPE scaling, which this exporter does not write yet; "
                         "only plain RoPE (rope_type default) models can be exported")
    arch = FAMILIES[model_type]
    return Family(model_type, arch, permute_qk=arch == "llama")


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def add_hyperparameters(writer, config, family: Family, quant: str) -> None:
    """The architecture keys llama.cpp reads (`{arch}.block_count`, ...), from the transformers config."""
    import gguf

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(_FILE_TYPE[quant])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _to_llama_rope(weight, n_head: int):
    """HF stores q/k rows as [all first halves | all second halves] per head (rotate_half); llama.cpp's Llama
    kernels want the two halves interleaved pairwise (GPT-J style). Reorder the rows of each head:
    (n_head, 2, head_dim/2, in) -> (n_head, head_dim/2, 2, in). transformers' GGUF loader undoes exactly this."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(state_dict: dict, config, family: Family):
    """Yield (gguf_name, float32 ndarray) for every weight, or raise ModelError on one llama.cpp cannot hold."""
    import gguf
    import numpy as np

    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family.arch)
    names = gguf.TensorNameMap(arch, config.num_hidden_layers)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    for hf_name, tensor in state_dict.items():
        if hf_name.endswith("rotary_emb.inv_freq"):  # recomputed by every runtime from rope.freq_base
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelError(
                f"the model has a weight `{hf_name}` that a `{family.arch}` GGUF has no place for (an extra head "
                "or module llama.cpp would not run); nothing was written"
            )
        data = tensor.detach().float().cpu().numpy()
        # biases are rows of the same projection: they take the same reordering as the weights
        if family.permute_qk and name.endswith(("attn_q.weight", "attn_q.bias")):
            data = _to_llama_rope(data, n_head)
        elif family.permute_qk and name.endswith(("attn_k.weight", "attn_k.bias")):
            data = _to_llama_rope(data, n_kv)
        yield name, np.ascontiguousarray(data)


def encode(name: str, data, quant: str):
    """(array, raw GGML type or None) for GGUFWriter.add_tensor. Norms and biases (1-D) stay F32 like llama.cpp
    keeps them; a matrix whose rows do not split into the type's blocks falls back to F16."""
    import gguf
    import numpy as np

    if quant == "f32" or data.ndim == 1:
        return data.astype(np.float32), None
    if quant == "f16":
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[quant.upper()]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if data.shape[-1] % block:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data, qtype), qtype
