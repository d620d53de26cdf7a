"""Every reward of a GRPO recipe as one object: its functions (worker processes, finetune/train/grpo/rewards.py) and
its reward models (here, in the training process).

    rewards = RewardSet(recipe.rewards, base_dir=Path.cwd(), device=args.device, dtype="bf16")
    batch = rewards.score(prompts, completions, completion_ids, columns={...})   # a RewardBatch, in the recipe's order
    rewards.names, rewards.weights, rewards.normalize
    rewards.failure_summary(); rewards.never_valued(); rewards.close()

A reward model (`rewards: [{model: FOLDER, weight, max_length, batch_size, normalize}]`) is loaded once, on the
training device, in the run's precision, and scores each step's completions there, batched, without gradients
(finetune/model/scorer.py): each (prompt, completion) is rendered with the reward model's own tokenizer, template and
EOS, from the prompt record and the completion's decoded text, and cut at its max_length as it trained, so the score
head reads the position it was trained on (not the policy's tokens, not text without its end: TRL PR #5813). Its
value is the score as it comes (a logit); `normalize: true` z-scores it within each group before the weighted sum
(finetune/train/grpo/advantages.py), so it does not drown 0/1 rewards beside it. A reward model that fails (out of
memory) stops the run: unlike a user's function, it is not expected to fail on some batches.
"""

from __future__ import annotations

from collections import Counter

from finetune.log import get_logger
from finetune.train.grpo.rewards import RewardBatch, RewardRunner, as_spec, unique_names

log = get_logger(__name__)


class RewardSet:
    """The recipe's rewards, functions and models, scored together. Close it (or use `with`)."""

    def __init__(self, specs, base_dir, device=None, dtype: str = "fp32", workers: int = 1,
                 counted_in: str | None = "run.json"):
        from finetune.model.scorer import RewardScorer

        self.specs = [as_spec(s) for s in specs]
        self.names = unique_names(self.specs)
        self.weights = [s.weight for s in self.specs]
        self.normalize = [s.normalize for s in self.specs]
        self._functions = [i for i, s in enumerate(self.specs) if s.function]
        self.scorers, self.calls, self._cut = {}, Counter(), {}
        for i, spec in enumerate(self.specs):
            if spec.model:
                self.scorers[i] = RewardScorer.load(spec.model, device, dtype, spec.batch_size, spec.max_length,
                                                    label=self.names[i])
                log.info(f"reward model `{self.names[i]}` ({spec.model}): {self.scorers[i].scoring.describe()}; "
                         f"batches of {spec.batch_size}, on {device or 'cpu'}")
        self.runner = None
        if self._functions:
            # with a reward model beside them, the functions failing does not leave the run without a reward
            more = {"max_failed_steps": 10**9} if self.scorers else {}
            self.runner = RewardRunner([self.specs[i] for i in self._functions], base_dir, workers,
                                       counted_in=counted_in, names=[self.names[i] for i in self._functions], **more)

    def __enter__(self) -> RewardSet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
        self._cut.update({i: scorer.cut for i, scorer in self.scorers.items()})
        self.scorers.clear()  # the reward models' memory goes with them

    @property
    def closed(self) -> bool:
        return not self.scorers and (self.runner is None or self.runner.closed)

    def score(self, prompts: list, completions: list, completion_ids: list, columns: dict | None = None,
              trainer_state: dict | None = None) -> RewardBatch:
        """Every reward's values for a batch (RewardRunner.score's arguments), NaN where a function gave none."""
        values: list = [None] * len(self.specs)
        batch = RewardBatch(list(self.names), values)
        if self.runner is not None:
            ran = self.runner.score(prompts, completions, completion_ids, columns, trainer_state)
            for k, i in enumerate(self._functions):
                values[i] = ran.values[k]
            batch.failures, batch.printed, batch.metrics, batch.extra = ran.failures, ran.printed, ran.metrics, ran.extra
        for i, scorer in self.scorers.items():
            values[i] = scorer.score(prompts, completions) if prompts else []
            self.calls[self.names[i]] += 1
        return batch

    def never_valued(self) -> list[str]:
        return self.runner.never_valued() if self.runner is not None else []

    def failure_summary(self) -> dict:
        """For run.json: the functions' (rewards.py), and each reward model's calls and completions cut to fit."""
        summary = self.runner.failure_summary() if self.runner is not None else {}
        for i, spec in enumerate(self.specs):
            if spec.model:
                name = self.names[i]
                cut = self.scorers[i].cut if i in self.scorers else self._cut.get(i, 0)
                summary[name] = {"model": spec.model, "calls": self.calls[name], "calls_with_a_value": self.calls[name],
                                 "failures": {}, "first_messages": {}, "completions_cut_to_max_length": cut}
        return {name: summary[name] for name in self.names}


def check_model_prompts(recipe, conversational: bool) -> None:
    """Before a run's model loads: ModelError when a reward model cannot read the run's prompts (one trained on
    plain-text pairs, given conversations)."""
    from finetune.errors import ModelError
    from finetune.model.scorer import read_scoring

    for name, spec in zip(unique_names(recipe.rewards), recipe.rewards):
        if spec.model and conversational and read_scoring(spec.model).conversational is False:
            raise ModelError(f"the reward model `{name}` ({spec.model}) was trained on plain-text pairs, and this run's "
                             "prompts are conversations: it would score text in a format it never saw. Train it on "
                             "conversational pairs, or give the run text prompts")
