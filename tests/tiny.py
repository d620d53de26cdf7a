"""A tiny Llama and a tokenizer trained locally: what the tests fine-tune. Never touches the network.

    python tests/tiny.py DIR     # writes an HF model folder (config, weights, tokenizer) to DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

WORDS = (
    "the a cat dog sat on mat river tree house blue red green small big quick slow jumps runs sleeps "
    "what is why how where when answer question data model train learn token good bad yes no "
    "one two three four five six seven eight nine ten plus minus equals hello world thanks please "
    "python code function list number text write read file open close summer winter rain sun"
).split()

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    # the scaffolding of our prompt formats, so they tokenize into few tokens
    lines += ["### Instruction:\n### Input:\n### Response:\nBelow is an instruction that describes a task."] * 20
    return lines


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>")
    fast.chat_template = CHATML
    return fast


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# The family matrix's sizes (tests/test_families.py): each key a config class has is set, so one table shrinks
# every family: dense, mixture-of-experts (4 experts, top 2), DeepSeek's latent attention, Qwen3-Next's linear
# attention. A window of 6 tokens makes sliding-window layers matter on the matrix's ~50-token examples.
FAMILY_SIZES = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, max_position_embeddings=512, sliding_window=6,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=4,
    linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
)


def family_config(model_type: str, tokenizer):
    """A 2-layer config of `model_type` sized by FAMILY_SIZES, its vocabulary the tiny tokenizer's. Where the family
    mixes layer kinds (sliding / full, linear / full), the two layers are one of each."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    keys = {k: v for k, v in FAMILY_SIZES.items() if getattr(default, k, None) is not None}
    if getattr(default, "kv_lora_rank", None):  # latent attention: one key/value per head, rotary dims its own
        keys.update(head_dim=keys["qk_rope_head_dim"], num_key_value_heads=keys["num_attention_heads"],
                    qk_head_dim=keys["qk_rope_head_dim"] + keys["qk_nope_head_dim"])
    kinds = list(dict.fromkeys(getattr(default, "layer_types", None) or []))
    if kinds:
        keys["layer_types"] = (kinds * 2)[:2]
    if getattr(default, "no_rope_layers", None):  # SmolLM3: one layer with RoPE, one without
        keys["no_rope_layers"] = [1, 0]
    if getattr(default, "mlp_only_layers", None) is not None:
        keys["mlp_only_layers"] = []
    return cls(**keys, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=False)


def build_family_model(model_type: str, out_dir: str | Path, tokenizer=None, seed: int = 0) -> Path:
    """An HF folder with a tiny `model_type` model (`family_config`) and the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    tokenizer = tokenizer or build_tokenizer()
    config = family_config(model_type, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-model"))
