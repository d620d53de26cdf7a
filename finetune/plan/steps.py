"""How many optimizer steps the HF Trainer will run: the same integer arithmetic, stated once.

Mirrors transformers 5.x `Trainer.set_initial_training_values` and `_run_epoch`:

    batches per process  = ceil(examples / (micro_batch_size x processes))   # no drop_last; accelerate's
                                                                              # even_batches pads the last one
    steps per epoch      = max(ceil(batches / gradient_accumulation_steps), 1) # a short final accumulation
                                                                              # still takes a step
    total steps          = max_steps                       if max_steps is set
                         = ceil(num_epochs x steps per epoch)  otherwise       # fractional epochs stop mid-epoch

Packing changes only `num_examples` (count the packed sequences); sequence parallelism and other
dataloader changes would enter through `dataloader_batches`.
"""

from __future__ import annotations

import math

from finetune.errors import FinetuneError


def dataloader_batches(num_examples: int, micro_batch_size: int, world_size: int = 1) -> int:
    """len(train_dataloader) on each process: ceil(ceil(n / micro_batch) / processes) == ceil(n / (micro_batch x processes))."""
    if num_examples <= 0:
        raise FinetuneError(
            f"the training set has {num_examples} examples; there is nothing to train on. Check the datasets "
            "and the length filter (`sequence_len`, `excess_length_strategy`)."
        )
    if micro_batch_size <= 0 or world_size <= 0:
        raise FinetuneError(
            f"micro_batch_size ({micro_batch_size}) and the number of processes ({world_size}) must be positive"
        )
    return math.ceil(num_examples / (micro_batch_size * world_size))


def check_batch_fits(examples: int, micro_batch_size: int, gradient_accumulation_steps: int, world_size: int,
                     unit: str = "examples", rows: int | None = None) -> str | None:
    """DataError when one optimizer step asks for more `unit`s (examples, pairs) than the training split holds:
    the Trainer would run it anyway, one short step an epoch with the whole split in one micro batch, which is
    never what such a recipe meant (micro_batch_size read as the global batch). With packing (`rows`: the packed
    rows), a step larger than the rows but not than the examples is a warning, returned: the rows are hard to
    foresee, and a packed micro batch only holds what there is."""
    from finetune.errors import DataError

    per_step = micro_batch_size * gradient_accumulation_steps * world_size
    formula = (f"micro_batch_size {micro_batch_size} x gradient_accumulation_steps {gradient_accumulation_steps}"
               + (f" x {world_size} processes" if world_size > 1 else "") + f" = {per_step:,}")
    if 0 < examples < per_step:
        raise DataError(
            f"one optimizer step takes {formula} {'packed rows' if rows is not None else unit}, but the training "
            f"split holds {examples:,} {unit}: every epoch would be one short step. Lower micro_batch_size / "
            f"gradient_accumulation_steps (or global_batch_size) to at most {examples:,} a step, or add data"
        )
    if rows is not None and 0 < rows < per_step:
        return (f"one optimizer step takes {formula} packed rows and the training split packs into {rows:,}: each "
                f"epoch is one step; for more steps lower micro_batch_size / gradient_accumulation_steps")
    return None


def steps_per_epoch(batches_per_process: int, gradient_accumulation_steps: int) -> int:
    """Optimizer steps in one pass: a remainder of fewer than `gradient_accumulation_steps` batches still steps."""
    if gradient_accumulation_steps <= 0:
        raise FinetuneError(f"gradient_accumulation_steps must be positive, got {gradient_accumulation_steps}")
    return max(math.ceil(batches_per_process / gradient_accumulation_steps), 1)


def optimizer_steps(
    num_examples: int,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    num_epochs: float,
    max_steps: int | None,
) -> int:
    """The exact number of optimizer steps (trainer.state.global_step at the end) the Trainer will run."""
    per_epoch = steps_per_epoch(dataloader_batches(num_examples, micro_batch_size, world_size),
                                gradient_accumulation_steps)
    if max_steps is not None and max_steps > 0:
        return max_steps  # the Trainer loops over as many epochs as it needs to reach it
    if num_epochs <= 0:
        raise FinetuneError(f"num_epochs must be positive, got {num_epochs}; or set max_steps")
    # Same float expression as the Trainer, so e.g. 0.3 epochs x 10 steps = 3.0000000000000004 -> 4 here too.
    return math.ceil(num_epochs * per_epoch)


def epochs_run(total_steps: int, steps_in_one_epoch: int) -> float:
    """How many passes over the data `total_steps` amounts to (for max_steps runs): steps / steps per epoch."""
    return total_steps / steps_in_one_epoch
