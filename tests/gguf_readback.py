"""Read a GGUF's weights back into a fresh transformers model of the same config, with gguf-py's reader: for the
families transformers' own GGUF loader does not read (gemma, olmo2, smollm3, mixtral as a llama with experts,
gpt-oss).

Written from the two layouts, not from the exporter: the GGUF side as llama.cpp's loader reads it (ffn_*_exps
[n_expert, out, in], q/k rows paired for the Llama rope), the HF side as transformers' modeling code uses it.
"""

from __future__ import annotations

import re

import numpy as np
import torch

# llama.cpp architectures that run the Llama ("NORM") rope, whose q/k rows the converter reorders
# (llama_model_rope_type in src/llama-model.cpp)
NORM_ROPE_ARCHS = {"llama", "smollm3"}
# Gemma's RMSNorm scales by 1 + w, llama.cpp's by w: the converter stores w + 1
PLUS_ONE_NORM_ARCHS = {"gemma", "gemma2", "gemma3"}


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
        if arch in PLUS_ONE_NORM_ARCHS and name.endswith("norm.weight"):
            data = data - 1
        if arch in NORM_ROPE_ARCHS and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            data = _unpermute(data, heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(data))
    # strict: every parameter filled, each in exactly its HF shape (a transposed layout would not fit)
    model.load_state_dict(state, strict=True)


def llama_cpp_spm_ids(fields: dict, text: str) -> list[int]:
    """llama.cpp's sentencepiece tokenization of `text` from a GGUF's tokens, scores, types and add_space_prefix
    (llama-vocab.cpp: special tokens split out first; a space before each text fragment that starts the text or
    follows a special token; then, over the characters, merge the adjacent pair whose joined token scores highest,
    the leftmost on a tie, until none is a token; a character that is not a token is spelled in <0xXX> bytes)."""
    tokens, scores, types = (fields[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    ids = {t: i for i, t in enumerate(tokens)}
    specials = sorted((t for t, kind in zip(tokens, types) if kind in (3, 4)), key=len, reverse=True)
    out, after_special = [], True
    for fragment in re.split("(" + "|".join(map(re.escape, specials)) + ")", text) if specials else [text]:
        if fragment in ids and fragment in specials:
            out.append(ids[fragment])
            after_special = True
            continue
        if not fragment:
            continue
        text_ = (" " if fields["tokenizer.ggml.add_space_prefix"] and after_special else "") + fragment
        symbols = list(text_.replace(" ", "\u2581"))
        while True:
            pairs = [(scores[ids[a + b]], -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:])) if a + b in ids]
            if not pairs:
                break
            i = -max(pairs)[1]
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        for symbol in symbols:
            out.extend([ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()])
        after_special = False
    return out
