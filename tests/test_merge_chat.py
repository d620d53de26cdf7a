"""Merge, chat and generate on adapters trained from the tiny model (LoRA, and QLoRA with an added token)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from finetune.cli import main as cli_main
from finetune.model.trained import load_adapter_model, locate
from finetune.recipe import load_recipe
from finetune.train import run_training

PROMPT = "the cat sat on the mat and the dog runs"


def _logits(model, tokenizer):
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]]).to(model.device)  # a 4-bit base sits on the GPU there
    with torch.no_grad():
        return model(input_ids=ids).logits.float().cpu()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """Two runs: LoRA, and QLoRA that adds a token (so embeddings / lm_head are trained in full too)."""
    import yaml

    from conftest import make_records, write_jsonl

    runs = {}
    for adapter, extra in (("lora", {}), ("qlora", {"tokens": ["<|tool|>"]})):
        root = tmp_path_factory.mktemp(adapter)
        write_jsonl(root / "chat.jsonl", make_records("chat", 8))
        recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
                  "adapter": adapter, "lora_r": 4, "max_steps": 3, "micro_batch_size": 4, "learning_rate": 2e-2,
                  "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "logging_steps": 1, **extra}
        (root / "recipe.yml").write_text(yaml.safe_dump(recipe))
        run_training(load_recipe(root / "recipe.yml"))
        runs[adapter] = root / "recipe.yml"
    return runs


@pytest.fixture(scope="module")
def merged(trained):
    """`finetune merge` on both runs, once: {adapter: the merged model's folder}. Every test that reads a
    merged model asks for it, so none depends on another test having run first."""
    folders = {}
    for adapter, recipe_path in trained.items():
        assert cli_main(["merge", str(recipe_path)]) == 0
        folders[adapter] = recipe_path.parent / "out" / "merged"
    return folders


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_merged_model_reproduces_the_adapter_logits(trained, merged, tiny_model_dir, adapter):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe_path = trained[adapter]
    merged_dir = merged[adapter]
    config = json.loads((merged_dir / "config.json").read_text())
    assert "quantization_config" not in config  # QLoRA merges into an unquantized base
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert all(p.dtype == torch.float32 for p in merged.parameters())
    assert not any("lora" in n for n, _ in merged.named_parameters())
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)

    adapter_model, _ = load_adapter_model(locate(str(recipe_path)))  # adapter on the fp32 base
    merged_logits, adapter_logits = _logits(merged, tokenizer), _logits(adapter_model, tokenizer)
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-4, atol=1e-4)
    # the adapter did change the model, so the match above is not vacuous
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if adapter == "qlora":
        assert merged.get_input_embeddings().num_embeddings == len(tokenizer) == base.config.vocab_size + 1
        base.resize_token_embeddings(len(tokenizer))
    assert (merged_logits - _logits(base, tokenizer)).abs().max() > 1e-2


def test_qlora_adapter_on_its_4bit_base_stays_close_to_the_merged_model(trained, merged):
    from transformers import AutoModelForCausalLM

    from finetune.model.inference import load_for_inference

    quantized, tokenizer = load_for_inference(str(trained["qlora"]))  # 4-bit base, as trained
    assert type(quantized.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    merged_model = AutoModelForCausalLM.from_pretrained(merged["qlora"]).to(quantized.device)
    q, m = _logits(quantized, tokenizer), _logits(merged_model, tokenizer)
    # NF4 rounding error only: same next-token choice almost everywhere, logits within a small margin
    assert (q.argmax(-1) == m.argmax(-1)).float().mean() >= 0.8
    assert (q - m).abs().max() < 0.5 * m.abs().max()


def test_merge_without_an_adapter_says_where_it_looked(make_recipe, capsys):
    recipe = make_recipe("completion", n=4, adapter="lora")
    assert cli_main(["merge", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "no trained adapter or model" in err and "adapter_config.json" in err and "out" in err
    assert "Traceback" not in err


def test_chat_reads_stdin_applies_the_template_and_resets(trained):
    recipe = str(trained["lora"])
    lines = "what is the river\n/reset\nwhat is the river\nhello world\n"
    proc = subprocess.run([sys.executable, "-m", "finetune.cli", "chat", recipe, "--max-new-tokens", "6"],
                          input=lines, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    replies = proc.stdout.splitlines()
    assert len(replies) == 3 and replies[0] == replies[1]  # greedy, and /reset forgot the first turn
    gen = subprocess.run([sys.executable, "-m", "finetune.cli", "generate", recipe, "--prompt", "what is the river",
                          "--max-new-tokens", "6"], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0 and gen.stdout.strip() == replies[0]


def test_prompt_is_the_chat_template_with_a_generation_prompt(trained):
    from finetune.model.inference import encode_prompt, load_for_inference

    _, tokenizer = load_for_inference(str(trained["lora"]))
    messages = [{"role": "user", "content": "hello"}]
    text = tokenizer.decode(encode_prompt(tokenizer, messages, use_template=True))
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(encode_prompt(tokenizer, messages, use_template=False)) == "hello"


def test_a_run_on_instruction_records_is_served_the_alpaca_prompt_it_trained_with(make_recipe, capsys, trained):
    """Issue 25.4: after training on instruction records, generate, chat and the export's Modelfile rendered the
    tokenizer's chat template, a format the model never saw, without a word."""
    from finetune.contract import alpaca_prompt
    from finetune.model.inference import encode_prompt, load_for_inference, served_format_of
    from finetune.model.prompt_format import served_format
    from finetune.export.ollama import modelfile

    recipe = make_recipe("instruction", n=8, adapter="lora", lora_r=2, max_steps=1, micro_batch_size=4)
    run_training(load_recipe(recipe))
    assert served_format_of(str(recipe))[0] == "alpaca"
    assert served_format_of(str(trained["lora"]))[0] == "chat"  # a run on chat records keeps its template
    capsys.readouterr()
    assert cli_main(["generate", str(recipe), "--prompt", "Name a river.", "--max-new-tokens", "3",
                     "--system", "Be brief."]) == 0
    err = capsys.readouterr().err
    assert "prompt format: alpaca (the run trained on instruction records" in err and "--system is not used" in err
    # the prompt's tokens are exactly the ones training put before an instruction's response
    _, tokenizer = load_for_inference(str(recipe))
    ids = encode_prompt(tokenizer, [{"role": "user", "content": "Name a river."}], True, "alpaca")
    assert ids == tokenizer(alpaca_prompt({"instruction": "Name a river."}), add_special_tokens=True)["input_ids"]
    # a merged model has no run.json: the merge records the format beside it
    assert cli_main(["merge", str(recipe)]) == 0
    assert served_format(recipe.parent / "out" / "merged")[0] == "alpaca"
    text = modelfile("m.gguf", tokenizer, 4096, "alpaca")
    assert 'TEMPLATE """Below is an instruction' in text
    assert "### Instruction:\n{{ .Prompt }}\n\n### Response:\n" in text
    assert "<|im_start|>" not in text
