"""The run's settings, resolved once: after the data is counted and before anything is built.

Everything a recipe leaves to the machine or to the data (`precision: auto`, `attn_implementation: auto`,
`learning_rate: auto`, a paged optimizer without CUDA, the DeepSpeed JSON's contents) is decided here, into
one frozen `Resolved`. TrainingArguments, the model, the callbacks and run.json all read it; nothing
downstream resolves a setting a second time. The device is read once (finetune/model/device.py) and every
device rule gets that reading; a GPU fast path chosen here is probed on the device before it is accepted
(finetune/train/fast_paths.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Resolved:
    world_size: int  # training processes over all machines
    cuda: bool
    device: str  # this process's training device in words: `NVIDIA T4 (compute capability 7.5)`, `CPU`
    precision: str  # bf16 | fp16 | fp32
    attn_implementation: str  # sdpa | eager | flash_attention_2 | flex_attention
    attn_reason: str  # why, in words (finetune/model/attention.py)
    compile: bool  # compile each decoder layer (finetune/model/regional_compile.py)
    compile_reason: str
    probes: dict  # what the fast-path probes found ({} where none ran): run.json's fast_path_probes
    optimizer: str  # the Trainer's `optim` name (a paged one becomes unpaged without CUDA)
    optimizer_notice: str | None  # why `optimizer` differs from the recipe's, or None
    learning_rate: float
    lr_plan: object | None  # the LrPlan that derived it (`learning_rate: auto`), else None
    packed_train: bool
    packed_eval: bool  # only when there is an eval split
    has_eval: bool
    numbers: dict  # plan_numbers(): steps, examples and tokens per optimizer step
    deepspeed: dict | None  # the recipe's DeepSpeed JSON, read once, as TrainingArguments takes it
    fsdp: dict | None = None  # the recipe's `fsdp:` as TrainingArguments' fsdp_config (train/fsdp_config.py)

    @property
    def packed(self) -> bool:
        return self.packed_train or self.packed_eval

    @property
    def cpu_deepspeed(self) -> bool:
        """DeepSpeed on CPU processes: the group is formed by hand (launch.start_process_group)."""
        return self.deepspeed is not None and not self.cuda

    @property
    def weights_partitioned(self) -> bool:
        """ZeRO-3 or FSDP2: each process holds a shard of every weight once the Trainer wraps the model, so a
        forward pass waits for the engine (DeepSpeed's, or FSDP2's hooks), which gathers the weights layer by
        layer; until then the model stays where it was loaded (FSDP2 moves each shard to its GPU)."""
        from finetune.train.deepspeed_config import zero_stage

        return (self.deepspeed is not None and zero_stage(self.deepspeed) == 3) or self.fsdp is not None

    def record(self) -> dict:
        """What run.json records of the resolution."""
        plan = self.lr_plan
        return {"precision": self.precision, "learning_rate": self.learning_rate,
                "learning_rate_plan": dataclasses.asdict(plan) if plan is not None else None,
                "attn_implementation": self.attn_implementation, "attn_reason": self.attn_reason,
                "compile": self.compile, "compile_reason": self.compile_reason, "fast_path_probes": self.probes,
                "device": self.device, "optimizer": self.optimizer}


def step_unit(recipe) -> str:
    """What the training split counts: pairs (a paired preference method), or examples."""
    return "examples" if recipe.method in ("sft", "kto") else "pairs"


def plan_numbers(recipe, prepared, world_size: int) -> dict:
    """The numbers printed before the first step and recorded in run.json."""
    from finetune.log import get_logger
    from finetune.plan.steps import check_batch_fits, optimizer_steps

    train = prepared.stats["train"]
    rows = len(prepared.train)  # what the Trainer iterates: examples, or packed rows with sample_packing
    if recipe.method == "grpo":  # completion slots: G per prompt, num_iterations times, whole steps only
        from finetune.train.grpo.setup import completion_slots

        rows = completion_slots(recipe, rows, world_size)
    packed_rows = rows if prepared.stats.get("packing", {}).get("train") else None
    # GRPO: micro_batch_size counts completions; completion_slots above checks its prompts against a step
    few = None if recipe.method == "grpo" else check_batch_fits(
        train["examples"], recipe.micro_batch_size, recipe.gradient_accumulation_steps, world_size, step_unit(recipe),
        packed_rows)
    if few:
        get_logger().warning(few)
    examples_per_step = recipe.micro_batch_size * recipe.gradient_accumulation_steps * world_size
    steps_per_epoch = optimizer_steps(rows, recipe.micro_batch_size,
                                      recipe.gradient_accumulation_steps, world_size, 1, None)
    return {
        "world_size": world_size,
        "examples_per_step": examples_per_step,
        "steps_per_epoch": steps_per_epoch,
        "train_rows": rows,
        "total_steps": optimizer_steps(rows, recipe.micro_batch_size,
                                       recipe.gradient_accumulation_steps, world_size,
                                       recipe.num_epochs, recipe.max_steps),
        # e.g. 1,200 tokens an epoch / 12 steps an epoch = 100 tokens per optimizer step, on average
        "tokens_per_step": train["tokens"] / steps_per_epoch,
        "supervised_tokens_per_step": train["supervised_tokens"] / steps_per_epoch,
    }


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(recipe, prepared, world_size: int, cuda: bool | None = None, *, device=None, probes=None) -> Resolved:
    """The one resolution of the recipe against this machine and the counted data. `device`: the training device
    (finetune.model.device.Device; default: this process's; `cuda=False` alone means a CPU). `probes`: what proves
    a fast path (default: the real probes on `device`, finetune/train/fast_paths.py)."""
    from finetune.data.packing import packed_splits
    from finetune.model import resolve_precision
    from finetune.model.attention import check_trainable, choose_attention
    from finetune.model.bnb import resolve_optimizer
    from finetune.model.device import Device, training_device
    from finetune.model.regional_compile import resolve_compile
    from finetune.plan.lr_recipe import resolve_learning_rate
    from finetune.train.deepspeed_config import trainer_deepspeed_config
    from finetune.train.fast_paths import Choice, DeviceProbes, prove_fast_paths
    from finetune.train.fsdp_config import check_fsdp_device, trainer_fsdp_config

    device = device or (Device() if cuda is False else training_device())
    check_trainable(recipe, device)  # flex_attention set for a CPU: refused before any model is loaded
    check_fsdp_device(recipe, device.cuda)  # `fsdp` on a CPU: the same
    precision = resolve_precision(recipe, device)
    choice = prove_fast_paths(recipe, Choice(*choose_attention(recipe, device), *resolve_compile(recipe, device), {}),
                              probes or DeviceProbes(recipe, device, precision))
    optimizer, notice = resolve_optimizer(recipe.optimizer, device.cuda)  # paged needs CUDA
    learning_rate, lr_plan = resolve_learning_rate(recipe, prepared.train_counts(), world_size)
    packed_train, packed_eval = packed_splits(recipe)
    has_eval = prepared.eval is not None and recipe.method != "grpo"  # GRPO has no eval loss: `finetune eval` scores it
    return Resolved(
        world_size=world_size, cuda=device.cuda, device=device.describe(),
        precision=precision,
        attn_implementation=choice.attn_implementation, attn_reason=choice.attn_reason,
        compile=choice.compile, compile_reason=choice.compile_reason, probes=choice.probes,
        optimizer=optimizer, optimizer_notice=notice,
        learning_rate=learning_rate, lr_plan=lr_plan,
        packed_train=packed_train, packed_eval=packed_eval and has_eval, has_eval=has_eval,
        numbers=plan_numbers(recipe, prepared, world_size),
        deepspeed=trainer_deepspeed_config(recipe.deepspeed) if recipe.deepspeed else None,
        fsdp=trainer_fsdp_config(recipe),
    )
