"""`finetune export --gguf`: the file loads back with transformers' GGUF loader and gives the same logits, the
same token ids and the same chat rendering; a LoRA run exports through its recipe; refusals write nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from finetune.cli import main as cli_main

MIXED = [
    "the cat sat on the mat",
    "Crème brûlée à la française, naïve café",
    "東京で寿司を食べました。你好，世界",
    "emoji 🤗🚀 and 👩‍💻 too",
    "def f(x):\n    return x ** 2  # code\n\tif a != b: pass",
    "  leading spaces, 12345 digits and <|im_end|> specials",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is the river"},
            {"role": "assistant", "content": "a blue river"}, {"role": "user", "content": "and the tree?"}]


def build_tiny_qwen2(out_dir: Path) -> Path:
    """A tiny Qwen2 (attention biases, tied embeddings) with a byte-level BPE split like Qwen2's own tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from finetune.export.gguf_vocab import _QWEN2_SPLIT
    from tiny import CHATML, corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    # vocab_size above the tokenizer's length, as real checkpoints pad it: the extra ids must still load
    config = Qwen2Config(vocab_size=len(tokenizer) + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # random biases, so a q/k/v bias lost on the way would show in the logits
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model_dir):
    return {"llama": tiny_model_dir, "qwen2": build_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "model")}


def _export(folder: Path, out: Path, quant: str = "f32") -> int:
    return cli_main(["export", str(folder), "--gguf", "--quant", quant, "-o", str(out)])


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("quant", ["f32", "f16"])
def test_gguf_loads_back_with_the_same_logits(models, tmp_path, family, quant):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = models[family]
    out = tmp_path / f"{family}.gguf"
    assert _export(folder, out, quant) == 0
    original = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name, dtype=torch.float32)
    assert type(loaded).__name__ == type(original).__name__
    ids = AutoTokenizer.from_pretrained(folder)(" ".join(MIXED))["input_ids"]
    want, got = _logits(original, ids), _logits(loaded, ids)
    # f32 is exact up to reassociation; f16 rounds each weight to 11 significant bits
    tol = 1e-4 if quant == "f32" else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95


