"""Which prompts each optimizer step trains on: shuffled per epoch (seeded), each prompt's slot repeated G times in a
row (its group), each step's block of prompts repeated num_iterations times (the policy updates per generation),
and, with several processes, laid out so that accelerate's round-robin split of micro batches hands every process
whole groups.

The Trainer iterates completion slots: micro_batch_size of them per micro batch (micro_batch_size counts completions,
as in TRL). Nothing here is random beyond the seeded shuffle, so a resumed run sees the same prompts at every step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    group: int  # G: completions per prompt
    micro_batch: int  # completion slots per micro batch
    accumulation: int  # micro batches per optimizer step, per process
    processes: int
    iterations: int  # optimizer steps per generation (mu)

    @property
    def prompts_per_process(self) -> int:
        return self.micro_batch * self.accumulation // self.group

    @property
    def prompts_per_step(self) -> int:
        return self.prompts_per_process * self.processes


def used_prompts(prompts: int, shape: StepShape) -> int:
    """Prompts an epoch trains on: whole steps only (the rest of a shuffled epoch waits for the next epoch)."""
    return prompts // shape.prompts_per_step * shape.prompts_per_step


def epoch_slots(prompts: int, shape: StepShape, seed: int, epoch: int) -> list[int]:
    """The dataset index of every completion slot of one epoch, in the order the dataloader must yield them (before
    accelerate hands micro batch k x processes + p to process p)."""
    order = list(range(prompts))
    random.Random(f"{seed}-{epoch}").shuffle(order)  # a string seed: stable across Python versions and runs
    order = order[:used_prompts(prompts, shape)]
    slots = []
    for start in range(0, len(order), shape.prompts_per_step):
        block = order[start:start + shape.prompts_per_step]
        per_process = [block[p * shape.prompts_per_process:(p + 1) * shape.prompts_per_process]
                       for p in range(shape.processes)]
        # each process's completion slots for this step: its prompts, each G times in a row
        lanes = [[i for i in mine for _ in range(shape.group)] for mine in per_process]
        step = []
        for k in range(shape.accumulation):  # global micro batch k * processes + p belongs to process p
            for lane in lanes:
                step += lane[k * shape.micro_batch:(k + 1) * shape.micro_batch]
        slots += step * shape.iterations
    return slots


class GroupSampler:
    """A torch Sampler (duck-typed: __iter__, __len__) over completion slots; `set_epoch` as the Trainer calls it."""

    def __init__(self, prompts: int, shape: StepShape, seed: int):
        self.prompts, self.shape, self.seed, self.epoch = prompts, shape, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        return iter(epoch_slots(self.prompts, self.shape, self.seed, self.epoch))

    def __len__(self) -> int:
        return used_prompts(self.prompts, self.shape) * self.shape.group * self.shape.iterations
