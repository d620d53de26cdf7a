"""Honest throughput numbers (issue 13.5): attention charged per packed example, real tokens only, a steady
state that leaves the warm-up out, peak memory and the plan's prediction in run.json."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from finetune.plan.flops import flops_per_token, training_flops
from finetune.plan.shape import ModelShape
from finetune.train.callbacks import throughput as tp
from finetune.train.callbacks.throughput import ThroughputCallback, segment_lengths

SHAPE = ModelShape(num_layers=22, hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_kv_heads=4,
                   vocab_size=32000, total_params=1_100_048_384, embedding_params=65_536_000,
                   quantizable_params=968_884_224)


def test_attention_is_charged_per_packed_example_not_per_row():
    lengths = [100, 100, 200]  # three examples packed into one 400-token row
    assert segment_lengths([*range(100), *range(100), *range(200)]) == lengths
    packed = training_flops(SHAPE, 400, sum(n * n for n in lengths))
    attention = 12 * 22 * 2048 * (100**2 + 100**2 + 200**2)
    assert packed == 6 * SHAPE.matmul_params * 400 + attention
    whole_row = flops_per_token(SHAPE, 400) * 400  # what the callback charged before: 400^2 score pairs
    assert whole_row - packed == pytest.approx(12 * 22 * 2048 * (400**2 - 60_000))


def test_counts_are_real_tokens_and_squared_example_lengths():
    callback = ThroughputCallback()
    features = [{"input_ids": [1] * 7, "labels": [-100] * 5 + [1, 1], "position_ids": [0, 1, 2, 0, 1, 2, 3]},
                {"input_ids": [1] * 4, "labels": [1] * 4, "position_ids": [0, 1, 2, 3]}]
    batch = {"input_ids": torch.ones(2, 8, dtype=torch.long),  # padded to 8: padding is not counted
             "labels": torch.tensor([[-100] * 5 + [1, 1, -100], [1, 1, 1, 1] + [-100] * 4])}
    callback.count(batch, features)
    assert (callback.counts.tokens, callback.counts.squares, callback.counts.supervised) == (11, 9 + 16 + 16, 6)


class FakeClock:
    now = 0.0

    @classmethod
    def perf_counter(cls):
        return cls.now


def test_steady_state_leaves_the_warm_up_out(monkeypatch):
    monkeypatch.setattr(tp, "time", FakeClock)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    args = type("A", (), {"world_size": 1, "bf16": False, "fp16": False, "tf32": False})()
    state = type("S", (), {"max_steps": 8})()
    callback = ThroughputCallback(peak_tflops=1.0)
    callback.on_train_begin(args, state, None, model=model)
    assert callback.warmup_steps == 2  # a quarter of 8 steps
    batch = {"input_ids": torch.ones(1, 100, dtype=torch.long), "labels": torch.ones(1, 100, dtype=torch.long)}
    for step in range(8):  # 100 tokens a step; the 2 warm-up steps take 10 s each, the rest 1 s
        callback.count(batch, [{"input_ids": [1] * 100}])
        FakeClock.now += 10.0 if step < 2 else 1.0
        callback.on_step_end(args, state, None)
    m = callback.metrics()
    assert m["tokens_per_second"] == pytest.approx(800 / 26)
    assert m["steady_tokens_per_second"] == pytest.approx(600 / 6)  # steps 3-8 only
    assert m["steady_mfu"] > m["mfu"]


def test_run_json_has_rates_peak_memory_and_the_plan(make_recipe):
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    summary = run_training(load_recipe(make_recipe("completion", n=32, adapter="lora", micro_batch_size=2,
                                                   max_steps=8, sample_packing=True, sequence_len=128)))
    numbers = summary["throughput"]
    assert numbers["steady_state_after_steps"] == 2
    # peak memory: the GPU's allocated and reserved bytes when it trained on one, else the process's peak RSS
    peak = ("peak_memory_allocated_gib", "peak_memory_reserved_gib") if torch.cuda.is_available() else ("peak_rss_gib",)
    for key in ("tokens_per_second", "steady_tokens_per_second", "model_tflops_per_device", *peak):
        assert numbers[key] > 0, key
    assert numbers["planned_memory_gib"]["peak_allocated_gib"] > 0
    assert numbers["planned_memory_gib"]["total_gib"] > numbers["planned_memory_gib"]["peak_allocated_gib"]
    last_log = [e for e in summary["log_history"] if "loss" in e][-1]
    assert last_log["steady_tokens_per_second"] > 0 and last_log[peak[0]] > 0
