"""The model builder: full / LoRA / QLoRA by one key, 8-bit, bitsandbytes optimizers (paged -> unpaged on CPU),
gradient checkpointing modes, attention choice, new tokens."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from safetensors.torch import load_file

from conftest import resolved_training_arguments
from finetune.cli import main as cli_main
from finetune.errors import ModelError
from finetune.model import build_model, get_quantization_config, resolve_attn_implementation
from finetune.model.bnb import resolve_optimizer
from finetune.model.checkpointing import CheckpointedForward, checkpoint_mlps
from finetune.recipe import load_recipe
from finetune.train.run import run_training

PAGED_NOTICE = "paging needs CUDA"


@pytest.mark.parametrize("adapter, optimizer", [
    ("none", "adamw_torch"),
    ("lora", "adamw_bnb_8bit"),
    ("qlora", "paged_adamw_8bit"),
])
def test_one_key_switches_full_lora_qlora_and_each_trains(make_recipe, tmp_path, capfd, adapter, optimizer):
    recipe = load_recipe(make_recipe("chat", n=12, adapter=adapter, optimizer=optimizer, lora_r=4, max_steps=3,
                                     learning_rate=5e-3))
    summary = run_training(recipe)
    err = capfd.readouterr().err
    assert summary["steps"] == 3 and summary["final_train_loss"] < summary["first_train_loss"]
    out = tmp_path / "out"
    if adapter == "none":
        assert summary["trainable_parameters"] == summary["total_parameters"]
        assert (out / "model.safetensors").is_file()
        return
    lora_b = [v for k, v in load_file(str(out / "adapter_model.safetensors")).items() if "lora_B" in k]
    assert len(lora_b) == 2 * 7 and all(v.abs().sum() > 0 for v in lora_b)  # 7 linears x 2 layers, all trained
    # paged on CPU: one clear notice of ours, and bitsandbytes' own per-step fallback warning never fires
    paged_on_cpu = optimizer.startswith("paged") and not torch.cuda.is_available()  # on CUDA paging just works
    assert err.count(PAGED_NOTICE) == (1 if paged_on_cpu else 0)
    assert "Paged optimizers are not supported on CPU" not in err
    if adapter == "qlora":
        assert "4-bit NF4, double quantization" in err


def test_qlora_base_is_nf4_double_quant_with_lora_on_top(make_recipe):
    recipe = load_recipe(make_recipe("completion", n=4, adapter="qlora", lora_r=4, precision="fp32"))
    model, _ = build_model(recipe)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    base = q_proj.base_layer
    assert type(base).__name__ == "Linear4bit"
    assert base.weight.quant_type == "nf4" and base.weight.compress_statistics  # compress_statistics = double quant
    assert base.compute_dtype == torch.float32 and not base.weight.requires_grad
    assert q_proj.lora_A["default"].weight.requires_grad
    # a no-grad pass in eval mode (DPO's reference, GRPO's generation, an eval) leaves the next backward the same:
    # bitsandbytes repacked the 4-bit weights there on a CPU with AVX512-BF16, and its backward read them wrong
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # nonzero: gradients reach the first layer's adapters through the frozen 4-bit layers
            param.data.normal_(0, 0.05)
    ids = torch.randint(0, 500, (2, 16))

    def grads():
        model.train()
        model.zero_grad()
        torch.manual_seed(1)  # the same LoRA dropout masks
        model(input_ids=ids, labels=ids).loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    before = grads()
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    assert torch.allclose(grads(), before, rtol=1e-4, atol=1e-7)


def test_8bit_base_trains_lora_on_cpu(make_recipe):
    recipe = load_recipe(make_recipe("completion", n=4, adapter="lora", load_in_8bit=True, lora_r=4))
    model, tokenizer = build_model(recipe)
    assert type(model.base_model.model.model.layers[0].mlp.up_proj.base_layer).__name__ == "Linear8bitLt"
    ids = torch.tensor([tokenizer("the cat sat on the mat")["input_ids"]]).to(model.device)  # CUDA base on a GPU
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]  # B gets gradient first (it starts at 0)
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name, cuda, expected, notice", [
    ("paged_adamw_8bit", False, "adamw_bnb_8bit", True),
    ("paged_adamw_32bit", False, "adamw_torch", True),
    ("paged_adamw_8bit", True, "paged_adamw_8bit", False),
    ("adamw_bnb_8bit", False, "adamw_bnb_8bit", False),
    ("adamw_torch", False, "adamw_torch", False),
])
def test_paged_optimizers_fall_back_without_cuda(name, cuda, expected, notice):
    optim, message = resolve_optimizer(name, cuda)
    assert optim == expected and (message is not None) == notice
    if notice:
        assert name in message and expected in message


def _without_bitsandbytes(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a))


def test_qlora_without_bitsandbytes_names_the_install_command(make_recipe, tmp_path, capsys, monkeypatch):
    recipe_path = make_recipe("completion", n=4, adapter="qlora")
    _without_bitsandbytes(monkeypatch)
    with pytest.raises(ModelError, match=r"pip install 'bitsandbytes"):
        get_quantization_config(load_recipe(recipe_path), torch.float32)
    with pytest.raises(ModelError, match=r"`optimizer: paged_adamw_8bit` needs bitsandbytes"):
        resolve_optimizer("paged_adamw_8bit", cuda=True)
    assert cli_main(["train", str(recipe_path)]) == 2
    err = capsys.readouterr().err
    assert "needs bitsandbytes" in err and "pip install" in err and "Traceback" not in err


@pytest.mark.parametrize("written, mode, trainer_full", [
    (True, "full", True), (False, "off", False), ("mlp", "mlp", False), ("full", "full", True)])
def test_gradient_checkpointing_modes_and_axolotl_booleans(make_recipe, written, mode, trainer_full):
    recipe = load_recipe(make_recipe("completion", n=4, gradient_checkpointing=written))
    assert recipe.gradient_checkpointing == mode
    args = resolved_training_arguments(recipe)
    assert args.activation_checkpointing is trainer_full
    if trainer_full:
        assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


def _saved_bytes_and_grads(model, ids):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(saved), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_mlp_checkpointing_saves_memory_and_keeps_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()
    ids = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(0))
    plain_bytes, plain_grads = _saved_bytes_and_grads(model, ids)
    assert checkpoint_mlps(model) == 2 and checkpoint_mlps(model) == 2  # idempotent
    assert isinstance(model.model.layers[0].mlp.forward, CheckpointedForward)
    ckpt_bytes, ckpt_grads = _saved_bytes_and_grads(model, ids)
    # each gated MLP keeps gate, up, act(gate)*up (3 x 128 wide) + its input; only the input remains
    assert ckpt_bytes < 0.8 * plain_bytes, (ckpt_bytes, plain_bytes)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-6)
    # parameter names are unchanged: state dicts stay loadable by plain transformers
    assert set(model.state_dict()) == set(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())


def test_attention_auto_picks_flash_only_when_importable_on_cuda(make_recipe, monkeypatch):
    recipe = load_recipe(make_recipe("completion", n=4))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_attn_implementation(recipe) == "sdpa"  # no CUDA
    real = importlib.util.find_spec
    capability = [(9, 0)]  # the device's compute capability, as torch would report it (faked: no GPU here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability[0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "a faked GPU")
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "flash_attn" else real(n, *a))
    assert resolve_attn_implementation(recipe) == "flash_attention_2"
    capability[0] = (7, 5)  # a T4: flash-attn 2 does not run below 8.0, installed or not
    assert resolve_attn_implementation(recipe) == "sdpa"
    capability[0] = (9, 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real(n, *a))
    assert resolve_attn_implementation(recipe) == "sdpa"
    recipe.attn_implementation = "eager"
    assert resolve_attn_implementation(recipe) == "eager"


def test_new_tokens_resize_embeddings_and_train_them_with_an_adapter(make_recipe, tiny_tokenizer, capfd):
    from finetune.data.cache import tokenizer_fingerprint
    from finetune.model.loader import load_tokenizer

    base_rows = len(tiny_tokenizer)
    # <pad> exists already; <|tool|> and <|sep|> are new
    recipe = load_recipe(make_recipe("completion", n=4, adapter="lora", lora_r=4, tokens=["<|tool|>"],
                                     special_tokens={"pad_token": "<pad>", "sep_token": "<|sep|>"}))
    model, tokenizer = build_model(recipe)
    assert len(tokenizer) == base_rows + 2 and tokenizer.sep_token == "<|sep|>"
    assert model.get_input_embeddings().token_adapter.base_layer.num_embeddings == base_rows + 2
    # only the two new tokens' rows train (peft's trainable tokens), not whole copies of both matrices
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    rows = {n: p for n, p in trainable.items() if "token_adapter" in n}
    assert {n.split(".token_adapter")[0].rsplit(".", 1)[-1] for n in rows} == {"embed_tokens", "lm_head"}
    assert all(p.shape[0] == 2 for p in rows.values()) and not any("modules_to_save" in n for n in trainable)
    assert model.peft_config["default"].trainable_token_indices["embed_tokens"] == \
        sorted(tokenizer.convert_tokens_to_ids(["<|tool|>", "<|sep|>"]))
    err = capfd.readouterr().err
    assert "embeddings resized from 512 to 514" in err and "training their rows of embed_tokens and lm_head" in err
    # the data cache key covers the added tokens
    plain = load_recipe(make_recipe("completion", n=4))
    assert tokenizer_fingerprint(load_tokenizer(recipe)) != tokenizer_fingerprint(load_tokenizer(plain))


def test_known_tokens_need_no_resize_and_full_finetune_needs_no_modules_to_save(make_recipe, tiny_tokenizer, capfd):
    known = load_recipe(make_recipe("completion", n=4, adapter="lora", special_tokens={"pad_token": "<pad>"}))
    model, _ = build_model(known)
    assert model.get_input_embeddings().num_embeddings == len(tiny_tokenizer)
    assert not any("modules_to_save" in n for n, _ in model.named_parameters())
    full = load_recipe(make_recipe("completion", n=4, adapter="none", tokens=["<|tool|>"]))
    model, _ = build_model(full)
    assert model.get_input_embeddings().num_embeddings == len(tiny_tokenizer) + 1
    assert "training embed_tokens" not in capfd.readouterr().err
