"""Errors a user can cause. The CLI prints their message as one paragraph and exits 2."""

from __future__ import annotations


class FinetuneError(Exception):
    """A mistake the user can fix: bad recipe, missing file, unusable data. Exit code 2."""

    exit_code = 2


class RecipeError(FinetuneError):
    """The recipe is invalid. `problems` lists every problem found, one line each."""

    def __init__(self, problems: list[str], source: str = "recipe"):
        self.problems = list(problems)
        self.source = source
        n = len(self.problems)
        head = f"{source}: {n} problem{'s' if n != 1 else ''}:"
        super().__init__("\n".join([head] + [f"  - {p}" for p in self.problems]))


class MachineError(FinetuneError):
    """The recipe is valid, and this machine cannot train it (finetune/train/preflight.py): `problems` lists every
    reason (no CUDA for `fsdp`, a package missing, the hub unreachable...)."""

    def __init__(self, problems: list[str], source: str = "recipe", hint: str = ""):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{source} is a valid recipe, but this machine cannot train it ({n} problem{'s' if n != 1 else ''}):"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)] + ([hint] if hint else [])))


class DataError(FinetuneError):
    """The training data cannot be used as it is."""


class ModelError(FinetuneError):
    """The base model cannot be found or loaded."""


class RewardError(FinetuneError):
    """A GRPO reward function cannot be loaded or called, or every reward function keeps failing."""
