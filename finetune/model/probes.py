"""Probes: run a GPU fast path once, on the training device, before a run relies on it.

flex_attention and compiled decoder layers are Triton kernels generated for the shapes and the GPU at hand, and
they fail in ways no rule predicts from the device name: flex's backward asks for more shared memory per thread
block than an A10G / RTX 3090 / 4090 has once head_dim reaches 128 ("out of resource: shared memory, Required:
131074, Hardware limit: 101376", pytorch #133254; head_dim > 128 on sm_12x, pytorch #198224), no valid kernel
config, an unsupported dtype, a missing compiler. So each is tried once, on a stand-in for the model: a copy of
its architecture cut to ONE decoder layer (the same class and config: head_dim, attention and key/value heads,
norms, rotary; a 512-token vocabulary instead of the real one), on the training device, with weights in the dtype
the model loads in and the run's autocast, forward and backward through one row of `sequence_len` tokens that
holds three examples (packed: the document mask transformers builds from position_ids, as in training).

    probe_flex_attention(spec)            the layer eager, its attention flex_attention
    probe_compiled_layer(spec, attn)      the layer compiled (regional_compile.compile_decoder_layers), attention `attn`

Each returns the seconds it took or raises the kernel's own exception; ProbeUnavailable when the stand-in
cannot be built at all (an architecture this does not know how to cut), which says nothing about the kernel.
The stand-in has no LoRA or 4-bit layers and sees one shape: what only those, or a later batch's shape, would
bring is caught while training (finetune/train/fast_paths.kernel_failures).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

PROBE_VOCAB = 512  # the stand-in's vocabulary: the embedding and LM head are not what is being probed


class ProbeUnavailable(Exception):
    """The stand-in model could not be built; the fast path itself was not tried."""


@dataclass(frozen=True)
class ProbeSpec:
    config: object  # the base model's config (not modified)
    device: object  # torch.device the run trains on
    dtype: object  # torch dtype the weights load in (fp32 for a full fine-tune, the compute dtype for adapters)
    autocast: object | None  # the mixed-precision dtype (bf16 / fp16), None in fp32
    sequence_len: int
    train_weights: bool  # a full fine-tune: the layer's weights get gradients too
    trust_remote_code: bool = False


def one_layer_config(config):
    """A copy of `config` with one decoder layer and PROBE_VOCAB tokens."""
    cut = copy.deepcopy(config)
    cut.num_hidden_layers = 1
    if getattr(cut, "layer_types", None):
        cut.layer_types = list(cut.layer_types[:1])
    cut.vocab_size = PROBE_VOCAB
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(cut, key, None)
        if isinstance(value, int) and value >= PROBE_VOCAB:
            setattr(cut, key, None)
    cut.use_cache = False
    return cut


def stand_in(spec: ProbeSpec, attn: str):
    """The one-layer copy of the model on the training device, attention `attn`, in training mode."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():  # left by an earlier ZeRO-3 run in this process: the stand-in would be sharded
        raise ProbeUnavailable("a ZeRO-3 configuration is active in this process")
    try:
        with torch.device(spec.device):
            model = AutoModelForCausalLM.from_config(one_layer_config(spec.config), attn_implementation=attn,
                                                     dtype=spec.dtype, trust_remote_code=spec.trust_remote_code)
    except Exception as exc:  # noqa: BLE001 any architecture's constructor may raise anything
        raise ProbeUnavailable(f"{type(exc).__name__}: {exc}") from exc
    if not spec.train_weights:  # adapters: the base is frozen, gradients flow through the layer to its input
        model.requires_grad_(False)
        model.enable_input_require_grads()
    return model.train()


def packed_row(length: int, device):
    """(input_ids, position_ids) of one row of `length` tokens holding three examples (1/2, 1/4, the rest)."""
    import torch

    lengths = [length // 2, length // 4]
    lengths.append(length - sum(lengths))
    positions = torch.cat([torch.arange(n) for n in lengths if n > 0]).unsqueeze(0).to(device)
    ids = torch.randint(0, PROBE_VOCAB, (1, length), generator=torch.Generator().manual_seed(0)).to(device)
    return ids, positions


def forward_backward(model, spec: ProbeSpec) -> None:
    """One training step's forward and backward (no optimizer): the kernels a step runs, in the run's autocast."""
    import torch

    ids, positions = packed_row(spec.sequence_len, spec.device)
    with torch.autocast(spec.device.type, dtype=spec.autocast or torch.float32, enabled=spec.autocast is not None):
        loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
    loss.backward()
    if spec.device.type == "cuda":
        torch.cuda.synchronize(spec.device)  # an asynchronous kernel error surfaces here, inside the probe


def _run(spec: ProbeSpec, attn: str, compiled: bool) -> float:
    import gc

    import torch

    from finetune.model.regional_compile import compile_decoder_layers

    started = time.perf_counter()
    model = stand_in(spec, attn)
    try:
        if compiled:
            compile_decoder_layers(model)
        forward_backward(model, spec)
    finally:
        del model
        gc.collect()
        if spec.device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's memory goes back before the model loads
    return time.perf_counter() - started


def probe_flex_attention(spec: ProbeSpec) -> float:
    """flex_attention forward and backward with a document mask; seconds taken, or the kernel's exception."""
    return _run(spec, "flex_attention", compiled=False)


def probe_compiled_layer(spec: ProbeSpec, attn: str) -> float:
    """One compiled decoder layer (attention `attn`) forward and backward; seconds taken, or the exception."""
    return _run(spec, attn, compiled=True)
