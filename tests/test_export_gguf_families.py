"""GGUF export of each family llama.cpp runs beyond Llama / Qwen2 (test_export_gguf.py has those and the
tokenizer): a tiny model per family, exported f32 through the CLI, read back and its logits compared with the
model's; the keys llama.cpp reads checked by their llama.cpp names; a config llama.cpp cannot represent refused.

Read back with transformers' GGUF loader where it reads the family's tensors (its own inverse of llama.cpp's
layout: Gemma's +1 norms, Qwen-MoE's expert split), given the original config since it guesses some
hyperparameters from defaults; with tests/gguf_readback.py (gguf-py's reader) for the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from finetune.cli import main as cli_main

_SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)
# sliding windows shorter than the probe text, so a sliding layer really slides
TINY_CONFIGS = {
    "qwen3": ("Qwen3Config", dict(head_dim=8)),  # head_dim apart from hidden/heads: key_length must be written
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "gemma": ("GemmaConfig", dict(head_dim=8)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4)),
    "gemma3_text": ("Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=4, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "phi3": ("Phi3Config", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                 "partial_rotary_factor": 0.5})),
    "olmo2": ("Olmo2Config", dict(tie_word_embeddings=True)),  # llama.cpp's olmo2 needs output.weight written
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4)),  # layer 3 leaves RoPE out
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                                     max_position_embeddings=131072)),  # yarn, factor 32 over 4096
}
# the architecture llama.cpp runs, and keys its loader reads (their llama.cpp names) with the tiny config's values
_EXPECTED = {
    "qwen3": ("qwen3", {"attention.key_length": 8, "attention.head_count_kv": 2}),
    "qwen3_moe": ("qwen3moe", {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32}),
    "mixtral": ("llama", {"expert_count": 4, "expert_used_count": 2, "rope.freq_base": 1e6}),
    "gemma": ("gemma", {"attention.key_length": 8, "attention.head_count_kv": 2}),
    "gemma2": ("gemma2", {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                          "attention.sliding_window": 4, "attention.key_length": 16}),
    "gemma3_text": ("gemma3", {"attention.sliding_window": 4, "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
                               "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}),
    "phi3": ("phi3", {"rope.dimension_count": 8, "rope.scaling.original_context_length": 4096}),
    "olmo2": ("olmo2", {"attention.layer_norm_rms_epsilon": 1e-5}),
    "smollm3": ("smollm3", {"rope.freq_base": 2e6, "rope.dimension_count": 16}),
    "gpt_oss": ("gpt-oss", {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 96,
                            "attention.sliding_window": 4, "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
                            "rope.scaling.original_context_length": 4096, "context_length": 131072}),
}
# llama.cpp loads their output.weight as required (not TENSOR_NOT_REQUIRED): written even when tied
_HEAD_REQUIRED = {"olmo2", "gpt_oss"}
# the families whose tensors transformers' GGUF loader maps back (modeling_gguf_pytorch_utils)
_TRANSFORMERS_READS = {"qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3"}


def tiny_family_model(model_type: str, tokenizer):
    import transformers

    class_name, extra = TINY_CONFIGS[model_type]
    config = getattr(transformers, class_name)(**{**_SHAPE, **extra}, vocab_size=len(tokenizer), bos_token_id=None,
                                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms, biases and sinks off their init, so a lost shift, bias or sink shows in the logits
        for name, param in model.named_parameters():
            if param.ndim == 1 or "bias" in name or "sinks" in name:
                param.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_tokenizer):
    """model_type -> (the model, its folder, its f32 GGUF), each built and exported once."""
    def export(model_type: str):
        folder = tmp_path_factory.mktemp(model_type)
        model = tiny_family_model(model_type, tiny_tokenizer)
        model.save_pretrained(folder / "model")
        tiny_tokenizer.save_pretrained(folder / "model")
        out = folder / "gguf" / "m.gguf"
        assert cli_main(["export", str(folder / "model"), "--gguf", "--quant", "f32", "-o", str(out)]) == 0
        return model, folder / "model", out

    cache: dict = {}

    def get(model_type: str):
        if model_type not in cache:
            cache[model_type] = export(model_type)
        return cache[model_type]

    return get


def _read_back(model_type: str, model, out: Path):
    from transformers import AutoModelForCausalLM

    if model_type in _TRANSFORMERS_READS:
        return AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, config=model.config,
                                                    dtype=torch.float32).eval()
    from gguf_readback import load_into

    fresh = AutoModelForCausalLM.from_config(model.config).eval()
    load_into(fresh, out)
    return fresh


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.mark.parametrize("model_type", list(TINY_CONFIGS))
def test_family_exports_with_the_same_logits_and_llama_cpp_keys(exported, tiny_tokenizer, model_type):
    from gguf_readback import gguf_arrays

    model, _, out = exported(model_type)
    arch, arrays, fields = gguf_arrays(out)
    want_arch, keys = _EXPECTED[model_type]
    assert arch == want_arch
    for key, value in keys.items():
        assert fields[f"{arch}.{key}"] == (pytest.approx(value) if isinstance(value, float) else value), key
    assert ("output.weight" in arrays) == (not model.config.tie_word_embeddings or model_type in _HEAD_REQUIRED)
    ids = tiny_tokenizer("the cat sat on the mat, the quick dog runs to the river 12345")["input_ids"]
    want, got = _logits(model, ids), _logits(_read_back(model_type, model, out), ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_finetune_eval_reads_a_gguf_back_whole_or_says_it_cannot(exported, tiny_tokenizer, model_type):
    """`finetune eval`'s GGUF drift reads the export with transformers: given the run's config, a family its GGUF
    loader maps gives the model's logits; one it reads without some weights (Mixtral's experts: a Llama with fresh
    MLPs) or not at all (gpt-oss) is one message, never a drift measured against freshly drawn weights."""
    from finetune.errors import ModelError
    from finetune.evaluation.subject import load_gguf

    model, _, out = exported(model_type)
    if model_type not in _TRANSFORMERS_READS:
        with pytest.raises(ModelError, match="transformers cannot read .* back whole"):
            load_gguf(out, tiny_tokenizer, model.config)
        return
    ids = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    got = _logits(load_gguf(out, tiny_tokenizer, model.config), ids)
    torch.testing.assert_close(got, _logits(model, ids), rtol=1e-4, atol=1e-4)


def test_expert_and_sink_tensors_are_laid_out_as_llama_cpp_reads_them(exported):
    """llama.cpp's ffn_{gate,up,down}_exps are [n_expert, out, in]; gpt-oss's fused gate_up is [E, in, 2*out] with
    gate and up alternating (its converter's [::2] / [1::2]); the router and sinks stay F32 as llama.cpp keeps
    them."""
    from gguf import GGUFReader, GGMLQuantizationType

    from gguf_readback import gguf_arrays

    model, _, out = exported("gpt_oss")
    experts = model.model.layers[0].mlp.experts
    _, arrays, _ = gguf_arrays(out)
    gate_up = experts.gate_up_proj.detach().numpy()  # [E, H, 2I]
    assert arrays["blk.0.ffn_gate_exps.weight"].tolist() == gate_up[:, :, 0::2].swapaxes(1, 2).tolist()
    assert arrays["blk.0.ffn_up_exps.bias"].tolist() == experts.gate_up_proj_bias.detach().numpy()[:, 1::2].tolist()
    assert arrays["blk.0.attn_sinks.weight"].tolist() == model.model.layers[0].self_attn.sinks.detach().tolist()
    assert "output.weight" in arrays  # gpt-oss always has its own head in llama.cpp

    model, folder, _ = exported("qwen3_moe")
    q8 = folder.parent / "q8.gguf"
    assert cli_main(["export", str(folder), "--gguf", "--quant", "q8_0", "-o", str(q8)]) == 0
    types = {t.name: t.tensor_type for t in GGUFReader(str(q8)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.attn_q_norm.weight"] == GGMLQuantizationType.F32
    ids = list(range(3, 60))
    want, got = _logits(model, ids), _logits(_read_back("qwen3_moe", model, q8), ids)
    assert (got - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.parametrize("model_type, change, named", [
    ("qwen3_moe", dict(norm_topk_prob=False), "norm_topk_prob"),
    ("gemma3_text", dict(query_pre_attn_scalar=256), "query_pre_attn_scalar"),
    ("gemma2", dict(tie_word_embeddings=False), "untied"),
    ("smollm3", dict(no_rope_layers=[1, 1, 1, 1]), "no_rope_layers"),
    ("gpt_oss", dict(swiglu_limit=5.0), "swiglu_limit"),
    ("gpt_oss", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    ("phi3", dict(original_max_position_embeddings=128, rope_parameters={
        "rope_type": "longrope", "rope_theta": 1e4, "long_factor": [1.0] * 8, "short_factor": [1.0] * 8}),
     "`longrope` RoPE scaling"),
])
def test_refuses_what_llama_cpp_cannot_represent_by_name(tmp_path, tiny_tokenizer, capsys, model_type, change, named):
    """From config.json alone, before any weight is read: one message naming the family, the reason and the way out."""
    import transformers

    class_name, extra = TINY_CONFIGS[model_type]
    getattr(transformers, class_name)(**{**_SHAPE, **extra, **change}, vocab_size=len(tiny_tokenizer)) \
        .save_pretrained(tmp_path / "model")  # a config, no weights: the refusal never loads them
    assert cli_main(["export", str(tmp_path / "model"), "--gguf", "-o", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert f"`{model_type}`" in err and named in err and "finetune merge" in err
    assert not list(tmp_path.glob("*.gguf"))


@pytest.mark.parametrize("split, ignore_merges, name", [
    ("_GPT4O_SPLIT", False, "gpt-4o"),  # o200k: gpt-oss
    ("_LLAMA3_SPLIT", False, "dbrx"),  # cl100k: OLMo 2, Phi-4
    ("_LLAMA3_SPLIT", True, "llama-bpe"),  # Llama 3's own tokenizer.json: SmolLM3
])
def test_each_familys_split_is_written_under_llama_cpp_name(tmp_path, tiny_model_dir, split, ignore_merges, name):
    """The split before BPE, read from the tokenizer, is written as llama.cpp's name for it (whose handling in
    llama-vocab.cpp includes ignore_merges for `llama-bpe` only); transformers rebuilds the same ids from the file."""
    import shutil

    from gguf import GGUFReader
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # the splits as transformers' GGUF tokenizer reader spells them for llama.cpp's names: a second source
    from transformers.integrations.gguf import gguf_tokenizer_mapping

    from tiny import CHATML, corpus

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(getattr(gguf_tokenizer_mapping, split)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    shutil.copytree(tiny_model_dir, tmp_path / "model")  # the tiny llama: 512 ids hold these 400
    tokenizer.save_pretrained(tmp_path / "model")
    assert cli_main(["export", str(tmp_path / "model"), "--gguf", "--quant", "f16", "-o",
                     str(tmp_path / "m.gguf")]) == 0
    assert GGUFReader(str(tmp_path / "m.gguf")).fields["tokenizer.ggml.pre"].contents() == name
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    for text in ("Crème brûlée, naïve café", "東京で寿司を食べました", "emoji 🤗🚀 and CamelCase's 12345",
                 "def f(x):\n    return x ** 2\n\n\tpass", "<|im_start|>user\nhi<|im_end|>"):
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"], text


def test_refuses_a_file_name_llama_cpp_would_take_for_phi3(tiny_model_dir, tmp_path, capsys):
    """llama.cpp sets Phi-3 token attributes when general.name (the file's stem) says phi3, looking up `</s>`,
    `<unk>`, `<s>` by text: a byte-level vocabulary without them would not load (seen in llama-cpp-python 0.3.36)."""
    out = tmp_path / "phi3-tune.gguf"
    assert cli_main(["export", str(tiny_model_dir), "--gguf", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "`phi3-tune`" in err and "</s>" in err
    assert not out.exists()


def spm_tokenizer(style: str):
    """A tiny sentencepiece-style BPE (byte fallback, `▁` for a space) in the shapes transformers holds them:
    "gemma" (transformers' GemmaTokenizer: no prefix space), "llama2" (Llama 2's tokenizer.json: a `Prepend`
    normalizer), "metaspace" (transformers' LlamaTokenizer: a `Metaspace` pre-tokenizer, which llama.cpp differs from
    on text that starts with a space)."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer, LlamaTokenizer, PreTrainedTokenizerFast

    from tiny import CHATML, corpus

    pieces = Tokenizer(models.BPE())
    pieces.normalizer = normalizers.Replace(" ", "\u2581")
    pieces.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never" if style == "gemma" else "always")
    pieces.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=300, special_tokens=[]))
    trained = json.loads(pieces.to_str())["model"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>"] if style == "gemma" else
                                       ["<unk>", "<s>", "</s>"])}
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) for m in trained["merges"]]
    if style == "gemma":
        tokenizer = GemmaTokenizer(vocab=vocab, merges=merges)
    elif style == "metaspace":
        tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, legacy=True)
    else:
        raw = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        raw.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