def test_q8_0_stays_close_and_is_smaller(models, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = models["llama"]
    assert _export(folder, tmp_path / "f16.gguf", "f16") == 0
    assert _export(folder, tmp_path / "q8.gguf", "q8_0") == 0
    assert (tmp_path / "q8.gguf").stat().st_size < 0.75 * (tmp_path / "f16.gguf").stat().st_size
    original = AutoModelForCausalLM.from_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q8.gguf")
    ids = list(range(5, 60))
    want, got = _logits(original, ids), _logits(loaded, ids)
    assert (got - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tokenizer_and_chat_template_round_trip(models, tmp_path, family):
    from transformers import AutoTokenizer

    folder = models[family]
    out = tmp_path / "m.gguf"
    assert _export(folder, out) == 0
    original = AutoTokenizer.from_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name)
    for text in MIXED:
        assert loaded(text)["input_ids"] == original(text)["input_ids"], text
    assert loaded.eos_token == original.eos_token and loaded.pad_token == original.pad_token
    rendered = original.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert loaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == rendered

    from gguf import GGUFReader

    fields = GGUFReader(out).fields
    assert fields["tokenizer.chat_template"].contents() == original.chat_template
    assert fields["tokenizer.ggml.pre"].contents() == {"llama": "gpt-2", "qwen2": "qwen2"}[family]


def test_modelfile_has_the_chatml_template_and_stops(models, tmp_path):
    assert _export(models["llama"], tmp_path / "m.gguf") == 0
    text = (tmp_path / "m.Modelfile").read_text()
    assert "FROM ./m.gguf" in text
    assert "<|im_start|>{{ .Role }}" in text and 'PARAMETER stop "<|im_end|>"' in text
    assert 'PARAMETER stop "<|endoftext|>"' in text and "PARAMETER num_ctx 512" in text


def test_lora_run_exports_through_its_recipe(tmp_path, tiny_model_dir, capsys):
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import make_records, write_jsonl
    from finetune.model.trained import load_adapter_model, locate
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    write_jsonl(tmp_path / "chat.jsonl", make_records("chat", 8))
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 4, "max_steps": 3, "micro_batch_size": 4, "learning_rate": 2e-2,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "logging_steps": 1}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    run_training(load_recipe(tmp_path / "recipe.yml"))
    capsys.readouterr()

    assert cli_main(["export", str(tmp_path / "recipe.yml"), "--gguf", "--quant", "f32"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == tmp_path / "out" / "gguf" / "out.f32.gguf" and (out.parent / "out.f32.Modelfile").is_file()
    adapter_model, tokenizer = load_adapter_model(locate(str(tmp_path / "recipe.yml")))
    loaded = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name)
    ids = tokenizer(MIXED[0])["input_ids"]
    want = _logits(adapter_model, ids)
    torch.testing.assert_close(_logits(loaded, ids), want, rtol=1e-4, atol=1e-4)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert (_logits(base, ids) - want).abs().max() > 1e-2  # the adapter changed the model: the match means something


def _refused(args: list[str], capsys) -> str:
    capsys.readouterr()  # what building the model printed
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1  # one message
    return err


def test_refuses_an_existing_output_and_leaves_it_alone(models, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"mine")
    err = _refused(["export", str(models["llama"]), "--gguf", "-o", str(out)], capsys)
    assert "already exists" in err and str(out) in err
    assert out.read_bytes() == b"mine" and not (tmp_path / "m.Modelfile").exists()


def test_refuses_an_unsupported_family_by_name(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    err = _refused(["export", str(tmp_path / "gpt2"), "--gguf", "-o", str(tmp_path / "x.gguf")], capsys)
    assert "`gpt2`" in err and "llama" in err and "qwen2" in err
    assert list(tmp_path.glob("*.gguf")) == [] and not list(tmp_path.glob(".*tmp"))


def test_refuses_a_classification_head(models, tmp_path, capsys):
    from transformers import AutoConfig, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(models["llama"], num_labels=2)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "cls")
    err = _refused(["export", str(tmp_path / "cls"), "--gguf", "-o", str(tmp_path / "x.gguf")], capsys)
    assert "LlamaForSequenceClassification" in err and "head" in err
    assert list(tmp_path.glob("*.gguf")) == []


def test_refuses_a_sentencepiece_tokenizer_before_loading_any_weight(models, tmp_path, capsys, monkeypatch):
    """The tokenizer is judged before the fp32 merge (minutes on a 7B): a refusal never loads the model."""
    import json
    import shutil

    import finetune.export.gguf as export_gguf

    folder = tmp_path / "spm"
    shutil.copytree(models["llama"], folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["model"]["byte_fallback"] = True  # what Llama 2 / Mistral v0.1 tokenizers are
    (folder / "tokenizer.json").write_text(json.dumps(spec))

    def never(*args):
        raise AssertionError("the model was loaded before the tokenizer was checked")

    monkeypatch.setattr(export_gguf, "load_model", never)
    err = _refused(["export", str(folder), "--gguf", "-o", str(tmp_path / "x.gguf")], capsys)
    assert "byte fallback" in err and "convert_hf_to_gguf" in err
    assert list(tmp_path.glob("*.gguf")) == []


def test_refuses_a_weight_gguf_cannot_hold_and_writes_nothing(models, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.errors import ModelError
    from finetune.export.gguf import write_gguf

    model = AutoModelForCausalLM.from_pretrained(models["llama"])
    model.v_head = torch.nn.Linear(64, 1)  # a value head (PPO-style) on top of the causal LM
    with pytest.raises(ModelError, match="v_head"):
        write_gguf(model, AutoTokenizer.from_pretrained(models["llama"]), tmp_path / "m.gguf", "f16", "m")
    assert list(tmp_path.iterdir()) == []


def test_mistral_exports_as_llama_with_the_same_logits(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, MistralConfig, MistralForCausalLM

    llama = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config
    config = MistralConfig(vocab_size=llama.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=None, tie_word_embeddings=False)
    torch.manual_seed(2)
    MistralForCausalLM(config).save_pretrained(tmp_path / "mistral")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "mistral")
    assert _export(tmp_path / "mistral", tmp_path / "gguf" / "m.gguf") == 0
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gguf"), gguf_file="m.gguf")
    ids = list(range(3, 80))
    want = _logits(AutoModelForCausalLM.from_pretrained(tmp_path / "mistral"), ids)
    torch.testing.assert_close(_logits(loaded, ids), want, rtol=1e-4, atol=1e-4)


def test_modelfile_leaves_a_template_it_cannot_translate_to_the_gguf(tiny_tokenizer):
    from finetune.export.ollama import modelfile

    tokenizer = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    text = modelfile("m.gguf", tokenizer, 4096)
    assert "TEMPLATE" not in text.replace("no TEMPLATE", "") and "tokenizer.chat_template" in text
    assert 'PARAMETER stop "<|endoftext|>"' in text and "num_ctx 4096" in text


def test_llama_attention_biases_take_the_rotary_reordering_of_their_weights(tiny_model_dir, tmp_path):
    """q/k biases are rows of the same projection as the weights, so llama.cpp's layout reorders them alike.
    (transformers' GGUF loader drops llama biases, so the check reads the file and undoes the reordering with
    transformers' own inverse, the one its loader applies to the weights.)"""
    import numpy as np
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attention_bias=True, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "biased")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "biased")
    assert _export(tmp_path / "biased", tmp_path / "gguf" / "b.gguf") == 0
    tensors = {t.name: np.array(t.data) for t in GGUFReader(str(tmp_path / "gguf" / "b.gguf")).tensors}
    undo = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    for name, proj in (("attn_q", model.model.layers[0].self_attn.q_proj),
                       ("attn_k", model.model.layers[0].self_attn.k_proj)):
        for kind, want in (("weight", proj.weight), ("bias", proj.bias)):
            got = undo.process(tensors[f"blk.0.{name}.{kind}"].reshape(want.shape), f"blk.0.{name}.{kind}").weights
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=1e-6)


