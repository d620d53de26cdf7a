"""A reward model's score head: which module it is, and the score of each sequence of a batch at the position it was
trained on.

A reward model is the base's own `*ForSequenceClassification` class with one output (transformers'
AutoModelForSequenceClassification, `num_labels=1`): the decoder, then a Linear `score` head (hidden -> 1) on every
position. transformers' own forward pools it at "the rightmost token that is not the pad token", which is wrong in
two ways this module avoids:

  pad = EOS     a tokenizer without a pad token pads with EOS (finetune/model/loader.py, TRL's default too), and a
                plain-text sequence ends with the EOS it was trained to summarise: the pooling skips that EOS and
                reads the token before it (transformers #35352), so a padded batch and the sequence alone disagree
  packed rows   a row holds several sequences (and a pair may share its prompt): one pooled position per row is
                one sequence's score at most

Here the score of a sequence is the head's output at that sequence's LAST token, found from the batch's
`sequence_index` (finetune/data/preference/collate.py: which sequence each token belongs to, -1 on padding), never
from the pad id: the same position whether the sequence is alone, padded, packed or after a shared prompt. The forward
is the model's own (DDP / DeepSpeed wrappers included, so their hooks run); a forward hook on the head keeps its
per-position output, one number a position, and the sequences' last positions are gathered from it.

The scorer (finetune/model/scorer.py) scores (prompt, completion) texts with these functions; the reward trainer
(finetune/train/reward/) trains with them.
"""

from __future__ import annotations

from finetune.errors import ModelError

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def head_name(model) -> str:
    """The attribute of a sequence-classification model that holds its score head (`score` in the decoder families;
    the child that is not the decoder). `model`: the transformers model, not a PEFT wrapper."""
    prefix = getattr(model, "base_model_prefix", "model")
    heads = [name for name, _ in model.named_children() if name != prefix]
    if len(heads) != 1:
        raise ModelError(f"{type(model).__name__} is not a sequence-classification model with one score head beside "
                         f"its decoder `{prefix}` (its parts: {', '.join(n for n, _ in model.named_children())})")
    return heads[0]


def score_module(model):
    """The score head module. Under a PEFT model it is peft's modules_to_save wrapper, whose forward runs the
    trained copy (or, with the adapter switched off, the head the run started from)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return getattr(base, head_name(base))


def last_positions(sequence_index, sequences: int):
    """(rows, positions) of each sequence's last token: the largest flat index whose `sequence_index` is the
    sequence's. Every sequence must have a token."""
    import torch

    flat = sequence_index.reshape(-1)
    kept = flat >= 0
    index = torch.arange(flat.numel(), device=flat.device)[kept]
    last = torch.full((sequences,), -1, dtype=torch.long, device=flat.device)
    last = last.scatter_reduce(0, flat[kept].long(), index, reduce="amax")
    if bool((last < 0).any()):
        raise ValueError("a sequence of the batch has no token: its score has no position")
    width = sequence_index.shape[-1]
    return last // width, last % width


class _Keep:
    """Forward hook: keep the head's input (batch, seq, hidden) and output (batch, seq, 1) of the first call."""

    def __init__(self):
        self.input = self.output = None

    def __call__(self, module, args, output):
        if self.output is None:
            self.input, self.output = args[0], output


def _forward(model, batch: dict) -> _Keep:
    keep = _Keep()
    handle = _head_of(model).register_forward_hook(keep)
    try:
        model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}, use_cache=False)
    finally:
        handle.remove()
    if keep.output is None:
        raise RuntimeError("the score head was not called in the forward pass")
    return keep


def sequence_scores(model, batch: dict):
    """(S,) fp32: each sequence's score at its last token. `model` is what is called (wrapped or not); `batch` has
    input_ids, attention_mask or position_ids, sequence_index and sequence_lengths (S = its length)."""
    import torch

    keep = _forward(model, batch)
    rows, positions = last_positions(batch["sequence_index"].to(keep.output.device), len(batch["sequence_lengths"]))
    return keep.output[rows, positions, 0].to(torch.float32)


def _head_of(model):
    """The head module whose forward runs: through DDP / DeepSpeed wrappers and a PEFT model."""
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "base_model_prefix") and not hasattr(inner, "peft_config"):
        inner = inner.module  # DistributedDataParallel, DeepSpeedEngine
    return score_module(inner)


class HiddenStates:
    """A reward model as the packing guard reads a causal LM (finetune/model/isolation.py): called, it answers
    `.logits` = the hidden states its score head reads at every position (batch, seq, hidden); the model's own logits
    are one pooled number a row, which cannot show one sequence of a row seeing another."""

    def __init__(self, model):
        self.model, self.config = model, model.config

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def parameters(self):
        return self.model.parameters()

    def __call__(self, **inputs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=_forward(self.model, inputs).input)
