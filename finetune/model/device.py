"""The device a training process runs on, as the `auto` rules read it: the CPU, or one CUDA GPU and its compute
capability.

torch is read once per run (training_device()) and the answer is handed to every rule that depends on the
device (precision, attention, compile), so the rules never ask torch behind the run's back and a test can hand
them a T4 or an H100 on a machine without a GPU.

Compute capability 8.0 (Ampere: A100, A10G, RTX 30xx and newer) is where `auto` starts using the GPU fast paths:
- bf16 tensor cores: `precision: auto` is bf16 from 8.0, fp16 below (T4 7.5, V100 7.0; bf16 only emulated there);
- flash-attn 2 runs on sm_80 and newer only;
- flex_attention and compiled layers are Triton kernels whose tile sizes are tuned for Ampere and newer; flex's
  backward already needs more shared memory per thread block than an A10G / RTX 3090 / 4090 has (101,376 bytes)
  at head_dim 128 (pytorch #133254), and a T4 has 65,536 (V100: 98,304).
Below 8.0 `auto` takes the paths every GPU runs (sdpa, eager); at 8.0 and above each fast path is still probed on
the device before the run uses it (finetune/train/fast_paths.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FAST_PATH_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Device:
    type: str = "cpu"  # "cuda" | "cpu"
    index: int = 0  # the CUDA device this process trains on
    capability: tuple[int, int] | None = None  # CUDA compute capability, e.g. (7, 5) for a T4; None on CPU
    name: str = "CPU"

    @property
    def cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def fast_paths(self) -> bool:
        """A GPU of compute capability 8.0 or newer: bf16 tensor cores, flash-attn 2, Triton's tuned range."""
        return self.cuda and self.capability is not None and tuple(self.capability) >= FAST_PATH_CAPABILITY

    @property
    def native_bf16(self) -> bool:
        # the test torch.cuda.is_bf16_supported(including_emulation=False) makes on CUDA (major >= 8)
        return self.fast_paths

    def describe(self) -> str:
        if not self.cuda:
            return "CPU"
        return f"{self.name} (compute capability {self.capability[0]}.{self.capability[1]})"

    def torch_device(self):
        import torch

        return torch.device(self.type, self.index) if self.cuda else torch.device("cpu")


def training_device() -> Device:
    """This process's training device: the GPU of its LOCAL_RANK (as the Trainer places it), or the CPU."""
    import torch

    if not torch.cuda.is_available():
        return Device()
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    return Device("cuda", index, tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_device_name(index))
