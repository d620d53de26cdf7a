"""Throughput: tokens/s, supervised tokens/s, model TFLOP/s and MFU, added to each training log.

Tokens are counted where the batches are made: wrap the data collator with `ThroughputCallback.wrap()`.

    throughput = ThroughputCallback(peak_tflops=None)          # MFU from the GPU table when on a known GPU
    trainer = Trainer(..., data_collator=throughput.wrap(collator), callbacks=[throughput])
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

from finetune.contract import IGNORE_INDEX


class _CountingCollator:
    def __init__(self, collator, sink: "ThroughputCallback"):
        self.collator, self.sink = collator, sink

    def __call__(self, features):
        batch = self.collator(features)
        self.sink.count(batch)
        return batch


class ThroughputCallback(TrainerCallback):
    """Adds to each training log, averaged since training began: tokens/s and supervised tokens/s (per device and total), model TFLOP/s per device
    (6 x trained + 4 x frozen matmul params per token + attention; plan/flops.py) and MFU when a peak is known."""

    def __init__(self, peak_tflops: float | None = None):
        self.peak_tflops = peak_tflops  # per device; None: look the GPU up (never guessed on CPU)
        self.tokens = self.supervised = self.padded_positions = self.sequences = 0
        self._since = None
        self._shape = self._lora_params = None
        self._world = 1

    def wrap(self, collator):
        return _CountingCollator(collator, self)

    def count(self, batch) -> None:
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        self.tokens += int(mask.sum()) if mask is not None else ids.numel()
        self.padded_positions += ids.numel()
        self.sequences += ids.shape[0]
        labels = batch.get("labels")
        if labels is not None:
            self.supervised += int((labels != IGNORE_INDEX).sum())

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from finetune.model import base_causal_lm
        from finetune.plan.model_size import model_shape

        self._world = max(args.world_size, 1)
        self._shape = model_shape(base_causal_lm(model))
        is_peft = hasattr(model, "peft_config")
        self._lora_params = sum(p.numel() for p in model.parameters() if p.requires_grad) if is_peft else None
        if self.peak_tflops is None:
            self.peak_tflops = _detect_peak_tflops(args)
        self._reset()

    def _reset(self):
        self.tokens = self.supervised = self.padded_positions = self.sequences = 0
        self._since = time.perf_counter()

    def metrics(self) -> dict:
        from finetune.plan.flops import flops_per_token

        elapsed = max(time.perf_counter() - self._since, 1e-9)
        out = {
            "tokens_per_second_per_device": self.tokens / elapsed,
            "tokens_per_second": self.tokens * self._world / elapsed,  # processes run the same batch sizes
            "supervised_tokens_per_second_per_device": self.supervised / elapsed,
            "supervised_tokens_per_second": self.supervised * self._world / elapsed,
        }
        if self._shape is not None and self.sequences:
            seq_len = self.padded_positions / self.sequences  # attention runs over the padded length
            flops = flops_per_token(self._shape, int(seq_len), self._lora_params) * self.padded_positions
            out["model_tflops_per_device"] = flops / elapsed / 1e12
            if self.peak_tflops:
                out["mfu"] = out["model_tflops_per_device"] / self.peak_tflops
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or not self.tokens:
            return
        # Averages since training began: the dataloader fetches a batch ahead, so per-interval counts
        # would be off by a batch; over the run that batch does not matter.
        extra = self.metrics()
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)


def _detect_peak_tflops(args) -> float | None:
    import torch

    if not torch.cuda.is_available() or args.device.type != "cuda":  # trained on the CPU of a GPU machine
        return None
    from finetune.plan.gpus import match_gpu

    gpu = match_gpu(torch.cuda.get_device_name())
    if gpu is None:
        return None
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "tf32" if args.tf32 else "fp32"
    peak = gpu.peak_flops(dtype)
    return None if peak is None else peak / 1e12
