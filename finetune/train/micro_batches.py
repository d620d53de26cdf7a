"""The micro batches of one optimizer step, taken from the Trainer's epoch iterator at once (the methods that need the
whole step before its first forward, to count or to generate, read them through Trainer.get_batch_samples)."""

from __future__ import annotations


def take(epoch_iterator, count: int) -> list:
    """Up to `count` micro batches: fewer at the end of an epoch."""
    batches = []
    for _ in range(count):
        try:
            batches.append(next(epoch_iterator))
        except StopIteration:
            break
    return batches
