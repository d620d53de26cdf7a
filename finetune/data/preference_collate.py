"""Batches for preference tuning: rows of pair ids -> token tensors, one flat list of sequences.

Every batch, packed or not, says the same things, so the loss has one code path (finetune/train/preference.py):
  input_ids, labels      labels are -100 on prompts and padding: only response tokens are scored
  attention_mask         unpacked rows (right padding)
  position_ids           packed rows: restarting at 0 at each sequence, which isolates them (the packing guard
                         proves it on the model before training)
  sequence_index         for every token, which of the batch's sequences it belongs to (-1: padding)
  pair_ids               the items' global ids (first key: the Trainer's evaluation counts a batch by it)
  chosen_index, rejected_index   pairs: the sequence of each pair's chosen and rejected response
  label                  KTO: whether each example's completion is desirable
  kl                     KTO: a batch of its own (input_ids, labels, attention_mask | position_ids,
                         sequence_index, sequence_lengths) holding each example's prompt with its KL partner's
                         completion (finetune/data/preference_rows.py), in the same order and layout
  sequence_lengths       real tokens of each sequence (throughput counts them)
  response_tokens        supervised tokens of each sequence (IPO, SimPO and the SFT terms normalize by them)

Unpacked, a batch of B pairs is 2B padded rows, every chosen response first, then every rejected one (as TRL
orders them). Packed, each row holds whole pairs, chosen then rejected, back to back.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.contract import IGNORE_INDEX
from finetune.data.preference_rows import PACKED, UNPACKED


@dataclass
class PreferenceCollator:
    store: object  # PairStore
    pad_token_id: int
    flatten: bool = False  # packed rows as one row: what flash-attn's varlen path needs

    def __call__(self, features: list[dict]) -> dict:
        packed = PACKED in features[0]
        rows = [f[PACKED if packed else UNPACKED] for f in features]
        items = [item for row in rows for item in row]
        import torch

        tensors, order = self._batch(rows, items, packed, self.store.sequences)
        batch = {"pair_ids": torch.tensor(items), **tensors}
        if self.store.unpaired:
            batch["label"] = torch.tensor([self.store.labels[i] for i in items])
            batch["kl"] = self._batch(rows, items, packed, self.store.kl_sequences)[0]
        else:
            seq_of = {key: n for n, key in enumerate(order)}
            batch["chosen_index"] = torch.tensor([seq_of[(k, 0)] for k in range(len(items))])
            batch["rejected_index"] = torch.tensor([seq_of[(k, 1)] for k in range(len(items))])
        return batch

    def _batch(self, rows, items, packed: bool, sequences) -> tuple[dict, list]:
        """(the token tensors of every item's `sequences`, the (item, sequence) order of their sequences)."""
        token_rows, order = self._packed(rows, sequences) if packed else self._unpacked(items, sequences)
        return self._tensors(token_rows, order, packed), order

    def _unpacked(self, items: list[int], sequences):
        """One row per sequence: every item's first sequence, then every item's second (chosen..., rejected...)."""
        per_item = [sequences(i) for i in items]
        order = [(k, s) for s in range(len(per_item[0])) for k in range(len(items))]
        token_rows = [[(k, s, *per_item[k][s])] for k, s in order]
        return token_rows, order

    def _packed(self, rows: list[list[int]], sequences):
        token_rows, order, k = [], [], 0
        for row in rows:
            segments = []
            for item in row:
                for s, (prompt, response) in enumerate(sequences(item)):
                    segments.append((k, s, prompt, response))
                    order.append((k, s))
                k += 1
            token_rows.append(segments)
        if self.flatten:
            token_rows = [[segment for row in token_rows for segment in row]]
        return token_rows, order

    def _tensors(self, token_rows, order, packed: bool) -> dict:
        import torch

        seq_of = {key: n for n, key in enumerate(order)}
        ids, labels, positions, index = [], [], [], []
        lengths, answers = [0] * len(order), [0] * len(order)
        for segments in token_rows:
            row_ids, row_labels, row_pos, row_index = [], [], [], []
            for k, s, prompt, response in segments:
                n = seq_of[(k, s)]
                row_ids += prompt + response
                row_labels += [IGNORE_INDEX] * len(prompt) + list(response)
                row_pos += range(len(prompt) + len(response))
                row_index += [n] * (len(prompt) + len(response))
                lengths[n], answers[n] = len(prompt) + len(response), len(response)
            ids.append(row_ids), labels.append(row_labels), positions.append(row_pos), index.append(row_index)
        width = max(len(row) for row in ids)
        pad = [width - len(row) for row in ids]
        batch = {"input_ids": torch.tensor([row + [self.pad_token_id] * p for row, p in zip(ids, pad)])}
        batch["labels"] = torch.tensor([row + [IGNORE_INDEX] * p for row, p in zip(labels, pad)])
        if packed:  # padding gets positions of its own: one more isolated "sequence" with nothing supervised
            batch["position_ids"] = torch.tensor([list(row) + list(range(p)) for row, p in zip(positions, pad)])
        else:
            batch["attention_mask"] = torch.tensor([[1] * len(row) + [0] * p for row, p in zip(ids, pad)])
        batch["sequence_index"] = torch.tensor([row + [-1] * p for row, p in zip(index, pad)])
        batch["sequence_lengths"] = torch.tensor(lengths)
        batch["response_tokens"] = torch.tensor(answers)
        return batch
