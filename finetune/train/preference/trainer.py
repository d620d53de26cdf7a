"""Preference tuning with the HF Trainer: one subclass, through its public hooks only.

    compute_loss        per-sequence response log-probs (finetune/model/sequence_logps.py), the method's
                        per-pair losses (finetune/train/preference_objective.py), normalized over the STEP
    get_batch_samples   counts what a step normalizes by: pairs (KTO: examples) and chosen-response tokens,
                        over every micro batch of the optimizer step and every process
    (KTO)               a no-grad pass over each micro batch's mismatched sequences gives the KL estimate z
    prediction_step     evaluation: the same loss, no logits
    log                 the metrics people know (rewards/chosen, rewards/margins, rewards/accuracies, logps/...),
                        averaged over the pairs since the last log, eval_-prefixed on the eval split

Why over the step: with packing, micro batches hold different numbers of pairs, so a mean per micro batch would
weigh pairs unequally; summing per-pair losses and dividing by the pairs of the whole optimizer step (all
processes) gives every pair the same weight, packed or not, one process or several. DDP and DeepSpeed average
gradients over processes, so each process's loss is multiplied by their number (the sum is then exact).

The reference table (finetune/train/preference/reference.py) is computed at the first loss, through the model as the
Trainer holds it, for the items the run reads (items_used: every eval item, the train items of its steps in the
Trainer's own order), unless the run found them cached. Its time is the reference pass's, not the eval's or the training's:
taken off the `eval_runtime` / `train_runtime` it fell in (and their per-second rates), logged as
`reference_pass_s`, and off the throughput callback's clock.

The eval before training needs no forward pass: until the first training step the policy IS the reference (the
same model, in eval mode, as the reference pass scored it), so its log-probs are the table's rows and the eval
costs what reading them costs (DPO's loss exactly log 2, every reward 0), not a pass over the eval split on top
of the reference pass (issue 33, item 3: DPO's eval before training took 293.8 s against 57.7 s after).
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import Trainer

from finetune.log import get_logger
from finetune.train.callbacks.throughput import ThroughputCallback
from finetune.train.metric_sums import MetricSums
from finetune.train.micro_batches import take

log = get_logger(__name__)


class PreferenceTrainer(Trainer):
    def __init__(self, *args, objective, store, head, full_logits, reference=None, reference_path=None,
                 reference_batch_tokens: int = 4096, reference_collator=None, resumed: bool = False, unrebuildable: str | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.reference_collator = reference_collator or self.data_collator  # unwrapped: not counted as training
        self.objective, self.store, self.head, self.full_logits = objective, store, head, full_logits
        self.reference, self.reference_path = reference, reference_path
        self.resumed = resumed  # a resumed run's model is no longer the starting one: it scores missing rows
        self.unrebuildable = unrebuildable  # only with its adapter switched off, where that is the starting model
        self.reference_ready = False  # the table holds every row the run reads (checked at the first loss)
        self.reference_batch_tokens = reference_batch_tokens
        self.reference_seconds = None  # how long the reference pass took (None: read from the cache / not needed)
        self.reference_items = None  # {"read": items the run reads, "scored": those its pass scored (not cached)}
        self._reference_unlogged = 0.0  # reference-pass seconds inside a runtime not yet logged
        self.policy_is_reference = True  # until the first training step: the model scores as the reference did
        self.loss_is_scaled_for_ga = True  # compute_loss normalizes over the whole step itself
        self._sums = MetricSums()

    # --- the step's counts ---------------------------------------------------------------------------------
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches = take(epoch_iterator, num_batches)
        counts = torch.tensor(_step_counts(self.objective, batches), dtype=torch.float64, device=device)
        if self.args.world_size > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return batches, counts

    # --- the loss --------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if callable(self.full_logits):  # ZeRO-3: the probes wait for the engine's weights (finetune/train/run.py)
            self.full_logits = bool(self.full_logits(self.model))
        if self.objective.needs_reference and not self.reference_ready:
            self.reference = self._reference_table(model)
            self.reference_ready = True
        if model.training:
            self.policy_is_reference = False
        from finetune.model.sequence_logps import response_logps

        ref = kl = None
        if self.objective.needs_reference:
            ref = self.reference.to(inputs["input_ids"].device)[inputs["pair_ids"]]
        known = ref is not None and self.policy_is_reference and not model.training  # the eval before training
        if self.objective.needs_kl:  # KTO's reference point: the mismatched sequences, scored without gradient
            if known:
                policy_kl = ref[:, 1].clone()
            else:
                with torch.no_grad():
                    policy_kl = response_logps(model, self.head, inputs["kl"], self.full_logits)
            kl = self.objective.kl_estimate(policy_kl, ref[:, 1], self._mean_over_processes)
        logps = _as_policy(ref, inputs, self.objective) if known else response_logps(model, self.head, inputs,
                                                                                     self.full_logits)
        terms = self.objective.terms(logps, ref, inputs, kl)
        if num_items_in_batch is None:  # evaluation, or a caller without the step's counts: this batch alone
            counts, scale = torch.tensor(self.objective.counts(inputs), dtype=torch.float64), 1
        else:
            counts, scale = num_items_in_batch, self.accelerator.num_processes
        loss = self.objective.combine(terms, counts.to(logps.device), scale)
        self._sums.add(terms.metrics, "train" if model.training else "eval")
        return (loss, {}) if return_outputs else loss

    def _mean_over_processes(self, value):
        return self.accelerator.gather(value).mean() if self.accelerator.num_processes > 1 else value

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def items_used(self) -> list[int]:
        """Every item this run reads: the eval split's, and the train items of the micro batches its optimizer steps
        take. A run of at least an epoch reads every train item; a shorter one the first steps x accumulation micro
        batches of the Trainer's own train dataloader (its seeded sampler: the order training and a resumed run go
        through), every process's, exact with packing (a row's items)."""
        import math

        from accelerate.data_loader import SeedableRandomSampler, get_sampler

        from finetune.data.preference.rows import PACKED, UNPACKED
        from finetune.train.preference.reference import items_in_rows

        train, evaluated = list(self.store.split_ids("train")), list(self.store.split_ids("eval"))
        loader = self.get_train_dataloader()
        per_epoch = math.ceil(len(loader) / self.args.gradient_accumulation_steps)
        steps = self.args.max_steps if self.args.max_steps > 0 else math.ceil(self.args.num_train_epochs * per_epoch)
        if steps >= per_epoch or not isinstance(get_sampler(loader), SeedableRandomSampler):  # group_by_length: all
            return train + evaluated
        micro_batches = steps * self.args.gradient_accumulation_steps
        column = PACKED if PACKED in self.train_dataset.column_names else UNPACKED
        rows = []
        for index, batch in enumerate(loader.batch_sampler):  # indices only: no collating, no tensors
            if index == micro_batches:
                break
            rows += [self.train_dataset[int(i)][column] for i in batch]
        if self.accelerator.num_processes > 1:
            import torch.distributed as dist

            shares = [None] * self.accelerator.num_processes
            dist.all_gather_object(shares, rows)
            rows = [row for share in shares for row in share]
        return items_in_rows(rows) + evaluated

    def _reference_table(self, model):
        """The table with a row for every item the run reads: the cached one, completed by one no-grad pass over
        the rows it lacks (all of them without a cache)."""
        from finetune.errors import DataError
        from finetune.train.preference.reference import compute_table, progress_reporter, save_table, unscored

        if self.reference is not None and not torch.isnan(self.reference).any():  # every row: nothing to look up
            return self.reference
        used = self.items_used()
        todo = unscored(self.reference, used)
        self.reference_items = {"read": len(used), "scored": len(todo)}
        if not todo:
            return self.reference
        what = "examples" if self.store.unpaired else "pairs"
        if self.resumed and self.unrebuildable:  # reference_for refused a resume without any table
            raise DataError(
                f"resuming needs the reference log-probs of {len(todo):,} {what} this run reads and its first run did "
                f"not (a higher max_steps or num_epochs than it trained with?); the model being resumed is no longer "
                f"the model the run started from, and it cannot be rebuilt: {self.unrebuildable}; so they cannot be "
                f"computed now ({self.reference_path}). Resume with the settings the run started with, or start "
                "over with `resume: false`")
        started = time.time()
        cached = ""
        if self.reference is not None:
            cached = f"; {int((~torch.isnan(self.reference).any(dim=1)).sum()):,} more in the cached table"
        log.info(f"reference log-probs: one no-grad pass over the {len(todo):,} {what} this run reads (of "
                 f"{len(self.store):,} in the data{cached}) with the model as it starts")
        main, world = self.is_world_process_zero(), self.accelerator.num_processes
        progress, close = progress_reporter(-(-len(todo) // world), what, bar=main and not self.args.disable_tqdm,
                                            say=log.info)
        # resumed: a fresh LoRA on a base started as the base, which its adapter switched off gives back
        starting = self.accelerator.unwrap_model(model).disable_adapter() if self.resumed else contextlib.nullcontext()
        if self.resumed:
            log.info("reference log-probs: resumed, so scored with the adapter switched off (the base: the model a "
                     "fresh LoRA started as)")
        try:
            with starting:
                table = compute_table(model, self.head, self.reference_collator, self.store,
                                      self.reference_batch_tokens, self._prepare_inputs, self.full_logits,
                                      self.accelerator.process_index, world, items=todo, table=self.reference,
                                      progress=progress if main else None)
        finally:
            close()
        if self.reference_path is not None and main:
            save_table(self.reference_path, table)
        self.reference_seconds = time.time() - started
        self._reference_unlogged += self.reference_seconds
        if model.training:  # inside the first training step: not training time for the throughput either
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, ThroughputCallback):
                    callback.exclude(self.reference_seconds)
        log.info(f"reference log-probs: {self.reference_seconds:.1f} s, stored in {self.reference_path}")
        return table

    def _without_reference_pass(self, logs: dict) -> None:
        """The runtime (and its rates) that the reference pass fell inside, without it; the pass beside it."""
        for prefix in ("eval_", "train_"):
            runtime = logs.get(f"{prefix}runtime")
            if runtime is None or not self._reference_unlogged:
                continue
            own = max(runtime - self._reference_unlogged, 1e-6)
            for rate in ("samples_per_second", "steps_per_second"):
                if f"{prefix}{rate}" in logs:
                    logs[f"{prefix}{rate}"] = round(logs[f"{prefix}{rate}"] * runtime / own, 3)
            logs[f"{prefix}runtime"] = round(own, 4)
            logs["reference_pass_s"] = round(self._reference_unlogged, 4)
            self._reference_unlogged = 0.0

    # --- metrics -----------------------------------------------------------------------------------------------
    def log(self, logs: dict, start_time=None) -> None:
        self._without_reference_pass(logs)
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        means = self._sums.take(mode, self)
        prefix = "eval_" if mode == "eval" else ""
        for name, value in {**means, **self.objective.derived(means)}.items():
            logs[f"{prefix}{name}"] = round(value, 6)
        super().log(logs, start_time)


def _as_policy(ref, inputs, objective):
    """The per-sequence log-probs response_logps would give while the policy is the reference: the table's rows
    (a pair's chosen and rejected responses at their places among the batch's sequences; KTO: each example's)."""
    if objective.needs_kl:
        return ref[:, 0].clone()
    logps = ref.new_zeros(len(inputs["sequence_lengths"]))
    logps[inputs["chosen_index"]] = ref[:, 0]
    logps[inputs["rejected_index"]] = ref[:, 1]
    return logps


def _step_counts(objective, batches) -> list[float]:
    totals = None
    for batch in batches:
        counts = objective.counts(batch)
        totals = list(counts) if totals is None else [a + b for a, b in zip(totals, counts)]
    return totals or [0.0, 0.0]
