"""The GPU fast paths, proven on CPU where they run there: the attention choice, flex_attention on packed
rows, the chunked LM-head loss, and regional compilation. Each must leave the numbers unchanged."""

from __future__ import annotations

import shutil
import types

import pytest
import torch

from finetune.model import attention
from finetune.model.attention import choose_attention
from finetune.model.device import Device
from finetune.model.isolation import check_packed_isolation
from finetune.model.regional_compile import compile_decoder_layers, decoder_layers, resolve_compile
from finetune.model.supervised_logits import attach
from finetune.data.collate import Collator
from finetune.model.varlen_attention import use_varlen_attention
from test_fast_paths import add_lora, batch_with_prompts, loss_and_grads, packed_batch, tiny


def recipe(**keys):
    return types.SimpleNamespace(**{"attn_implementation": "auto", "sample_packing": True, "compile": "auto", **keys})


CPU, H100 = Device(), Device("cuda", 0, (9, 0), "NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("cuda, flash, packed, expected", [
    (True, True, True, "flash_attention_2"),
    (True, False, True, "flex_attention"),
    (True, False, False, "sdpa"),
    (False, False, True, "sdpa"),
    (False, True, True, "sdpa"),  # flash-attn needs CUDA
])
def test_auto_attention_says_what_it_chose_and_why(monkeypatch, cuda, flash, packed, expected):
    real = attention.importlib.util.find_spec
    monkeypatch.setattr(attention.importlib.util, "find_spec",
                        lambda name: (object() if flash else None) if name == "flash_attn" else real(name))
    device = H100 if cuda else CPU
    choice, reason = choose_attention(recipe(sample_packing=packed), device, supports_flex=lambda recipe: (True, ""))
    assert choice == expected
    assert reason and ("CPU" in reason) == (not cuda)
    assert choose_attention(recipe(attn_implementation="eager"), device) == (
        "eager", "set in the recipe (attn_implementation)")


def test_auto_asks_the_model_class_before_choosing_flex(tiny_model_dir, tmp_path, monkeypatch):
    """`auto` picks flex_attention on CUDA only for a class that has a flex path, decided from the config
    before any model loads, so the attention the run logs and records is the one it trains with."""
    from transformers import GPT2Config

    monkeypatch.setattr(attention, "_flex_available", lambda: True)
    real = attention.importlib.util.find_spec  # as on a GPU machine without flash-attn
    monkeypatch.setattr(attention.importlib.util, "find_spec", lambda name: None if name == "flash_attn" else real(name))
    llama = recipe(base_model=str(tiny_model_dir), cache_dir=str(tmp_path / "cache"), trust_remote_code=False)
    assert choose_attention(llama, H100)[0] == "flex_attention"
    GPT2Config(n_layer=1, n_head=2, n_embd=8).save_pretrained(tmp_path / "gpt2")
    gpt2 = recipe(base_model=str(tmp_path / "gpt2"), cache_dir=str(tmp_path / "cache"), trust_remote_code=False)
    choice, reason = choose_attention(gpt2, H100)
    assert choice == "sdpa" and "GPT2LMHeadModel has no flex_attention path" in reason
    missing = recipe(base_model=str(tmp_path / "nowhere"), cache_dir=str(tmp_path / "cache"), trust_remote_code=False)
    choice, reason = choose_attention(missing, H100)
    assert choice == "sdpa" and "could not be determined" in reason


def test_compile_auto_is_on_for_cuda_only():
    assert resolve_compile(recipe(), H100)[0] is True
    assert resolve_compile(recipe(), CPU)[0] is False
    assert resolve_compile(recipe(compile=True), CPU) == (True, "set in the recipe (compile)")
    assert resolve_compile(recipe(compile=False), H100)[0] is False


def flex_model(tiny_model_dir):
    model = tiny(tiny_model_dir)
    model.set_attn_implementation("flex_attention")
    return model


