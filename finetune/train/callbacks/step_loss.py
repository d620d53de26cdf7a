"""Every optimizer step's training loss, for the learning curve, without a host read per step.

A forward hook on the model keeps each training micro-batch's loss as a device tensor; at the end of an
optimizer step they are combined into that step's loss (still on the device). The values travel to the host
in one transfer when the Trainer logs (it reads its own loss then anyway), when a checkpoint is saved (so a run
that stops before its end keeps every step up to its checkpoint) and at the end of training. They are stored in
the log history (`step_losses`: [[step, loss], ...] on the logged entry, or an entry of their own), so run.json
and every checkpoint's trainer_state.json carry them, and a resumed run keeps the steps before the resume.

The combination mirrors HF Trainer's own logged loss: with `num_items_in_batch` (token-averaged loss over
the accumulated micro-batches) each micro-batch loss is already divided by the step's token count, so they
add up; otherwise each is a mean and the step's loss is their mean. Several processes: the mean over them.
"""

from __future__ import annotations

from transformers import TrainerCallback

KEY = "step_losses"


class StepLossCallback(TrainerCallback):
    def __init__(self):
        self._micro: list = []  # device scalars of the current optimizer step
        self._token_averaged = False
        self._pending: list[tuple[int, object]] = []  # (step, device scalar) not yet read
        self._handle = None
        self._scale = 1  # HF multiplies a token-averaged loss by the process count before logging it

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and self._handle is None:
            self._handle = model.register_forward_hook(self._keep, with_kwargs=True)
        self._scale = max(args.world_size, 1) if args.average_tokens_across_devices else 1

    def _keep(self, module, args, kwargs, output):
        import torch

        if not module.training or not torch.is_grad_enabled():
            return  # evaluation, probes
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is not None:
            self._micro.append(loss.detach().float())
            self._token_averaged = kwargs.get("num_items_in_batch") is not None

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        if not self._micro:
            return
        stacked = torch.stack(self._micro)
        step_loss = stacked.sum() * self._scale if self._token_averaged else stacked.mean()
        self._pending.append((state.global_step, step_loss))
        self._micro = []
        if control.should_save:
            self._into_history(state)

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_save:  # the checkpoint callback (before this one) saves at the end of an epoch
            self._into_history(state)

    def _into_history(self, state) -> None:
        """The steps not logged yet, as an entry of their own: into the checkpoint's trainer_state.json, so a run
        that stops later keeps every step up to its checkpoint."""
        pairs = self._flush()
        if pairs:
            state.log_history.append({"step": state.global_step, KEY: pairs})

    def _flush(self) -> list[list]:
        """[[step, loss], ...] for the steps since the last flush: one host transfer, mean over processes."""
        import torch

        if not self._pending:
            return []
        values = torch.stack([loss for _, loss in self._pending])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM)  # every rank logs
            values = values / torch.distributed.get_world_size()
        pairs = [[step, loss] for (step, _), loss in zip(self._pending, values.cpu().tolist())]
        self._pending = []
        return pairs

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        pairs = self._flush()
        if pairs and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1][KEY] = pairs  # the history only: reporters take scalars

    def on_train_end(self, args, state, control, **kwargs):
        self._into_history(state)  # the steps after the last log
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
