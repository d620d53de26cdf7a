"""plan/memory.py: textbook cases, the ZeRO paper's example, QLoRA constants, and bytes actually allocated."""

from __future__ import annotations

import pytest

from finetune.errors import FinetuneError
from finetune.plan.budget import PlanInputs, plan_memory, training_setup, verdict
from finetune.plan.memory import (
    GB,
    GIB,
    TrainingSetup,
    model_state_memory,
    optimizer_state_bytes_per_param,
    quantized_bytes_per_param,
)
from finetune.plan.shape import Trainable

SEVEN_B = 7_000_000_000


def _per_param(setup: TrainingSetup) -> float:
    return sum(model_state_memory(setup).values()) / setup.trainable.trainable_params


def test_fp32_adamw_is_4_plus_4_plus_8_bytes_per_param():
    setup = TrainingSetup(trainable=Trainable(SEVEN_B), trainable_bytes=4)
    states = model_state_memory(setup)
    assert states["weights"] / SEVEN_B == 4 and states["gradients"] / SEVEN_B == 4
    assert states["optimizer states"] / SEVEN_B == 8 and states["master weights"] == 0
    assert sum(states.values()) / GB == 112  # not 140: the "3x weights" rule already holds the master copy


def test_mixed_precision_is_2_plus_2_plus_12_bytes_per_param():
    setup = TrainingSetup(trainable=Trainable(SEVEN_B), trainable_bytes=2, master_weights=True)
    states = model_state_memory(setup)
    assert (states["weights"], states["gradients"]) == (2 * SEVEN_B, 2 * SEVEN_B)
    assert (states["master weights"] + states["optimizer states"]) / SEVEN_B == 12
    assert _per_param(setup) == 16


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example_7_5b_on_64_gpus(stage, expected_gb):
    params = 7_500_000_000
    setup = TrainingSetup(trainable=Trainable(params), trainable_bytes=2, master_weights=True,
                          zero_stage=stage, num_gpus=64)
    assert round(sum(model_state_memory(setup).values()) / GB, 1) == expected_gb


def test_qlora_double_quantization_saves_0_373_bits_per_param():
    plain, double = quantized_bytes_per_param(4, double_quant=False), quantized_bytes_per_param(4, double_quant=True)
    assert plain * 8 == pytest.approx(4.5)  # 4 bits + fp32 absmax per 64 = 0.5 bits
    assert double * 8 == pytest.approx(4 + 0.127, abs=1e-3)  # QLoRA paper: 0.5 -> 0.127 bits per param


def test_optimizer_state_sizes():
    assert optimizer_state_bytes_per_param("adamw_torch", 4) == 8
    assert optimizer_state_bytes_per_param("adamw_torch", 2) == 4  # m and v follow a bf16 parameter
    assert optimizer_state_bytes_per_param("adamw_8bit", 4) == pytest.approx(2.03, abs=0.01)
    assert optimizer_state_bytes_per_param("paged_adamw_8bit", 4) == optimizer_state_bytes_per_param("adamw_8bit", 4)
    assert optimizer_state_bytes_per_param("sgd", 4) == 0
    with pytest.raises(FinetuneError, match="unknown optimizer"):
        optimizer_state_bytes_per_param("lion", 4)


# --- predicted bytes == bytes PyTorch allocates, on CPU ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       tie_word_embeddings=False)


def _one_adamw_step(model):
    import torch

    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = {id(p): p for p in model.parameters()}.values()
    states = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {
        "weights": sum(p.nbytes for p in params),
        "gradients": sum(p.grad.nbytes for p in params if p.grad is not None),
        "optimizer states": sum(t.nbytes for t in states),
    }


def _predicted(inputs: PlanInputs) -> dict[str, float]:
    states = model_state_memory(training_setup(inputs))
    return {k: states[k] for k in ("weights", "gradients", "optimizer states")}


def test_full_finetune_state_bytes_equal_allocated(tiny_config):
    import torch
    from transformers import LlamaForCausalLM

    from finetune.plan.model_size import count_model

    shape, full, lora = count_model(tiny_config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config)  # fp32, as finetune loads a full fine-tune
    assert _one_adamw_step(model) == _predicted(PlanInputs(shape, full, lora, adapter="none", precision="bf16"))


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_state_bytes_equal_allocated(tiny_config, targets):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from finetune.plan.model_size import count_model

    shape, full, lora = count_model(tiny_config, lora_r=4, target_modules=targets)
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_config).to(torch.bfloat16)  # finetune holds a LoRA base in the compute dtype
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM"))
    actual = _one_adamw_step(model)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == lora.trainable_params
    assert actual == _predicted(PlanInputs(shape, full, lora, adapter="lora", precision="bf16"))


def test_verdict_names_concrete_fixes_with_their_sizes():
    from transformers import LlamaConfig

    from finetune.plan.model_size import count_model

    llama7b = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32)
    shape, full, lora = count_model(llama7b, lora_r=16)
    inputs = PlanInputs(shape, full, lora, adapter="none", precision="bf16", seq_len=2048, micro_batch_size=4)
    result = verdict(inputs, 24 * GIB)
    assert not result.fits and "DOES NOT FIT" in result.headline()
    qlora = [s for s in result.suggestions if s.startswith("adapter: qlora")]
    assert qlora and "(fits)" not in qlora[0]  # micro batch 4 at 2048 tokens is too much even for QLoRA
    small = PlanInputs(shape, full, lora, adapter="qlora", precision="bf16", seq_len=2048, micro_batch_size=1,
                       gradient_checkpointing=True)
    assert verdict(small, 24 * GIB).fits
    assert plan_memory(small).total < 10 * GIB  # 7B QLoRA: ~3.9 GB of 4-bit weights + small activations