def test_flex_attention_matches_per_example_attention_on_packed_rows(tiny_model_dir):
    """Forward only on CPU: flex_attention has no backward there (torch 2.13); the GPU test below does grads."""
    per_example, flex = tiny(tiny_model_dir), flex_model(tiny_model_dir)
    assert use_varlen_attention(per_example)
    # 2 rows, many examples each, the second padded with positions of its own. Rows are padded to a multiple
    # of 64 because torch 2.13's CPU flex kernel returns NaN or wrong values for some other widths (seen at
    # 40 and 120 here; never on CUDA, which is where `auto` chooses flex)
    batch = packed_batch(collator=Collator(0, pad_to_multiple_of=64))
    with torch.no_grad():
        a = per_example(**batch)
        b = flex(**batch)
    assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-5)
    assert (a.logits - b.logits).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch 2.13's CPU flex kernel fails to compile for the guard's short rows (inductor "
                           "CppCompileError); `auto` uses flex on CUDA only")
def test_packing_guard_proves_flex_attention_isolated(tiny_model_dir):
    flex = flex_model(tiny_model_dir).cuda()
    assert check_packed_isolation(flex, Collator(0), "flex_attention") < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention has no backward on CPU (torch 2.13)")
def test_flex_attention_gives_the_same_gradients_on_cuda(tiny_model_dir):
    plain, flex = tiny(tiny_model_dir).cuda(), flex_model(tiny_model_dir).cuda()
    batch = {k: v.cuda() for k, v in packed_batch().items()}
    loss_a, grads_a = loss_and_grads(plain, batch)
    loss_b, grads_b = loss_and_grads(flex, batch)
    assert loss_b == pytest.approx(loss_a, rel=1e-4)
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-4


@pytest.mark.parametrize("num_items", [47, None])  # the Trainer's token count, or the model's own mean
def test_chunked_head_and_loss_give_the_same_loss_and_gradients(tiny_model_dir, num_items):
    plain, fast = tiny(tiny_model_dir), tiny(tiny_model_dir)  # full fine-tune: lm_head gets gradients too
    hooks = attach(fast)
    assert hooks is not None
    hooks.chunk_rows = 5  # 47 supervised rows -> 10 chunks
    rows = []
    fast.lm_head.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    batch = batch_with_prompts(plain.config.vocab_size)

    def run(model):
        model.train()
        model.zero_grad()
        extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
        loss = model(**batch, **extra).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_a, grads_a = run(plain)
    loss_b, grads_b = run(fast)
    # the head sees no row in the model's forward, then 10 chunks of <= 5 rows, each recomputed in backward
    assert rows[0] == 0 and sum(rows[1:11]) == 47 and max(rows[1:]) == 5 and len(rows) == 21
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert grads_a.keys() == grads_b.keys() and "lm_head.weight" in grads_a
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-6


def test_attach_chooses_chunks_from_the_vocabulary_size(tiny_model_dir):
    model = tiny(tiny_model_dir)
    hooks = attach(model)
    assert hooks.chunk_rows == 2**26 // model.config.vocab_size  # 256 MiB of fp32 logits a chunk


COMPILER = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(COMPILER is None, reason="torch.compile's inductor needs a C compiler (cc/gcc), none here")
def test_compiled_decoder_layers_match_eager_with_lora_and_checkpointing(tiny_model_dir):
    eager, compiled = tiny(tiny_model_dir, lora=True), tiny(tiny_model_dir, lora=True)
    for model in (eager, compiled):
        for module in model.modules():  # compiled dropout draws from inductor's own RNG: other masks
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert compile_decoder_layers(compiled) == 2 == len(decoder_layers(eager))
    batch = batch_with_prompts(eager.config.vocab_size)
    loss_a, grads_a = loss_and_grads(eager, batch)
    loss_b, grads_b = loss_and_grads(compiled, batch)
    # Tolerance: inductor fuses and reorders fp32 reductions (~1e-7 relative each); 1e-5 leaves room for
    # two layers, forward and backward, and would still catch a wrong graph (differences of order 1e-1)
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in k for k in grads_a)
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-5
    assert set(compiled.state_dict()) == set(eager.state_dict())  # names unchanged: adapters save as before


