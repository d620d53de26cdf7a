"""Read a GGUF's weights back into a fresh transformers model of the same config, with gguf-py's reader: for the
families transformers' own GGUF loader does not read (olmo2, smollm3, mixtral as a llama with experts, gpt-oss).

Written from the two layouts, not from the exporter: the GGUF side as llama.cpp's loader reads it (ffn_*_exps
[n_expert, out, in], q/k rows paired for the Llama rope), the HF side as transformers' modeling code uses it.
"""

from __future__ import annotations

import numpy as np
import torch

# llama.cpp architectures that run the Llama ("NORM") rope, whose q/k rows the converter reorders
# (llama_model_rope_type in src/llama-model.cpp)
NORM_ROPE_ARCHS = {"llama", "smollm3"}


def gguf_arrays(path) -> tuple[str, dict[str, np.ndarray], dict]:
    """(architecture, tensor name -> float32 array in its logical shape, field name -> value)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    arrays = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32) for t in reader.tensors}
    return fields["general.architecture"], arrays, fields


def _unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's pairing of q/k rows (transformers' own LlamaTensorProcessor inverse)."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    return LlamaTensorProcessor()._reverse_permute_weights(rows, n_head, n_head)


def _experts(name: str, get, interleaved: bool) -> np.ndarray:
    """HF's fused expert parameter from gguf's gate/up/down: [E, 2I, H] gate rows then up rows (qwen3_moe,
    mixtral), or gpt-oss's [E, H, 2I] with gate and up columns alternating (and its [E, 2I] biases)."""
    base, kind = name.rsplit(".", 1)
    bias = kind.endswith("_bias")
    kind, suffix = kind.removesuffix("_bias"), ("bias" if bias else "weight")
    if kind == "down_proj":
        down = get(f"{base}.down_proj.{suffix}")
        return down.swapaxes(-1, -2) if interleaved and not bias else down
    gate, up = get(f"{base}.gate_proj.{suffix}"), get(f"{base}.up_proj.{suffix}")
    if not interleaved:
        return np.concatenate([gate, up], axis=1)
    if bias:  # [E, I] each -> [E, 2I]
        fused = np.empty((gate.shape[0], 2 * gate.shape[1]), np.float32)
        fused[:, 0::2], fused[:, 1::2] = gate, up
        return fused
    fused = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]), np.float32)  # [E, 2I, H]
    fused[:, 0::2], fused[:, 1::2] = gate, up
    return fused.swapaxes(1, 2)  # gpt-oss computes x @ W: [E, H, 2I]


def load_into(model, path) -> None:
    """Fill every parameter of `model` (built from the original config) from the GGUF at `path`."""
    import gguf

    arch, arrays, _ = gguf_arrays(path)
    config = model.config
    names = gguf.TensorNameMap(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch),
                               config.num_hidden_layers)

    def get(hf_name: str) -> np.ndarray:
        return arrays[names.get_name(hf_name, try_suffixes=(".weight", ".bias"))]

    state = {}
    for name in model.state_dict():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if ".mlp.experts." in name:
            data = _experts(name, get, interleaved=arch == "gpt-oss")
        elif name == "lm_head.weight" and "output.weight" not in arrays:
            data = arrays["token_embd.weight"]  # tied
        else:
            data = get(name if name.endswith((".weight", ".bias")) else f"{name}.weight")
        if arch in NORM_ROPE_ARCHS and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            data = _unpermute(data, heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(data))
    # strict: every parameter filled, each in exactly its HF shape (a transposed layout would not fit)
    model.load_state_dict(state, strict=True)
