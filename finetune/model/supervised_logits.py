"""Training logits only where the loss looks: the LM head and the cross-entropy skip unsupervised positions.

A causal LM's head turns every position's hidden state into a row of vocabulary logits, and the loss then
throws away every row whose next token is not supervised (prompts, system text, padding, the first token
of each packed example). On SmolLM2-135M the head is 28 M of the model's 135 M weights and its logits for
a 2 x 512 batch are 200 MB; in chat data about a third of positions are supervised. So during training we
gather the hidden states of the supervised positions first and run the head and the loss on those alone:
the same loss and the same gradients (the dropped rows contribute exactly zero), less compute and memory.

Done with public hooks on the model (no subclass, nothing patched): a forward pre-hook on the causal LM
reads `labels`, a pre-hook on the output embeddings gathers the rows, and the model's `loss_function`
(a documented, settable attribute) is handed the matching targets as `shift_labels`. Only in training
mode and only when `labels` are passed; evaluation, generation and probes see the usual full logits.
`attach` proves on the real model, with a short input, that the loss is unchanged before enabling it.

Chunks: with a 49k-256k vocabulary even the supervised rows' logits are large (4,096 supervised tokens x
152k vocabulary x 4 bytes = 2.5 GB of fp32 logits, plus their gradient). When there are more supervised
rows than one chunk holds, the head is handed zero rows, and the loss runs the head + cross-entropy chunk
by chunk, each chunk under non-reentrant activation checkpointing: a chunk's logits are freed as soon as
its loss is summed and recomputed in the backward pass, so at most one chunk's logits exist at a time,
for one extra head matmul. Same loss (a sum of the same terms, divided the same way) and same gradients.
Not under DeepSpeed ZeRO-3 or FSDP2: every call of its partitioned head is a collective, so every process must call
it as often as the others; there the head runs once, in the forward, on all the supervised rows.
"""

from __future__ import annotations

from finetune.compat import set_loss_function, zero3_partitioned
from finetune.contract import IGNORE_INDEX

MAX_LOSS_DIFFERENCE = 1e-4  # relative; fp32 sums over the same terms in a different order differ ~1e-7
# At most 2**26 logits a chunk: 256 MiB in fp32, e.g. 1,365 rows of a 49,152 vocabulary, 441 of 152,064.
CHUNK_LOGITS = 2**26
PROBE_CHUNK_ROWS = 4  # the probe's ~11 supervised rows then go through 3 chunks: the chunked path is proven too


def sharded_head(module) -> bool:
    """Is the LM head sharded by an engine that gathers it per call? ZeRO-3 partitions its weight; FSDP2
    (accelerate puts the head and the final norm in a unit of their own) makes it an FSDPModule."""
    from torch.distributed.fsdp import FSDPModule

    return zero3_partitioned(module) or isinstance(module, FSDPModule)


