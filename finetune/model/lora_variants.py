"""The LoRA variants' steps around peft (docs/lora.md): PiSSA / OLoRA's adapter saved for the ORIGINAL base, and
EVA's data pass.

PiSSA and OLoRA start the adapter from a decomposition of each weight W and leave the rest in the base:
W_res = W - s * B0 @ A0. Training then moves A, B; the trained model is W_res + s * B @ A. An adapter that
needs W_res is useless to anyone holding W, so the final save is converted with peft's own conversion
(`save_pretrained(path_initial_model_for_weight_conversion=...)`): W_res + s*B@A = W + s*(B@A - B0@A0) =
W + s * [B | -B0] @ [A ; A0], a plain LoRA adapter of rank 2r (alpha doubled, or x sqrt(2) under rsLoRA) on W.
Merge, GGUF export, eval and chat then load it on the untouched base like any adapter.

The starting adapter (A0, B0) is kept in memory from build time: the init is deterministic under the run's seed
(an SVD or QR of the weights; pissa_niter's randomized SVD draws after set_seed), so a resumed run rebuilds the
same W_res and the same A0, B0 before the checkpoint's A, B are loaded.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from finetune.log import get_logger

log = get_logger(__name__)

INITIAL = "initial_adapter"  # peft loads the starting adapter under its folder's name, beside "default"


def initial_adapter(model) -> dict:
    """The adapter's starting tensors (the saved-file keys), copied to the CPU."""
    import warnings

    from peft import get_peft_model_state_dict

    # peft warns at every checkpoint save that a PiSSA / OLoRA adapter needs the mutated base and should be
    # converted; the final save is converted (save_for_original_base), and checkpoints are for resuming
    warnings.filterwarnings("ignore", message=r"(PiSSA|OLoRA) changes the base weights", category=UserWarning)

    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in get_peft_model_state_dict(model).items()}


def save_for_original_base(model, folder: Path, initial: dict) -> None:
    """Write `model`'s adapter into `folder` converted to plain LoRA on the original (unmutated) base."""
    from safetensors.torch import save_file

    scratch = Path(tempfile.mkdtemp(prefix="finetune-lora-init-"))
    try:
        start = scratch / INITIAL
        start.mkdir()
        tensors = {name: tensor.contiguous() for name, tensor in initial.items()}
        save_file(tensors, str(start / "adapter_model.safetensors"))
        # peft writes the starting adapter's config there itself (init_lora_weights=True: load it as it is)
        model.save_pretrained(str(folder), path_initial_model_for_weight_conversion=str(start))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def eva_initialise(model, collator, rows, micro_batch_size: int) -> dict:
    """EVA (peft's `initialize_lora_eva_weights`): A from the top principal directions of each adapted layer's
    inputs, on the training examples' supervised tokens (labels != -100), micro batch by micro batch in dataset
    order, cycling until the directions converge; ranks move between layers (peft's rank_pattern). Deterministic
    (the same rows, peft's fixed low-rank SVD seed), so a resumed run rebuilds the same start. Each process runs
    it on the same rows alone (no gathering), and gets the same answer. Returns the rank per layer that changed."""
    import torch
    from peft import initialize_lora_eva_weights

    device = next(p.device for p in model.parameters() if p.device.type != "meta")

    class Batches:  # made as peft asks for them: it stops once the directions converge (often within one pass)
        def __len__(self):
            return -(-len(rows) // micro_batch_size)

        def __iter__(self):
            for start in range(0, len(rows), micro_batch_size):
                batch = collator([rows[i] for i in range(start, min(start + micro_batch_size, len(rows)))])
                yield {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}

    initialize_lora_eva_weights(model, Batches(), gather_distributed_inputs=False, show_progress_bar=False)
    ranks = dict(model.peft_config["default"].rank_pattern or {})
    shown = ", ".join(f"{name} {rank}" for name, rank in list(ranks.items())[:4]) + (" ..." if len(ranks) > 4 else "")
    log.info(f"peft_init_lora_weights: eva: A from the principal directions of each layer's inputs on the training "
             f"data; {len(ranks)} layers' ranks moved from r{': ' + shown if ranks else ''}")
    return ranks
