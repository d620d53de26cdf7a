"""Peak dense FLOP/s and memory of common GPUs (pure data), for MFU and the memory verdict.

Figures are NVIDIA's datasheet numbers WITHOUT structured sparsity (datasheets often print the 2x
sparse figure; we halve those). `bf16`/`fp16` are tensor-core rates with FP32 accumulate, which is
what mixed-precision training uses. `memory_mib` is the total nvidia-smi reports, not the marketing GB.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import FinetuneError

TERA = 1e12


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int
    peak_tflops: dict[str, float]  # dtype -> dense TFLOP/s
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    @property
    def native_bf16(self) -> bool:
        """bf16 tensor cores (Ampere and newer): the table lists a bf16 peak only for those."""
        return "bf16" in self.peak_tflops

    def peak_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s for a dtype (`bf16`, `fp16`, `fp32`, `tf32`, `fp8`), or None if the GPU lacks it."""
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * TERA


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("h100-sxm", 81559, {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5; sparse figures halved)"),
    GPU("h100-pcie", 81559, {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        "NVIDIA H100 Tensor Core GPU datasheet (PCIe; sparse figures halved)"),
    GPU("h200", 143771, {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        "NVIDIA H200 Tensor Core GPU datasheet (SXM; same compute as H100 SXM, 141 GB HBM3e)"),
    GPU("a100-80gb", 81920, {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (dense figures)"),
    GPU("a100-40gb", 40960, {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (dense figures)"),
    GPU("l40s", 46068, {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
        "NVIDIA L40S datasheet (sparse figures halved)"),
    GPU("rtx-4090", 24564, {"fp32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
        "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (FP16/BF16 tensor, FP32 accumulate, dense)"),
    GPU("rtx-3090", 24576, {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
        "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (FP16/BF16 tensor, FP32 accumulate, dense)"),
    GPU("t4", 15360, {"fp32": 8.1, "fp16": 65.0},
        "NVIDIA T4 datasheet (Turing has no bf16: train in fp16)"),
)}

ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090", "3090": "rtx-3090",
           "rtx4090": "rtx-4090", "rtx3090": "rtx-3090"}


def _normalize(name: str) -> str:
    key = name.strip().lower().replace("nvidia", "").replace("geforce", "").replace("_", "-").replace(" ", "-")
    return key.strip("-")


def find_gpu(name: str) -> GPU:
    """A GPU by name (`h100`, `A100-80GB`, `NVIDIA GeForce RTX 4090`...). Raises FinetuneError if unknown."""
    key = _normalize(name)
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    # torch.cuda.get_device_name() says e.g. "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-40GB":
    # the entry sharing the model token with the most tokens matching wins.
    words = set(key.split("-"))
    scored = [(sum(t in words for t in gpu_key.split("-")), gpu) for gpu_key, gpu in GPUS.items()
              if gpu_key.split("-")[0] in words]
    if scored:
        return max(scored, key=lambda pair: pair[0])[1]
    raise FinetuneError(
        f"unknown GPU `{name}`; known: {', '.join(GPUS)}. Pass --gpu-memory-gib (plan) or "
        "`peak_tflops` (throughput callback) to use another."
    )


def match_gpu(device_name: str) -> GPU | None:
    """The table entry for a torch device name, or None (then MFU needs a given peak)."""
    try:
        return find_gpu(device_name)
    except FinetuneError:
        return None
