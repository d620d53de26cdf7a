"""`precision: auto` -> bf16 | fp16 | fp32: the one rule, used by training (live device) and the planner (GPU table).

    no GPU                       -> fp32  (CPU autocast in 16 bits is slower than fp32 and not what we test)
    GPU with bf16 tensor cores   -> bf16  (Ampere, compute capability 8.0, and newer; ROCm)
    GPU without (Turing, Volta)  -> fp16  (T4 sm_75, V100 sm_70: bf16 runs only emulated there, several times slower)

Training asks the live device (torch.cuda.is_bf16_supported(including_emulation=False), which is the
capability >= 8.0 test); the planner asks the GPU table (finetune/plan/gpus.py: a bf16 peak means bf16
tensor cores). Both go through resolve_precision() below, so a plan for `--gpu t4` says what a T4 run does.
"""

from __future__ import annotations


def resolve_precision(requested: str, has_gpu: bool, native_bf16: bool) -> str:
    """The precision a run uses: `requested` unless it is `auto`, then by the device's capabilities."""
    if requested != "auto":
        return requested
    if not has_gpu:
        return "fp32"
    return "bf16" if native_bf16 else "fp16"
