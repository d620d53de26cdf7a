"""The recipe's `fsdp:` section: PyTorch FSDP2 (`fully_shard`), the second way to shard a run over its processes,
beside DeepSpeed ZeRO (`deepspeed:`, in training.py), and the checks that keep the two and finetune's other
features apart where they conflict.

The keys are axolotl's FSDP2 names (`fsdp_config:` there), so a recipe ports by moving them under `fsdp:`. The
section becomes transformers' `fsdp_config` with `version: 2` (finetune/train/fsdp_config.py); activation
checkpointing is the recipe's `gradient_checkpointing: full`, done by FSDP (one key for one concept).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from finetune.recipe.adapter import mutates_base, uses_eva
from finetune.recipe.tags import TRAIN, Strict, affects


class FSDPSpec(Strict):
    """`fsdp:`: FSDP2 shards every weight, gradient and optimizer state over the processes; each decoder layer's
    weights are gathered for its forward and backward pass and freed after (docs/distributed.md)."""

    # affects nothing: the same weights are gathered, only when they are freed changes
    reshard_after_forward: bool = Field(
        True,
        description=("Free each layer's gathered weights after its forward pass and gather them again for the "
                     "backward pass (ZeRO-3's memory). `false`: keep them until the backward pass, less "
                     "communication, the whole model's weights held at the peak (ZeRO-2's memory)."),
        json_schema_extra=affects(),
    )
    # affects nothing: the optimizer steps the same fp32 numbers on the CPU
    offload_params: bool = Field(
        False,
        description=("Keep the sharded weights, gradients and optimizer states in CPU memory; the GPU holds only "
                     "the layers being computed. Slower (every step crosses PCIe), for a model that does not fit "
                     "even sharded."),
        json_schema_extra=affects(),
    )
    # train: the checkpoint's layout (a sharded checkpoint does not load as a full one)
    state_dict_type: Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"] = Field(
        "FULL_STATE_DICT",
        description=("How checkpoints hold the weights and optimizer state: `FULL_STATE_DICT`, gathered whole by "
                     "the main process (a checkpoint's model loads with transformers / peft); `SHARDED_STATE_DICT`, "
                     "each process writes its shard (torch.distributed.checkpoint; faster for large models, "
                     "resumable only under `fsdp`). The final save is always the whole model or adapter."),
        json_schema_extra=affects(TRAIN),
    )
    # affects nothing: the unit that is gathered, not what is computed
    transformer_layer_cls_to_wrap: str | None = Field(
        None,
        description=("The class each shard unit is, e.g. `LlamaDecoderLayer`. Default: the model's decoder layer "
                     "(transformers' `_no_split_modules`), which is right for every transformers model."),
        json_schema_extra=affects(),
    )


class DistributedKeys(Strict):
    """Sharding the run over its processes with FSDP2 (DeepSpeed ZeRO: `deepspeed`, under Training)."""

    # train: FSDP decides the checkpoint's layout (an FSDP checkpoint does not load without it)
    fsdp: FSDPSpec | None = Field(
        None,
        description=(
            "Shard the run with PyTorch FSDP2 over its GPU processes (`finetune train --num-processes N`): the "
            "alternative to `deepspeed` (set one, not both; docs/distributed.md says which to pick). `fsdp: {}` or "
            "`fsdp: true`: the defaults below. Needs GPUs; full fine-tune and LoRA with `method: sft`."
        ),
        json_schema_extra=affects(TRAIN),
    )

    @field_validator("fsdp", mode="before")
    @classmethod
    def _switch(cls, value):
        # `fsdp: true` (or `--set fsdp=true`): the defaults; `false`: off
        return ({} if value else None) if isinstance(value, bool) else value


def fsdp_problems(recipe) -> list[str]:
    """What cannot run under `fsdp:`, each with the reason and the fix; [] without it."""
    if recipe.fsdp is None:
        return []
    if recipe.deepspeed is not None:
        return ["`deepspeed` and `fsdp` are both set: they are two engines for the same job (sharding weights, "
                "gradients and optimizer states over the processes) and a run uses one; keep `deepspeed` "
                "(ZeRO) or `fsdp` (FSDP2), docs/distributed.md says which"]
    problems = []
    if recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit:
        problems.append(
            "`fsdp` with a quantized base (`adapter: qlora` / `load_in_4bit` / `load_in_8bit`) is not in finetune: "
            "accelerate leaves bitsandbytes' uint8-packed weights out of FSDP2's sharding (whole on every GPU) "
            "unless they are stored in a float dtype, which finetune does not set, and axolotl patches accelerate "
            "and bitsandbytes to shard them; use `adapter: lora` under `fsdp`, or QLoRA with `deepspeed: zero2` "
            "(or `--num-processes N` without sharding)")
    if recipe.method == "grpo":
        problems.append("`method: grpo` does not run under `fsdp`: it generates with the model as it trains, and "
                        "FSDP2 would gather every decoder layer's weights at every generated token (why GRPO refuses "
                        "ZeRO-3 too); use `deepspeed: zero2` (or no sharding) for GRPO")
    elif recipe.method == "reward":
        problems.append("`method: reward` does not run under `fsdp` yet: its score head read in the forward and its "
                        "shared-prompt rows are built and tested for DDP and DeepSpeed ZeRO only; use `deepspeed: "
                        "zero3` to shard a reward model's training")
    elif recipe.method != "sft":
        problems.append(f"`method: {recipe.method}` does not run under `fsdp` yet: its reference pass and "
                        "shared-prompt scoring are built and tested for DDP and DeepSpeed ZeRO only; use "
                        "`deepspeed: zero3` to shard a preference run")
    if recipe.compile is True:
        problems.append("`compile: true` with `fsdp`: finetune compiles each decoder layer in place, the same "
                        "modules FSDP2 hangs its gather and free hooks on, a combination it has not verified; "
                        "set `compile: auto` (off under `fsdp`) or `false`")
    if recipe.adapter != "none" and (mutates_base(recipe) or uses_eva(recipe)):
        problems.append(f"`peft_init_lora_weights: {recipe.peft_init_lora_weights}` with `fsdp`: it initialises the "
                        "adapters from whole weights or a forward pass, and PiSSA / OLoRA convert the final adapter "
                        "from the whole state dict, while FSDP2 holds each weight in shards; use the default init "
                        "under `fsdp`, or train without it")
    if recipe.fsdp.state_dict_type == "SHARDED_STATE_DICT" and recipe.export_interval:
        problems.append("`export_interval` keeps loadable models, but `fsdp.state_dict_type: SHARDED_STATE_DICT` "
                        "writes each process's shard and no model: use `FULL_STATE_DICT`, or drop `export_interval` "
                        "(the final save is always whole)")
    return problems
