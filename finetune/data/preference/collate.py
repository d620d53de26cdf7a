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
  margin                 pairs with a margin (`method: reward`): each pair's
  kl                     KTO: a batch of its own (input_ids, labels, attention_mask | position_ids,
                         sequence_index, sequence_lengths) holding each example's prompt with its KL partner's
                         completion (finetune/data/preference/rows.py), in the same order and layout
  sequence_lengths       tokens of each sequence, its prompt included (throughput counts them)
  response_tokens        supervised tokens of each sequence (IPO, SimPO and the SFT terms normalize by them)
  shared_prompt_tokens   rows that share prompts: per pair, the prompt tokens its rejected response does not
                         repeat (sequence_lengths counts them twice; throughput subtracts them)
  target_rows, target_positions, target_ids, target_sequences   rows that share prompts: for every supervised
                         token, the (row, position) whose hidden state predicts it, the token and its sequence
                         (without them, position t predicts the label at t + 1: finetune/model/sequence_logps.py)
  vision_inputs          a vision-language model: what the model reads beside the ids (pixel_values, and what
                         the family adds: Idefics3's pixel_attention_mask, Gemma 3's token_type_ids...), made from
                         each row's images in the order its prompts hold them (finetune/data/vision/collate.py);
                         KTO's `kl` batch has its own

Unpacked, a batch of B pairs is 2B padded rows, every chosen response first, then every rejected one (as TRL
orders them). Packed, each row holds whole pairs, chosen then rejected, back to back. With `share_prompt`
(packed rows of pairs, where the attention path can express it: finetune/train/run.py), a pair is its prompt
once, then chosen, then rejected: [prompt 0..P-1 | chosen P..P+C-1 | rejected P..P+R-1] in position ids, and
the rejected response, starting at position P, attends to the prompt before it and to itself only
(finetune/model/varlen_attention.py), so it scores exactly as after its own copy of the prompt. The prompt's last
position predicts both responses' first tokens, which labels shifted by one cannot say: hence the targets.

A pair's images are its prompt's: every copy of a prompt in a row brings its images (twice for a pair unpacked,
once where the pair shares its prompt), so each row's image tokens and the images given for it agree in number
and order. Every supervised token is a response's, so no image token is ever scored.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.contract import IGNORE_INDEX
from finetune.data.preference.rows import PACKED, UNPACKED

TARGET_KEYS = ("target_rows", "target_positions", "target_ids", "target_sequences")
VISION_INPUTS = "vision_inputs"


@dataclass
class PreferenceCollator:
    store: object  # PairStore
    pad_token_id: int
    flatten: bool = False  # packed rows as one row: what flash-attn's varlen path needs
    share_prompt: bool = False  # packed pairs: the prompt once, both responses after it (see above)
    pixels: object = None  # a vision-language model: the rows' pixel inputs (finetune/data/vision/collate.py Pixels)

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
            if getattr(self.store, "margins", None) is not None:
                batch["margin"] = torch.tensor([self.store.margins[i] for i in items], dtype=torch.float32)
        return batch

    def _batch(self, rows, items, packed: bool, sequences) -> tuple[dict, list]:
        """(the token tensors of every item's `sequences`, the (item, sequence) order of their sequences)."""
        token_rows, order = self._packed(rows, sequences) if packed else self._unpacked(items, sequences)
        tensors = self._tensors(token_rows, order, packed)
        if self.pixels is not None:  # each prompt in a row brings its item's images, in the row's order
            images = getattr(self.store, "images", None)
            row_parts = [[part for k, _, _ in row for part in (images[items[k]] if images else [])]
                         for row in token_rows]
            tensors[VISION_INPUTS] = self.pixels.inputs(tensors["input_ids"], row_parts)
        return tensors, order

    def _unpacked(self, items: list[int], sequences):
        """One row per sequence: every item's first sequence, then every item's second (chosen..., rejected...)."""
        per_item = [sequences(i) for i in items]
        order = [(k, s) for s in range(len(per_item[0])) for k in range(len(items))]
        token_rows = [[(k, per_item[k][s][0], [(s, per_item[k][s][1])])] for k, s in order]
        return token_rows, order

    def _packed(self, rows: list[list[int]], sequences):
        """Rows of segments (item k, prompt, [(sequence s, response), ...]): a segment per sequence, or, sharing,
        one per pair holding both responses."""
        share = self.share_prompt and not self.store.unpaired
        token_rows, order, k = [], [], 0
        for row in rows:
            segments = []
            for item in row:
                pair = sequences(item)
                branches = [(s, response) for s, (_, response) in enumerate(pair)]
                order += [(k, s) for s, _ in branches]
                if share and pair[0][0]:  # a pair with a prompt to share (a prompt is never empty in practice)
                    segments.append((k, pair[0][0], branches))
                else:
                    segments += [(k, prompt, [branch]) for (prompt, _), branch in zip(pair, branches)]
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
        shared, targets = [], []  # sharing: per pair; (row, predicting position, token, sequence) per target
        for r, segments in enumerate(token_rows):
            row_ids, row_labels, row_pos, row_index = [], [], [], []
            for k, prompt, branches in segments:
                row_ids += prompt
                row_labels += [IGNORE_INDEX] * len(prompt)
                row_pos += range(len(prompt))
                row_index += [seq_of[(k, branches[0][0])]] * len(prompt)
                last_prompt = len(row_ids) - 1  # predicts the first token of every response after it
                for s, response in branches:
                    n, start = seq_of[(k, s)], len(row_ids)
                    targets += [(r, last_prompt if j == 0 else start + j - 1, token, n)
                                for j, token in enumerate(response) if j > 0 or last_prompt >= 0]
                    row_ids += response
                    row_labels += response
                    row_pos += range(len(prompt), len(prompt) + len(response))
                    row_index += [n] * len(response)
                    lengths[n], answers[n] = len(prompt) + len(response), len(response)
                shared.append(len(prompt) * (len(branches) - 1))
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
        if any(shared):
            batch["shared_prompt_tokens"] = torch.tensor(shared)
            columns = torch.tensor(targets, dtype=torch.long).reshape(-1, 4).T
            for name, column in zip(TARGET_KEYS, columns):
                batch[name] = column
        return batch
