"""Batches for the Trainer: pad (or flatten) rows of `input_ids`, `labels` and, when packed, `position_ids`.

Unpacked rows get an `attention_mask` that hides the right padding. Packed rows get NO attention_mask:
transformers then reads example boundaries from `position_ids` (a restart at 0 starts a new example) and
builds a block-diagonal causal mask (sdpa, eager) or calls flash-attn's variable-length kernel. Padding
at the end of a packed row is given positions 0, 1, ... of its own, so it is one more isolated "example"
whose labels are all -100.

flash_attention_2 reads boundaries from position_ids only for a batch of ONE row, so for it the collator
flattens the micro batch into a single row (no padding at all). Rows are packed when they carry
`position_ids`. Other columns (`length`) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.contract import IGNORE_INDEX


def _pad(rows: list[list[int]], width: int, value: int) -> list[list[int]]:
    return [list(row) + [value] * (width - len(row)) for row in rows]


@dataclass
class Collator:
    pad_token_id: int
    flatten: bool = False  # one row per batch: what flash-attn's varlen path needs
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict:
        import torch

        ids = [f["input_ids"] for f in features]
        labels = [f["labels"] for f in features]
        packed = "position_ids" in features[0]  # train and eval may differ (eval_sample_packing)
        if packed and self.flatten:
            positions = [p for f in features for p in f["position_ids"]]
            return {
                "input_ids": torch.tensor([[t for row in ids for t in row]]),
                "labels": torch.tensor([[t for row in labels for t in row]]),
                "position_ids": torch.tensor([positions]),
            }
        width = max(len(row) for row in ids)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {
            "input_ids": torch.tensor(_pad(ids, width, self.pad_token_id)),
            "labels": torch.tensor(_pad(labels, width, IGNORE_INDEX)),
        }
        if packed:
            batch["position_ids"] = torch.tensor(
                [list(f["position_ids"]) + list(range(width - len(f["position_ids"]))) for f in features]
            )
        else:
            batch["attention_mask"] = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        return batch
