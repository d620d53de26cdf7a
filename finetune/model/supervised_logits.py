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
"""

from __future__ import annotations

from finetune.contract import IGNORE_INDEX

MAX_LOSS_DIFFERENCE = 1e-4  # relative; fp32 sums over the same terms in a different order differ ~1e-7


class SupervisedLogits:
    """The hooks' shared state for one forward pass."""

    def __init__(self, causal_lm):
        self.causal_lm = causal_lm
        self.default_loss = causal_lm.loss_function
        self.mask = None  # (batch, seq) bool: positions whose next token is supervised
        self.targets = None  # the supervised next tokens, in mask order
        self.gathered = False
        head = causal_lm.get_output_embeddings()
        self.handles = [
            causal_lm.register_forward_pre_hook(self._read_labels, with_kwargs=True),
            head.register_forward_pre_hook(self._gather),
            causal_lm.register_forward_hook(self._reset, always_call=True),
        ]
        causal_lm.loss_function = self._loss

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
        return (hidden[self.mask], *args[1:])

    def _loss(self, logits, labels, vocab_size, **kwargs):
        if self.gathered and logits.dim() == 2 and logits.shape[0] == self.targets.shape[0]:
            kwargs["shift_labels"] = self.targets
        return self.default_loss(logits=logits, labels=labels, vocab_size=vocab_size, **kwargs)

    def _reset(self, *_):
        self.mask = self.targets = None
        self.gathered = False

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.causal_lm.loss_function = self.default_loss
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
    ids = torch.randint(1, model.config.vocab_size, (2, 12), generator=gen).to(device)
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX  # a prompt
    labels[1, 9:] = IGNORE_INDEX  # padding at the end of the second row
    batch = {"input_ids": ids, "labels": labels}
    was_training = model.training
    model.train()
    try:
        full = _probe_loss(model, batch, seed)
        hooks = SupervisedLogits(causal_lm)
        try:
            gathered = _probe_loss(model, batch, seed)
        except Exception:  # a model whose forward does not fit the hooks: keep the standard path
            hooks.detach()
            return None
    finally:
        model.train(was_training)
    if not abs(gathered - full) <= MAX_LOSS_DIFFERENCE * max(abs(full), 1.0):
        hooks.detach()
        return None
    return hooks