class SupervisedLogits:
    """The hooks' shared state for one forward pass."""

    def __init__(self, causal_lm, chunk_rows: int | None = None):
        self.causal_lm = causal_lm
        self.default_loss = causal_lm.loss_function
        self.mask = None  # (batch, seq) bool: positions whose next token is supervised
        self.targets = None  # the supervised next tokens, in mask order
        self.gathered = False
        self.chunk_hidden = None  # the supervised rows' hidden states when the loss runs them in chunks
        self.head = causal_lm.get_output_embeddings()
        self.chunk_rows = chunk_rows or max(1, CHUNK_LOGITS // causal_lm.config.get_text_config().vocab_size)
        self.handles = [
            causal_lm.register_forward_pre_hook(self._read_labels, with_kwargs=True),
            self.head.register_forward_pre_hook(self._gather),
            causal_lm.register_forward_hook(self._reset, always_call=True),
        ]
        set_loss_function(causal_lm, self._loss)

    def _read_labels(self, module, args, kwargs):
        labels = kwargs.get("labels")
        if module.training and labels is not None and labels.dim() == 2:
            import torch

            shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]
            self.mask = shifted != IGNORE_INDEX
            self.targets = shifted[self.mask]
        return None

    def _gather(self, module, args):
        hidden = args[0]
        if self.mask is None or self.gathered or tuple(hidden.shape[:-1]) != tuple(self.mask.shape):
            return None  # not training with labels, or a sliced / reshaped call: leave it alone
        self.gathered = True
        rows = hidden[self.mask]
        # not under ZeRO-3 or FSDP2: each call of its partitioned head is a collective, and processes whose batches
        # hold different numbers of supervised rows would make different numbers of chunks (a hang); a recomputed
        # chunk would also find the gathered weight freed. There the head runs once, here, on all the supervised rows.
        if rows.shape[0] > self.chunk_rows and not sharded_head(module):
            self.chunk_hidden = rows
            return (rows[:0], *args[1:])  # the head makes no logits here; the loss makes them chunk by chunk
        return (rows, *args[1:])

    def _loss(self, logits, labels, vocab_size, **kwargs):
        if self.chunk_hidden is not None and logits.dim() == 2 and logits.shape[0] == 0:
            return self._chunked_loss(vocab_size, **kwargs)
        if self.gathered and logits.dim() == 2 and logits.shape[0] == self.targets.shape[0]:
            kwargs["shift_labels"] = self.targets
        return self.default_loss(logits=logits, labels=labels, vocab_size=vocab_size, **kwargs)

    def _chunked_loss(self, vocab_size, num_items_in_batch=None, **kwargs):
        """The model's own loss, summed chunk by chunk, divided as it divides: by num_items_in_batch when the
        Trainer passes it, else by the number of supervised tokens (its mean)."""
        import torch
        from torch.utils.checkpoint import checkpoint

        hidden, targets = self.chunk_hidden, self.targets
        # equal chunks (1,366 rows at most 1,365 a chunk: 683 + 683, not 1,365 + 1)
        chunks = -(-hidden.shape[0] // self.chunk_rows)
        size = -(-hidden.shape[0] // chunks)
        total = 0.0
        for start in range(0, hidden.shape[0], size):
            rows = slice(start, start + size)
            total = total + checkpoint(self._chunk_loss_sum, hidden[rows], targets[rows], vocab_size, kwargs,
                                       use_reentrant=False)
        if num_items_in_batch is None:
            return total / targets.shape[0]
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def _chunk_loss_sum(self, hidden, targets, vocab_size, kwargs):
        logits = self.head(hidden)  # _gather leaves it alone: this forward is past (or outside) the gathering
        # num_items_in_batch=1: the model's loss in "sum" reduction (it divides the sum by that number)
        return self.default_loss(logits=logits, labels=None, vocab_size=vocab_size, shift_labels=targets,
                                 num_items_in_batch=1, **kwargs)

    def _reset(self, *_):
        self.mask = self.targets = self.chunk_hidden = None
        self.gathered = False

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        set_loss_function(self.causal_lm, self.default_loss)
        self._reset()


def _probe_loss(model, batch: dict, seed: int):
    import torch

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)  # the same dropout masks for both runs
        return model(**batch).loss.float().item()


def attach(model, seed: int = 0) -> SupervisedLogits | None:
    """Enable supervised-only logits on `model` if a short probe shows the loss unchanged; else None.
    Under DeepSpeed ZeRO-3, call it once the engine exists (the probe is a forward pass)."""
    import torch

    from finetune.model import base_causal_lm

    causal_lm = base_causal_lm(model)  # its forward takes `labels` and calls the head
    if not hasattr(causal_lm, "loss_function") or causal_lm.get_output_embeddings() is None:
        return None
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.config.get_text_config().vocab_size, (2, 12), generator=gen).to(device)
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX  # a prompt
    labels[1, 9:] = IGNORE_INDEX  # padding at the end of the second row
    batch = {"input_ids": ids, "labels": labels}
    was_training = model.training
    model.train()
    try:
        full = _probe_loss(model, batch, seed)
        hooks = SupervisedLogits(causal_lm)
        chunk_rows, hooks.chunk_rows = hooks.chunk_rows, PROBE_CHUNK_ROWS
        try:
            chunked = _probe_loss(model, batch, seed)
            hooks.chunk_rows = labels.numel()  # one chunk: the head on all supervised rows at once
            gathered = _probe_loss(model, batch, seed)
        except Exception:  # a model whose forward does not fit the hooks: keep the standard path
            hooks.detach()
            return None
        hooks.chunk_rows = chunk_rows
    finally:
        model.train(was_training)
    tolerance = MAX_LOSS_DIFFERENCE * max(abs(full), 1.0)
    if not (abs(gathered - full) <= tolerance and abs(chunked - full) <= tolerance):
        hooks.detach()
        return None
    return hooks

