"""Small callbacks tied to a stage of training: run a function once training begins (after the Trainer has
wrapped the model), stop when eval loss turns up."""

from __future__ import annotations

from transformers import TrainerCallback


class AtTrainBegin(TrainerCallback):
    """Runs `fn(model)` once training begins, after the Trainer has wrapped the model (DeepSpeed engine)."""

    def __init__(self, fn):
        self.fn = fn

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.fn(model)


class EarlyStopOnEvalRise(TrainerCallback):
    """Stop when eval loss has stayed above its best for `patience` evaluations in a row."""

    def __init__(self, patience: int = 2, min_delta: float = 0.0):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad = float("inf"), 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is None:
            return
        if loss < self.best - self.min_delta:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
            if self.bad >= self.patience:
                control.should_training_stop = True
