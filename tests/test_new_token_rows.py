"""New tokens with an adapter (issue 33 item 8): only their embedding / lm_head rows are trained and saved
(peft's trainable tokens), never whole copies of both matrices (a new pad token made a 1B model's LoRA adapter
718 MB); the rows do train; merge and GGUF export carry them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from finetune.cli import main as cli_main

TOOL = "<|tool|>"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    from conftest import make_records, write_jsonl
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    root = tmp_path_factory.mktemp("newtok")
    records = make_records("instruction", 16)
    for r in records:  # the new token is supervised: its rows get gradient
        r["output"] = f"{TOOL} {r['output']} {TOOL}"
    write_jsonl(root / "d.jsonl", records)
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "d.jsonl", "type": "instruction"}],
              "adapter": "lora", "lora_r": 4, "max_steps": 4, "micro_batch_size": 4, "learning_rate": 5e-2,
              "tokens": [TOOL], "special_tokens": {"pad_token": "<|newpad|>"}, "lora_dropout": 0.0,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "precision": "fp32"}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe))
    run_training(load_recipe(root / "recipe.yml"))
    return root


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def test_the_adapter_holds_the_new_rows_not_the_matrices(run, tiny_model_dir):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    out = run / "out"
    tensors = load_file(str(out / "adapter_model.safetensors"))
    rows = {k: v for k, v in tensors.items() if "lora_" not in k}
    assert rows and all(k.endswith("trainable_tokens_delta") for k in rows), sorted(rows)
    assert {k.split(".")[-3] for k in rows} == {"embed_tokens", "lm_head"}  # the tiny Llama's head is untied
    assert all(v.shape[0] == 2 for v in rows.values())  # <|tool|> and <|newpad|>: one row each
    assert not any(v.shape[0] >= vocab for v in tensors.values())
    embedding_bytes = vocab * AutoConfig.from_pretrained(tiny_model_dir).hidden_size * 4
    assert (out / "adapter_model.safetensors").stat().st_size < embedding_bytes  # smaller than ONE matrix
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["modules_to_save"] is None and set(config["trainable_token_indices"]) == {"embed_tokens", "lm_head"}


def test_the_new_tokens_rows_trained(run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "out")
    tool = tokenizer.convert_tokens_to_ids(TOOL)
    config = json.loads((run / "out" / "adapter_config.json").read_text())
    position = config["trainable_token_indices"]["embed_tokens"].index(tool)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base.resize_token_embeddings(len(tokenizer), mean_resizing=True)  # where the rows started
    tensors = load_file(str(run / "out" / "adapter_model.safetensors"))
    for module, start in (("embed_tokens", base.get_input_embeddings()), ("lm_head", base.get_output_embeddings())):
        [delta] = [v for k, v in tensors.items() if f"{module}.token_adapter" in k]
        assert (delta[position] - start.weight[tool]).abs().max() > 1e-3, module


def test_merge_and_gguf_export_carry_the_rows(run, capsys):
    from transformers import AutoModelForCausalLM

    from finetune.model.trained import load_adapter_model, locate

    adapter_model, tokenizer = load_adapter_model(locate(str(run / "recipe.yml")))
    ids = tokenizer(f"the cat {TOOL} sat <|newpad|>")["input_ids"]
    assert tokenizer.convert_tokens_to_ids(TOOL) in ids
    want = _logits(adapter_model, ids)
    assert cli_main(["merge", str(run / "recipe.yml")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(run / "out" / "merged")
    torch.testing.assert_close(_logits(merged, ids), want, rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert cli_main(["export", str(run / "recipe.yml"), "--gguf", "--quant", "f32"]) == 0
    gguf = Path(capsys.readouterr().out.strip())
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    torch.testing.assert_close(_logits(loaded, ids), want, rtol=1e-4, atol=1e-4)


def test_a_continued_adapter_with_tokens_new_to_it_is_refused_in_one_message(run, capsys):
    """Continuing an adapter keeps its settings, so tokens new to it would not train (and the adapter would save
    both whole resized matrices): one message, exit 2, naming the way out."""
    recipe = yaml.safe_load((run / "recipe.yml").read_text())
    recipe.update(base_model=str(run / "out"), tokens=["<|another|>"], output_dir="out2", max_steps=1)
    (run / "continue.yml").write_text(yaml.safe_dump(recipe))
    assert cli_main(["train", str(run / "continue.yml")]) == 2
    err = capsys.readouterr().err
    assert "<|another|>" in err and "finetune merge" in err and "Traceback" not in err
    assert not (run / "out2" / "adapter_model.safetensors").exists()


def test_new_rows_under_zero3_on_a_cpu_are_refused_before_peft_fails(tmp_path, tiny_model_dir, monkeypatch):
    """peft gathers trainable token rows from a ZeRO-3-sharded embedding on CUDA only (its
    `torch.cuda.current_device()`): on a CPU that was a raw AssertionError; now one ModelError naming the fix."""
    import transformers.integrations
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.errors import ModelError
    from finetune.model.tokens import fit_embeddings
    from finetune.recipe import recipe_from_dict

    recipe = recipe_from_dict({"base_model": str(tiny_model_dir), "adapter": "lora", "tokens": [TOOL],
                               "datasets": [{"path": "d.jsonl", "type": "instruction"}]}, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens([TOOL])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert fit_embeddings(model, tokenizer, recipe)  # without ZeRO-3: the rows to train
    monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="ZeRO-3 on a CPU"):
            fit_embeddings(model, tokenizer, recipe)
