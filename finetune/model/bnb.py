"""bitsandbytes: whether it is there, and which optimizer a recipe's `optimizer` really means on this machine.

Paged optimizers keep their state in CUDA unified memory so that a memory spike pages it out to the CPU
instead of crashing. Without CUDA there is nothing to page: the same update runs without paging.
"""

from __future__ import annotations

import importlib.util

from finetune.errors import ModelError

INSTALL = "pip install 'bitsandbytes>=0.45'  (or: pip install 'finetune[qlora]')"

# optimizers whose state bitsandbytes keeps
BNB_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")

# paged -> the same update without paging. 32-bit AdamW without paging is plain torch AdamW.
UNPAGED = {"paged_adamw_8bit": "adamw_bnb_8bit", "paged_adamw_32bit": "adamw_torch"}


def require_bitsandbytes(what: str) -> None:
    """Raise a ModelError naming `what` needs bitsandbytes, with the install command."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(f"{what} needs bitsandbytes, which is not installed: {INSTALL}")


def resolve_optimizer(optimizer: str, cuda: bool) -> tuple[str, str | None]:
    """(the Trainer's `optim` name, a notice or None). Paged optimizers fall back to unpaged without CUDA."""
    if optimizer in BNB_OPTIMIZERS:
        require_bitsandbytes(f"`optimizer: {optimizer}`")
    if optimizer in UNPAGED and not cuda:
        unpaged = UNPAGED[optimizer]
        return unpaged, (f"optimizer {optimizer}: paging needs CUDA, which this machine does not have; using the "
                         f"same update without paging ({unpaged}). Memory spikes cannot page out to the CPU.")
    return optimizer, None
