"""Tiny mixture-of-experts models built from config with the tests' local tokenizer: what the MoE tests train.
Hidden 32, 4 experts, top-2, 2 layers. Never touches the network.

    python tests/tiny_moe.py DIR qwen3_moe    # writes an HF model folder (config, weights, tokenizer) to DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from tiny import build_tokenizer

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, tie_word_embeddings=False)


def moe_config(family: str, vocab_size: int = 128, **extra):
    """A tiny config of `family`: qwen3_moe and gpt_oss (trained), mixtral, olmoe, qwen2_moe (a shared expert and
    its gate), deepseek_v3 (shared experts, a dense first layer) for structural checks. `extra` overrides."""
    import transformers as t

    experts = dict(num_experts=4, num_experts_per_tok=2)
    families = {
        "qwen3_moe": (t.Qwen3MoeConfig, dict(intermediate_size=64, moe_intermediate_size=16, head_dim=8, **experts)),
        # attention sinks, biased experts stored (experts, in, out); its YaRN's 4k x 32 positions
        "gpt_oss": (t.GptOssConfig, dict(intermediate_size=16, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                         layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                                         max_position_embeddings=131072)),
        "mixtral": (t.MixtralConfig, dict(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)),
        "olmoe": (t.OlmoeConfig, dict(intermediate_size=16, **experts)),
        "qwen2_moe": (t.Qwen2MoeConfig, dict(intermediate_size=64, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=16, **experts)),
        # multi-head latent attention (as many KV heads as heads), one dense layer first
        "deepseek_v3": (t.DeepseekV3Config, dict(intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4,
                                                 n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                                                 n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                                                 qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                                 num_key_value_heads=4)),
    }
    cls, own = families[family]
    return cls(**{**SMALL, "vocab_size": vocab_size, **own, **extra})


def build_tiny_moe(out_dir: str | Path, family: str = "qwen3_moe", seed: int = 0, **extra) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    config = moe_config(family, len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(build_tiny_moe(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "qwen3_moe"))