# "river", "runs", "now" and the made-up words tokenize differently if llama.cpp merged left to right, not by score
SPM_TEXTS = ["the river runs now, upwuoun iasemf diqprum atri", "  leading spaces and trailing  ",
             "Crème brûlée, naïve café",
             "東京で寿司を食べました。你好", "emoji 🤗🚀 too", "def f(x):\n    return x ** 2\n\tpass",
             "<|im_start|>user\nwhat is the river<|im_end|>\n<|im_start|>assistant\n", " <|im_start|> hi",
             "hello<|im_end|> world 12345"]


@pytest.mark.parametrize("style, space_prefix", [("gemma", False), ("llama2", True)])
def test_a_sentencepiece_vocabulary_is_written_for_llama_cpp_s_tokenizer(tmp_path, style, space_prefix):
    """Gemma's and Llama 2's vocabularies as llama.cpp's `llama` tokenizer: bytes typed BYTE, the unknown UNKNOWN,
    scores in merge order; llama.cpp's algorithm (tests/gguf_readback.py) over the file gives transformers' ids,
    special tokens and the prefix space after them included (llama-cpp-python 0.3.36 itself: the same)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gguf_readback import gguf_arrays, llama_cpp_spm_ids
    from finetune.export.gguf import write_gguf

    tokenizer = spm_tokenizer(style)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    write_gguf(LlamaForCausalLM(config), tokenizer, tmp_path / "m.gguf", "f16", "m")
    _, _, fields = gguf_arrays(tmp_path / "m.gguf")
    assert fields["tokenizer.ggml.model"] == "llama" and fields["tokenizer.ggml.add_space_prefix"] is space_prefix
    types = dict(zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]))
    assert types["<0x41>"] == 6 and types["<unk>"] == 2 and types["<|im_end|>"] == 3 and types["\u2581the"] == 1
    for text in SPM_TEXTS:
        assert llama_cpp_spm_ids(fields, text) == tokenizer(text, add_special_tokens=False)["input_ids"], text


def test_refuses_a_sentencepiece_vocabulary_whose_space_llama_cpp_would_place_differently(tmp_path, capsys):
    """transformers' Metaspace adds no space before text that starts with one (after `[INST]` in a chat, say);
    llama.cpp always does: the ids would differ from training's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = spm_tokenizer("metaspace")
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    capsys.readouterr()  # what saving printed
    assert cli_main(["export", str(tmp_path / "model"), "--gguf", "-o", str(tmp_path / "m.gguf")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "Metaspace" in err and "special token" in err
    assert not (tmp_path / "m.gguf").exists()
