"""Throughput: tokens/s, supervised tokens/s, model TFLOP/s and MFU (since the start and in the steady state),
and peak memory, added to each training log; `summary()` is what run.json records, next to the plan's memory.

Tokens are counted where the batches are made: wrap the data collator with `ThroughputCallback.wrap()`.

    throughput = ThroughputCallback(peak_tflops=None)          # MFU from the GPU table when on a known GPU
    trainer = Trainer(..., data_collator=throughput.wrap(collator), callbacks=[throughput])

Honest numbers: only real tokens count (padding is not useful work), and attention is charged per example,
sum of lengths squared (a packed row's examples attend only within themselves: plan/flops.attention_flops).
Nothing here reads from the GPU per step: counts come from the CPU batches, peak memory from the allocator's
host-side counters; one synchronisation marks the end of the warm-up.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

from finetune.contract import IGNORE_INDEX

GIB = 2**30
# The steady state starts after this many optimizer steps (a quarter of a shorter run): the first steps pay
# for allocator growth, kernel autotuning and compilation. Issue 13 measured the first ~20 steps of a 1B run
# on an H100 at 0.47-0.73 s against 0.30 s after.
STEADY_AFTER_STEPS = 20


def segment_lengths(position_ids) -> list[int]:
    """Lengths of the examples packed in one row: a position 0 starts a new example."""
    positions = position_ids.tolist() if hasattr(position_ids, "tolist") else list(position_ids)
    starts = [i for i, p in enumerate(positions) if p == 0] or [0]
    return [end - start for start, end in zip(starts, [*starts[1:], len(positions)])]


class _CountingCollator:
    def __init__(self, collator, sink: "ThroughputCallback"):
        self.collator, self.sink = collator, sink

    def __call__(self, features):
        batch = self.collator(features)
        self.sink.count(batch, features)
        return batch


class _Counts:
    def __init__(self):
        self.tokens = self.supervised = self.squares = 0

    def copy(self) -> "_Counts":
        other = _Counts()
        other.tokens, other.supervised, other.squares = self.tokens, self.supervised, self.squares
        return other


class ThroughputCallback(TrainerCallback):
    """Adds to each training log: tokens/s and supervised tokens/s (per device and total), model TFLOP/s per
    device (6 x trained + 4 x frozen matmul params per token + attention per example; of a mixture-of-experts
    model the weights and adapters of the token's top-k experts only; plan/flops.py) and MFU
    when a peak is known, each since training began and (`steady_*`) since the warm-up ended; peak memory."""

    def __init__(self, peak_tflops: float | None = None, planned_memory: dict | None = None):
        self.peak_tflops = peak_tflops  # per device; None: look the GPU up (never guessed on CPU)
        self.planned_memory = planned_memory  # `finetune plan`'s prediction for this run, GiB (run.json)
        self.counts = _Counts()
        self._since = self._steady_since = self._steady_counts = None
        self._shape = self._lora_params = None
        self._world, self._steps, self.warmup_steps = 1, 0, STEADY_AFTER_STEPS

    def wrap(self, collator):
        return _CountingCollator(collator, self)

    def count(self, batch, features=None) -> None:
        """Real tokens and squared example lengths from the features (CPU lists), supervised from the labels."""
        if "record" in batch:  # GRPO's prompts: the trainer generates and scores, and counts what it generated
            return
        if "sequence_lengths" in batch:  # preference batches list their sequences (data/preference_collate.py)
            lengths = batch["sequence_lengths"].tolist()
            # a prompt shared by a pair's two responses is in the row once: its tokens, and its causal attention
            # square, are counted once (the rejected response's own attention is (P + R)^2 - P^2)
            shared = batch["shared_prompt_tokens"].tolist() if "shared_prompt_tokens" in batch else []
            self.counts.tokens += int(sum(lengths) - sum(shared))
            self.counts.squares += int(sum(n * n for n in lengths) - sum(p * p for p in shared))
        elif features and "input_ids" in features[0]:
            for f in features:
                lengths = segment_lengths(f["position_ids"]) if "position_ids" in f else [len(f["input_ids"])]
                self.counts.tokens += sum(lengths)
                self.counts.squares += sum(n * n for n in lengths)
        else:  # a collator's batch alone: rows padded to a width, the mask says which tokens are real
            mask = batch.get("attention_mask")
            lengths = mask.sum(dim=1).tolist() if mask is not None else [batch["input_ids"].shape[1]] * len(batch["input_ids"])
            self.counts.tokens += int(sum(lengths))
            self.counts.squares += int(sum(n * n for n in lengths))
        labels = batch.get("labels")
        if labels is not None:
            self.counts.supervised += int((labels != IGNORE_INDEX).sum())

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from finetune.model import base_causal_lm
        from finetune.plan.model_size import model_shape

        from finetune.compat import parameter_count
        from finetune.plan.moe import moe_layout

        self._world = max(args.world_size, 1)
        causal_lm = base_causal_lm(model)
        self._shape = model_shape(causal_lm)
        is_peft = hasattr(model, "peft_config")
        # parameter_count: a ZeRO-3 shard's numel is its placeholder's
        self._lora_params = sum(parameter_count(p) for p in model.parameters() if p.requires_grad) if is_peft else None
        layout = moe_layout(causal_lm) if is_peft else None
        if layout is not None:  # an MoE token runs through the adapters of its top-k experts only
            self._lora_params -= layout.inactive_trainable(causal_lm)
        if self.peak_tflops is None:
            self.peak_tflops = _detect_peak_tflops(args)
        if state.max_steps and state.max_steps > 0:
            self.warmup_steps = min(STEADY_AFTER_STEPS, max(1, state.max_steps // 4))
        self.counts, self._steps = _Counts(), 0
        self._since, self._steady_since, self._steady_counts = time.perf_counter(), None, None

    def exclude(self, seconds: float) -> None:
        """Work inside the training loop that is not training (a preference run's reference pass in its first
        step): the clocks start that much later, so the rates count the training steps only."""
        if self._since is not None:
            self._since += seconds
        if self._steady_since is not None:
            self._steady_since += seconds

    def on_step_end(self, args, state, control, **kwargs):
        self._steps += 1
        if self._steps == self.warmup_steps:
            _synchronize()  # the one sync of the run: the warm-up's queued GPU work is done before the clock starts
            self._steady_since, self._steady_counts = time.perf_counter(), self.counts.copy()

    def _rates(self, counts: _Counts, elapsed: float, prefix: str) -> dict:
        from finetune.plan.flops import training_flops

        elapsed = max(elapsed, 1e-9)
        out = {
            f"{prefix}tokens_per_second_per_device": counts.tokens / elapsed,
            f"{prefix}tokens_per_second": counts.tokens * self._world / elapsed,  # processes run the same batch sizes
            f"{prefix}supervised_tokens_per_second_per_device": counts.supervised / elapsed,
            f"{prefix}supervised_tokens_per_second": counts.supervised * self._world / elapsed,
        }
        if self._shape is not None and counts.tokens:
            flops = training_flops(self._shape, counts.tokens, counts.squares, self._lora_params)
            out[f"{prefix}model_tflops_per_device"] = flops / elapsed / 1e12
            if self.peak_tflops:
                out[f"{prefix}mfu"] = out[f"{prefix}model_tflops_per_device"] / self.peak_tflops
        return out

    def metrics(self) -> dict:
        now = time.perf_counter()
        out = self._rates(self.counts, now - self._since, "")
        if self._steady_since is not None and self.counts.tokens > self._steady_counts.tokens:
            steady = _Counts()
            steady.tokens = self.counts.tokens - self._steady_counts.tokens
            steady.supervised = self.counts.supervised - self._steady_counts.supervised
            steady.squares = self.counts.squares - self._steady_counts.squares
            out.update(self._rates(steady, now - self._steady_since, "steady_"))
        return {**out, **peak_memory()}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or not self.counts.tokens:
            return
        # The dataloader fetches a batch ahead, so counts lead the steps by one micro-batch; over the run
        # (and the steady window, whose two ends both lead by one) that batch does not matter.
        add_to_log(state, logs, self.metrics())

    def summary(self) -> dict:
        """run.json's `throughput`: the rates at the end, the warm-up excluded, and plan vs real memory."""
        out = self.metrics() if self.counts.tokens else {}
        out["steady_state_after_steps"] = self.warmup_steps
        out["planned_memory_gib"] = self.planned_memory
        return out


def add_to_log(state, logs: dict, extra: dict) -> None:
    """Metrics a callback adds to the training log being written, and to the entry the Trainer just appended to
    log_history (on_log runs after it appended), so run.json and the curves see them too."""
    logs.update(extra)
    if state.log_history and state.log_history[-1].get("step") == state.global_step:
        state.log_history[-1].update(extra)


def peak_memory() -> dict:
    """Peak memory of this process, GiB: CUDA allocated and reserved (the caching allocator's own counters,
    no synchronisation), else the peak resident set size (CPU: weights, activations and the libraries)."""
    import sys

    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"peak_memory_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
                "peak_memory_reserved_gib": torch.cuda.max_memory_reserved() / GIB}
    try:
        import resource
    except ImportError:  # Windows
        return {}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_gib": rss * (1 if sys.platform == "darwin" else 1024) / GIB}  # bytes on macOS, KiB on Linux


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


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


def throughput_line(summary: dict) -> str:
    """One line for the end of a run: tokens/s since start and steady, MFU, peak memory vs the plan."""
    parts = [f"throughput: {summary.get('tokens_per_second', 0):,.0f} tokens/s since start"]
    if "steady_tokens_per_second" in summary:
        parts.append(f"{summary['steady_tokens_per_second']:,.0f} after the first {summary['steady_state_after_steps']} steps")
    if "mfu" in summary:
        parts.append(f"MFU {100 * summary['mfu']:.1f}% ({100 * summary.get('steady_mfu', summary['mfu']):.1f}% steady)")
    planned = summary.get("planned_memory_gib") or {}
    if "peak_memory_allocated_gib" in summary:
        plan = f" (plan: {planned['peak_allocated_gib']:.2f})" if planned else ""
        parts.append(f"peak memory {summary['peak_memory_allocated_gib']:.2f} GiB allocated{plan}, "
                     f"{summary['peak_memory_reserved_gib']:.2f} GiB reserved")
    elif "peak_rss_gib" in summary:
        parts.append(f"peak RSS {summary['peak_rss_gib']:.2f} GiB (the plan's GPU figure does not apply on CPU)")
    return "; ".join(parts)
