"""FLOPs per token (frozen weights: 4x, trained: 6x), GPU peaks, and the throughput callback on CPU."""

from __future__ import annotations

import pytest

from finetune.plan.flops import flops_per_token, mfu
from finetune.plan.gpus import find_gpu, match_gpu
from finetune.plan.shape import ModelShape

LLAMA2_7B = ModelShape(num_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                       num_kv_heads=32, vocab_size=32000, total_params=6_738_415_616, embedding_params=131_072_000,
                       quantizable_params=6_476_005_376)


def test_full_is_6n_plus_attention_and_lora_charges_frozen_weights_4n():
    n = LLAMA2_7B.matmul_params
    attention = 12 * 32 * 4096 * 2048
    assert flops_per_token(LLAMA2_7B, 2048) == 6 * n + attention
    lora = 19_988_480
    assert flops_per_token(LLAMA2_7B, 2048, lora_params=lora) == 4 * n + 6 * lora + attention
    assert mfu(400e12, 989.4e12) == pytest.approx(0.404, abs=1e-3)


def test_gpu_table_is_dense_and_knows_device_names():
    assert find_gpu("h100").peak_flops("bf16") == pytest.approx(989.4e12)
    assert match_gpu("NVIDIA A100-SXM4-40GB").name == "a100-40gb"
    assert match_gpu("Tesla T4").peak_flops("bf16") is None  # Turing has no bf16
    assert match_gpu("Some Future GPU") is None
    for name in ("h100", "h200", "a100", "l40s", "rtx-4090", "rtx-3090", "t4"):
        assert find_gpu(name).peak_flops("fp16")


@pytest.mark.parametrize("peak", [None, 1.0])
def test_throughput_callback_logs_tokens_and_tflops_on_cpu(tmp_path, peak):
    import torch
    from transformers import DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from finetune.train.callbacks.throughput import ThroughputCallback

    class Tok:  # what DataCollatorForSeq2Seq needs from a tokenizer
        pad_token_id, padding_side, model_input_names = 0, "right", ["input_ids", "attention_mask"]

        def pad(self, features, **kwargs):
            width = max(len(f["input_ids"]) for f in features)
            ids = [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]
            mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
            out = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
            if "labels" in features[0]:
                out["labels"] = torch.tensor([f["labels"] for f in features])
            return out

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    # 8 examples of 6 + i tokens; only the last 2 tokens are supervised
    data = [{"input_ids": list(range(1, 7 + i)), "labels": [-100] * (4 + i) + [5, 6]} for i in range(8)]
    throughput = ThroughputCallback(peak_tflops=peak)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True)
    collator = throughput.wrap(DataCollatorForSeq2Seq(Tok(), padding=True, label_pad_token_id=-100))
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[throughput])
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2
    for entry in logs:
        assert entry["tokens_per_second_per_device"] > 0 and entry["model_tflops_per_device"] > 0
        # 2 of every example's tokens are supervised: a quarter or less of the real tokens
        assert 0 < entry["supervised_tokens_per_second"] < entry["tokens_per_second"] / 3
        assert ("mfu" in entry) == (peak is not None)
        if peak:
            assert entry["mfu"] == pytest.approx(entry["model_tflops_per_device"] / peak, rel=1e-2, abs=1e-4)


def test_no_gpu_peak_when_training_on_the_cpu_of_a_gpu_machine(monkeypatch):
    """`use_cpu` on a GPU machine: the MFU would divide CPU FLOP/s by the GPU's peak."""
    import types

    import torch

    from finetune.train.callbacks.throughput import _detect_peak_tflops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    args = types.SimpleNamespace(bf16=True, fp16=False, tf32=False, device=torch.device("cpu"))
    assert _detect_peak_tflops(args) is None
    args.device = torch.device("cuda", 0)
    assert _detect_peak_tflops(args) == pytest.approx(989.4)


def test_model_shape_counts_every_weight_of_a_4bit_base(tiny_model_dir):
    """The throughput callback measures the loaded model: a 4-bit base packs 2 weights a byte, and its FLOPs
    (hence MFU) must count the weights it stands for, not the bytes it stores."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from finetune.plan.model_size import model_shape

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    nf4 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, quantization_config=(
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.float32)))
    if not torch.cuda.is_available():
        assert type(nf4.model.layers[0].mlp.up_proj.weight).__name__ == "Params4bit"
    assert model_shape(nf4) == model_shape(plain)
    assert flops_per_token(model_shape(nf4), 64, 1000) == flops_per_token(model_shape(plain), 64, 1000)
