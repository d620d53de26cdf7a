"""The families llama.cpp runs, as one table: per transformers `model_type`, the architecture llama.cpp names it,
how its weights differ from transformers' layout, the hyperparameters llama.cpp reads beyond the common ones,
and what of a config llama.cpp cannot represent (refused by name, from config.json, before a weight is loaded).

Each row follows what llama.cpp's own convert_hf_to_gguf.py writes for that architecture and what its loader
(src/llama-model.cpp, src/models/*.cpp) reads and hard-codes. Key and tensor names come from the `gguf` package
(GGUFWriter.add_*, gguf.TensorNameMap), never spelt here.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ModelError

_ALTERNATIVE = ("Export the merged HF model instead (`finetune merge`) and convert it with llama.cpp's "
                "convert_hf_to_gguf.py if it supports the family.")


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers'
    arch: str  # llama.cpp's (gguf.MODEL_ARCH_NAMES)
    # llama.cpp's Llama-style rope (LLAMA_ROPE_TYPE_NORM) rotates adjacent row pairs: q/k rows are reordered
    permute_qk: bool = False
    # Gemma's RMSNorm scales by (1 + w), llama.cpp's by w: the converter adds 1 to every norm weight
    norm_shift: float = 0.0
    # "" dense; "halves": [E, 2I, H] with gate rows then up rows (qwen3_moe, mixtral);
    # "interleaved": gpt-oss's [E, H, 2I] with gate and up columns alternating
    experts: str = ""
    # "optional": output.weight left out when tied (llama.cpp reuses token_embd); "required": llama.cpp always loads
    # it, so a tied head is written out; "tied": llama.cpp has no place for an untied head
    head: str = "optional"
    act: str = "silu"  # the activation llama.cpp hard-codes for the architecture
    # llama.cpp's default sliding-window period (layer i slides when i % p < p - 1); None: no sliding window there
    swa_period: int | None = None
    rope_types: tuple[str, ...] = ("default", "linear", "yarn")  # what the converter writes as rope scaling
    # (GGUFWriter method, config attribute) written when the attribute is set
    keys: tuple[tuple[str, str], ...] = ()


_GEMMA = dict(norm_shift=1.0, act="gelu_pytorch_tanh")
_TABLE = (
    # llama.cpp's Llama 3 rope needs a rope_freqs tensor that is not written yet: plain RoPE only
    Family("llama", "llama", permute_qk=True, rope_types=("default",)),
    # a Llama to llama.cpp; the sliding window is not used there (nor by its converter)
    Family("mistral", "llama", permute_qk=True, rope_types=("default",)),
    Family("mixtral", "llama", permute_qk=True, experts="halves", rope_types=("default",)),
    Family("qwen2", "qwen2"),
    Family("qwen3", "qwen3"),
    Family("qwen3_moe", "qwen3moe", experts="halves",
           keys=(("add_expert_feed_forward_length", "moe_intermediate_size"),)),
    Family("smollm3", "smollm3", permute_qk=True),
    Family("olmo2", "olmo2", head="required"),
    # Phi-3's long-context scaling (longrope) is written by the converter as factor tensors: not here
    Family("phi3", "phi3", rope_types=("default",),
           keys=(("add_sliding_window", "sliding_window"),
                 ("add_rope_scaling_orig_ctx_len", "original_max_position_embeddings"))),
    Family("gemma", "gemma", head="tied", **_GEMMA),
    Family("gemma2", "gemma2", head="tied", swa_period=2, **_GEMMA,
           keys=(("add_attn_logit_softcapping", "attn_logit_softcapping"),
                 ("add_final_logit_softcapping", "final_logit_softcapping"),
                 ("add_sliding_window", "sliding_window"))),
    Family("gemma3_text", "gemma3", swa_period=6, **_GEMMA,
           keys=(("add_final_logit_softcapping", "final_logit_softcapping"), ("add_sliding_window", "sliding_window"))),
    Family("gpt_oss", "gpt-oss", experts="interleaved", head="required", act="", swa_period=2,
           keys=(("add_sliding_window", "sliding_window"), ("add_expert_feed_forward_length", "intermediate_size"))),
)
SPECS: dict[str, Family] = {f.model_type: f for f in _TABLE}


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_of(config) -> tuple[dict, dict | None]:
    """(the full-attention rope parameters, the sliding layers' own or None) from transformers 5's rope_parameters
    (flat, or per layer type as Gemma 3 has them)."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if "full_attention" in rope or "sliding_attention" in rope:
        return rope.get("full_attention", {}), rope.get("sliding_attention")
    if "rope_theta" not in rope and getattr(config, "rope_theta", None) is not None:
        rope["rope_theta"] = config.rope_theta
    return rope, None


def _rope_type(rope: dict) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def _swa_problem(config, family: Family) -> str | None:
    layer_types = list(getattr(config, "layer_types", None) or [])
    if not layer_types:
        return None
    p = family.swa_period
    expected = [("sliding_attention" if p and i % p < p - 1 else "full_attention") for i in range(len(layer_types))]
    if layer_types == expected:
        return None
    if p is None:
        return f"some layers use sliding-window attention, which llama.cpp's `{family.arch}` does not"
    return (f"its layer_types {layer_types} are not llama.cpp's `{family.arch}` pattern (every layer slides but "
            f"each {p}th), which llama.cpp reads from the architecture, not from the file")


def _gemma_problem(config, family: Family) -> str | None:
    # llama.cpp scales queries by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B layer counts
    big = config.num_hidden_layers == {"gemma2": 46, "gemma3": 62}.get(family.arch)
    expected = config.hidden_size // config.num_attention_heads if big else head_dim(config)
    if getattr(config, "query_pre_attn_scalar", expected) != expected:
        return (f"query_pre_attn_scalar is {config.query_pre_attn_scalar}, but llama.cpp scales queries by "
                f"1/sqrt({expected}) for this shape")
    if family.arch == "gemma2" and (config.attn_logit_softcapping is None or config.final_logit_softcapping is None):
        return "llama.cpp's gemma2 always soft-caps attention and final logits; this config turns one off"
    if family.arch == "gemma3" and getattr(config, "attn_logit_softcapping", None) is not None:
        return "llama.cpp's gemma3 has no attention-logit soft-capping"
    return None


def _family_problem(config, family: Family) -> str | None:
    """What of this config llama.cpp's architecture cannot represent, or None."""
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if family.act and act != family.act:
        return f"its activation is `{act}`; llama.cpp's `{family.arch}` computes `{family.act}`"
    if family.head == "tied" and not getattr(config, "tie_word_embeddings", True):
        return f"its output head is untied from the embedding; llama.cpp's `{family.arch}` always ties them"
    if problem := _swa_problem(config, family):
        return problem
    full, sliding = rope_of(config)
    if _rope_type(full) not in family.rope_types or (sliding and _rope_type(sliding) != "default"):
        rope_type = _rope_type(full) if _rope_type(full) not in family.rope_types else _rope_type(sliding)
        return (f"it uses `{rope_type}` RoPE scaling, which this exporter does not write for `{family.model_type}` "
                f"(it writes {', '.join(family.rope_types)})")
    if family.norm_shift:
        return _gemma_problem(config, family)
    if family.model_type == "qwen3_moe" and (not config.norm_topk_prob or config.mlp_only_layers
                                             or config.decoder_sparse_step != 1):
        return ("llama.cpp's qwen3moe renormalizes the top-k expert weights and puts experts in every layer; "
                "this config has norm_topk_prob false, mlp_only_layers or a decoder_sparse_step above 1")
    if family.model_type == "smollm3":
        nope = [int((i + 1) % 4 != 0) for i in range(config.num_hidden_layers)]
        if list(config.no_rope_layers) != nope:
            return "llama.cpp's smollm3 leaves RoPE out of every 4th layer exactly; this config's no_rope_layers differ"
    if family.model_type == "gpt_oss" and config.swiglu_limit != 7.0:
        return f"llama.cpp's gpt-oss clamps its SwiGLU at 7.0; this config's swiglu_limit is {config.swiglu_limit}"
    return None


def family_of(config) -> Family:
    """The supported family for a transformers config, or a ModelError naming it and what is supported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SPECS:
        raise ModelError(
            f"cannot export a `{model_type}` model to GGUF: supported families are "
            f"{', '.join(sorted(SPECS))} (SmolLM and SmolLM2 are llamas). {_ALTERNATIVE}"
        )
    heads = [a for a in (getattr(config, "architectures", None) or []) if not a.endswith("ForCausalLM")]
    if heads:
        raise ModelError(
            f"the model is a `{heads[0]}`: a GGUF holds a causal language model (a ...ForCausalLM with its "
            "lm_head), not a classification or value head. Export the causal LM the run started from instead."
        )
    family = SPECS[model_type]
    if problem := _family_problem(config, family):
        raise ModelError(f"cannot export this `{model_type}` model to GGUF: {problem}. {_ALTERNATIVE}")
    return family


def _add_rope(writer, config, family: Family) -> None:
    import gguf

    full, sliding = rope_of(config)
    writer.add_rope_freq_base(float(full.get("rope_theta", 10000.0)))
    if sliding and "rope_theta" in sliding:
        writer.add_rope_freq_base_swa(float(sliding["rope_theta"]))
    rope_type = _rope_type(full)
    if rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    elif rope_type == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        for key, add in (("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
                         ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if full.get(key) is not None:
                add(full[key])


def add_hyperparameters(writer, config, family: Family) -> None:
    """The architecture keys llama.cpp reads (`{arch}.block_count`, ...), from the transformers config."""
    dim = head_dim(config)
    full, _ = rope_of(config)
    partial = full.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
    writer.add_rope_dimension_count(int(dim * partial))  # Phi-4-mini rotates 3/4 of each head
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    _add_rope(writer, config, family)
    if family.experts:
        writer.add_expert_count(getattr(config, "num_local_experts", None) or config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    for method, attribute in family.keys:
        if getattr(config, attribute, None) is not None:
            getattr(writer, method)(getattr(config, attribute))