def test_the_command_offers_exactly_the_types_the_writer_takes():
    """commands/export.py spells the list out so `--help` stays light: it must not drift from the writer's."""
    from finetune.commands.export import QUANT_CHOICES
    from finetune.export.gguf_tensors import QUANT_TYPES

    assert tuple(QUANT_CHOICES) == tuple(QUANT_TYPES)


def test_a_gguf_file_is_written_whole_or_not_at_all(tmp_path):
    """export/gguf.py's gguf_file, which both the model's GGUF and the mmproj file go through: an error while the
    file is being filled leaves neither the file nor a temporary one; a block that ends writes it, with the mode
    any other file gets (the umask's), readable by gguf's own reader."""
    import numpy as np
    from gguf import GGUFReader

    from finetune.atomic import current_umask
    from finetune.export.gguf import gguf_file

    out = tmp_path / "m.gguf"
    with pytest.raises(RuntimeError, match="a tensor llama.cpp cannot hold"):
        with gguf_file(out, "llama") as writer:
            writer.add_name("m")
            raise RuntimeError("a tensor llama.cpp cannot hold")
    assert list(tmp_path.iterdir()) == []
    with gguf_file(out, "llama") as writer:
        writer.add_name("m")
        writer.add_tensor("t", np.arange(4, dtype=np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    assert (out.stat().st_mode & 0o777) == 0o666 & ~current_umask()
    tensors = GGUFReader(out).tensors
    assert [t.name for t in tensors] == ["t"] and tensors[0].data.tolist() == [0.0, 1.0, 2.0, 3.0]
