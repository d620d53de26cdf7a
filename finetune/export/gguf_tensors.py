"""The model half of a GGUF file: each weight named, laid out and quantized the way llama.cpp reads it, for the
families in gguf_families.py.

Names come from the `gguf` package's own maps (`gguf.TensorNameMap` for the architecture llama.cpp uses), so
a tensor we cannot name is a tensor llama.cpp would not know what to do with: the export refuses it.
"""

from __future__ import annotations

from finetune.errors import ModelError
from finetune.export.gguf_families import SPECS, Family

# transformers model_type -> llama.cpp architecture name: the families the export writes (gguf_families.SPECS has
# the rest of each row). docs/models.md reads this table.
FAMILIES = {model_type: family.arch for model_type, family in SPECS.items()}

# --quant choice -> GGML type. These are the types gguf-py can *write* (gguf.quants.quantize) that llama.cpp
# runs on every backend; the k-quants (Q4_K_M ...) exist there only as dequantizers: use llama-quantize for them.
QUANT_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# general.file_type values (llama_ftype in llama.h): what a runtime shows as the file's type
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32}


def add_file_type(writer, quant: str) -> None:
    import gguf

    writer.add_file_type(_FILE_TYPE[quant])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _to_llama_rope(weight, n_head: int):
    """HF stores q/k rows as [all first halves | all second halves] per head (rotate_half); llama.cpp's Llama
    kernels want the two halves interleaved pairwise (GPT-J style). Reorder the rows of each head:
    (n_head, 2, head_dim/2, in) -> (n_head, head_dim/2, 2, in). transformers' GGUF loader undoes exactly this."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _split_experts(name: str, tensor, layout: str):
    """transformers 5 fuses a layer's experts into 3-D parameters (`mlp.experts.gate_up_proj`, `down_proj`, and
    gpt-oss's `*_bias`); llama.cpp wants gate, up and down apart, each [n_expert, out, in] (gguf's ffn_*_exps)."""
    base, kind = name.rsplit(".", 1)
    bias = kind.endswith("_bias")
    kind, suffix = kind.removesuffix("_bias"), (".bias" if bias else ".weight")
    if layout == "interleaved" and not bias:
        tensor = tensor.transpose(-1, -2)  # gpt-oss multiplies x @ W: [E, in, out] -> [E, out, in]
    if kind != "gate_up_proj":
        yield f"{base}.{kind}{suffix}", tensor
        return
    if layout == "interleaved":  # gpt-oss: gate and up alternate along the output axis
        gate, up = (tensor[..., 0::2], tensor[..., 1::2]) if bias else (tensor[:, 0::2], tensor[:, 1::2])
    else:  # qwen3_moe, mixtral: gate's rows, then up's (gate_up_proj(x).chunk(2))
        gate, up = tensor.chunk(2, dim=-1 if bias else -2)
    yield f"{base}.gate_proj{suffix}", gate
    yield f"{base}.up_proj{suffix}", up


def _hf_tensors(state_dict: dict, config, family: Family):
    """(name, tensor) in the layout gguf's TensorNameMap names: experts apart, bare parameters as `.weight`."""
    tied = getattr(config, "tie_word_embeddings", False)
    for name, tensor in state_dict.items():
        if name.endswith("rotary_emb.inv_freq"):  # recomputed by every runtime from rope.freq_base
            continue
        if name == "lm_head.weight" and tied and family.head != "required":
            continue  # llama.cpp reuses token_embd, as the HF model does
        if family.experts and ".mlp.experts." in name:
            yield from _split_experts(name, tensor, family.experts)
        elif name.endswith((".weight", ".bias")):
            yield name, tensor
        else:  # gpt-oss's attention sinks: a bare parameter, a weight to llama.cpp
            yield f"{name}.weight", tensor


def gguf_tensors(state_dict: dict, config, family: Family):
    """Yield (gguf_name, float32 ndarray) for every weight, or raise ModelError on one llama.cpp cannot hold."""
    import gguf
    import numpy as np

    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family.arch)
    names = gguf.TensorNameMap(arch, config.num_hidden_layers)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    heads = {gguf.MODEL_TENSOR.ATTN_Q: n_head, gguf.MODEL_TENSOR.ATTN_K: n_kv}
    for hf_name, tensor in _hf_tensors(state_dict, config, family):
        found = names.get_type_and_name(hf_name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise ModelError(
                f"the model has a weight `{hf_name}` that a `{family.arch}` GGUF has no place for (an extra head "
                "or module llama.cpp would not run); nothing was written"
            )
        kind, name = found
        data = tensor.detach().float().cpu().numpy()
        # biases are rows of the same projection: they take the same reordering as the weights
        if family.permute_qk and kind in heads:
            data = _to_llama_rope(data, heads[kind])
        if family.norm_shift and name.endswith("norm.weight"):
            data = data + family.norm_shift
        yield name, np.ascontiguousarray(data)


def encode(name: str, data, quant: str):
    """(array, raw GGML type or None) for GGUFWriter.add_tensor. What llama.cpp's converter keeps F32 stays F32:
    norms, biases, attention sinks and MoE routers; a matrix whose rows do not split into the type's blocks falls
    back to F16."""
    import gguf
    import numpy as np

    if quant == "f32" or data.ndim == 1 or not name.endswith(".weight") or ".ffn_gate_inp." in name:
        return data.astype(np.float32), None
    if quant == "f16":
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[quant.upper()]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if data.shape[-1] % block:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data, qtype), qtype