@pytest.mark.skipif(COMPILER is None, reason="torch.compile's inductor needs a C compiler (cc/gcc), none here")
@pytest.mark.skipif(torch.cuda.is_available(), reason="bitsandbytes' CPU 4-bit path; on CUDA, compile over QLoRA "
                    "runs in benchmarks/bench_gpu.py --scenario 7b-qlora (compile: auto is on there)")
def test_compiled_decoder_layers_match_eager_with_qlora_and_mlp_checkpointing(tiny_model_dir):
    """Regional compilation over a 4-bit NF4 base (bitsandbytes' Linear4bit inside the compiled layer) with
    `gradient_checkpointing: mlp` (a checkpointed MLP forward inside it): the same loss and adapter grads."""
    from peft import prepare_model_for_kbit_training

    from finetune.model import get_quantization_config
    from finetune.model.checkpointing import checkpoint_mlps

    def qlora():
        quantization = get_quantization_config(
            types.SimpleNamespace(adapter="qlora", load_in_4bit=False, load_in_8bit=False), torch.float32)
        model = prepare_model_for_kbit_training(tiny(tiny_model_dir, quantization_config=quantization),
                                                use_gradient_checkpointing=False)
        checkpoint_mlps(model)
        return add_lora(model, dropout=0.0)

    from torch._dynamo.utils import counters

    eager, compiled = qlora(), qlora()
    assert type(eager.get_base_model().model.layers[0].mlp.up_proj.base_layer).__name__ == "Linear4bit"
    assert compile_decoder_layers(compiled) == 2
    batch = batch_with_prompts(eager.config.vocab_size)
    loss_a, grads_a = loss_and_grads(eager, batch)
    counters.clear()
    loss_b, grads_b = loss_and_grads(compiled, batch)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really compiled the layers, not eager in disguise
    assert loss_b == pytest.approx(loss_a, rel=1e-5)  # the tolerance of the LoRA test above, same reasons
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in k for k in grads_a)
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="flex_attention trains on CUDA")
def test_flex_attention_on_cpu_is_refused_before_anything_is_written(make_recipe, tmp_path, capsys):
    from finetune.cli import main as cli_main

    recipe = make_recipe("chat", n=8, adapter="lora", attn_implementation="flex_attention", max_steps=1)
    assert cli_main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "attn_implementation: flex_attention" in err and "no backward pass" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_flash_attention_2_where_it_cannot_run_is_refused_naming_the_key_and_why():
    # set on a CPU machine, it validated and then stopped in transformers with the library's own words
    from finetune.errors import ModelError
    from finetune.model.attention import check_trainable
    from finetune.model.device import Device

    recipe = type("R", (), {"attn_implementation": "flash_attention_2"})()
    with pytest.raises(ModelError, match=r"`attn_implementation: flash_attention_2` needs a CUDA GPU.*this "
                                         r"machine has none.*attn_implementation: auto"):
        check_trainable(recipe, Device("cpu"))
    with pytest.raises(ModelError, match=r"compute capability 8\.0 or newer.*Tesla T4 \(compute capability 7\.5\)"):
        check_trainable(recipe, Device("cuda", 0, (7, 5), "Tesla T4"))
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ModelError, match=r"the flash-attn package is not installed.*pip install flash-attn"):
            check_trainable(recipe, Device("cuda", 0, (9, 0), "NVIDIA H100"))
    recipe.attn_implementation = "sdpa"
    check_trainable(recipe, Device("cpu"))


@pytest.mark.skipif(COMPILER is None, reason="torch.compile's inductor needs a C compiler (cc/gcc), none here")
def test_a_run_with_compile_true_trains_saves_and_reports_the_compile_time_once(make_recipe, tmp_path, capfd):
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    # one micro batch holds all 4 examples, so every step has the same shape: inductor compiles the layer's
    # forward and backward once (a new shape would add a second, dynamic-shape compile: minutes on this CPU)
    summary = run_training(load_recipe(make_recipe("chat", n=4, adapter="lora", lora_r=4, compile=True,
                                                   micro_batch_size=4, max_steps=3, learning_rate=5e-3)))
    err = capfd.readouterr().err
    assert err.count("compile: 2 decoder layers compiled in") == 1
    assert summary["steps"] == 3 and summary["final_train_loss"] < summary["first_train_loss"]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
