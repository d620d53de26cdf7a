"""The loss and the gradients of one optimizer step do not depend on how the examples are cut into micro
batches, nor on packing. Measured through the Trainer's own path (training_step, compute_loss,
num_items_in_batch) with the toolkit's TrainingArguments and collator, on examples of different lengths,
where "mean of per-micro-batch means" (the accumulation bug other trainers had) would differ."""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainerCallback

from conftest import resolved_training_arguments
from finetune.data import build_dataset
from finetune.data.collate import Collator
from finetune.model import build_model
from finetune.model.loader import load_tokenizer
from finetune.recipe import load_recipe

TOLERANCE = 1e-5


class GradCapture(TrainerCallback):
    """The accumulated gradients of the first optimizer step, just before optimizer.step()."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def one_step(make_recipe, tmp_path, name, fast_paths=False, **settings):
    """Loss and gradients of the first optimizer step of a full fine-tune on 4 examples, plus the data.
    `fast_paths`: with train.py's exact speedups (per-example attention for packed rows, supervised-only
    logits), which must change nothing."""
    # fp32 on any machine: the question is how examples are cut into batches, not bf16 rounding on a GPU
    recipe = load_recipe(make_recipe("instruction", n=4, adapter="none", max_steps=1, max_grad_norm=0,
                                     learning_rate=1e-5, output_dir=name, precision="fp32", **settings))
    tokenizer = load_tokenizer(recipe)
    prepared = build_dataset(recipe, tokenizer)
    torch.manual_seed(0)
    model, tokenizer = build_model(recipe, tokenizer)
    if fast_paths:
        from finetune.model.supervised_logits import attach
        from finetune.model.varlen_attention import NAME, use_varlen_attention

        model.config.use_cache = False
        assert use_varlen_attention(model) and model.config._attn_implementation == NAME
        assert attach(model) is not None
    capture = GradCapture()
    trainer = Trainer(model=model, args=resolved_training_arguments(recipe, prepared),
                      train_dataset=prepared.train, data_collator=Collator(tokenizer.pad_token_id),
                      callbacks=[capture])
    trainer.train()
    loss = next(e["loss"] for e in trainer.state.log_history if "loss" in e)
    return loss, capture.grads, prepared


def reference_loss(make_recipe, tmp_path, prepared) -> tuple[float, float]:
    """(token-mean loss over all 4 examples, the mean of per-example means) computed by hand."""
    from transformers import AutoModelForCausalLM

    recipe = load_recipe(make_recipe("instruction", n=4, adapter="none"))
    model = AutoModelForCausalLM.from_pretrained(recipe.base_model, dtype=torch.float32)
    total, count, means = 0.0, 0, []
    for row in prepared.train:
        ids, labels = torch.tensor([row["input_ids"]]), torch.tensor([row["labels"]])
        logits = model(input_ids=ids).logits[0, :-1]
        target = labels[0, 1:]
        losses = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="none")
        mask = target != -100
        total += losses[mask].sum().item()
        count += int(mask.sum())
        means.append(losses[mask].mean().item())
    return total / count, sum(means) / len(means)


def assert_same_grads(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= TOLERANCE, worst
    assert max(g.abs().max().item() for g in a.values()) > 1e-3  # the gradients are not all ~zero
    return worst


def test_micro_batch_4_equals_4_accumulated_micro_batches_of_1(make_recipe, tmp_path):
    loss_a, grads_a, prepared = one_step(make_recipe, tmp_path, "mb4", micro_batch_size=4,
                                         gradient_accumulation_steps=1)
    loss_b, grads_b, _ = one_step(make_recipe, tmp_path, "ga4", micro_batch_size=1, gradient_accumulation_steps=4)
    lengths = sorted(len(r["input_ids"]) for r in prepared.train)
    supervised = sorted(sum(1 for t in r["labels"] if t != -100) for r in prepared.train)
    assert len(set(supervised)) > 1, (lengths, supervised)  # different lengths: normalisation matters

    token_mean, mean_of_means = reference_loss(make_recipe, tmp_path, prepared)
    assert abs(token_mean - mean_of_means) > 1e-3  # the naive average would be caught
    assert loss_a == pytest.approx(token_mean, abs=TOLERANCE)
    assert loss_b == pytest.approx(token_mean, abs=TOLERANCE)
    assert_same_grads(grads_a, grads_b)


def test_packed_equals_unpacked(make_recipe, tmp_path):
    from finetune.recipe import Recipe

    if "sample_packing" not in Recipe.model_fields:
        pytest.skip("sample_packing is not in the recipe yet")
    loss_a, grads_a, _ = one_step(make_recipe, tmp_path, "unpacked", micro_batch_size=4,
                                  gradient_accumulation_steps=1)
    # all 4 examples fit one packed row of 512 tokens: one micro batch of one row
    loss_b, grads_b, packed = one_step(make_recipe, tmp_path, "packed", micro_batch_size=1,
                                       gradient_accumulation_steps=1, sample_packing=True)
    assert len(packed.train) == 1 and "position_ids" in packed.train.column_names
    assert loss_b == pytest.approx(loss_a, abs=TOLERANCE)
    assert_same_grads(grads_a, grads_b)


def test_packed_with_fast_paths_equals_unpacked_plain(make_recipe, tmp_path):
    loss_a, grads_a, _ = one_step(make_recipe, tmp_path, "plain", micro_batch_size=4, gradient_accumulation_steps=1)
    # 2 packed rows of 2 examples each would need a shorter sequence_len; one row of 4 examples + an
    # accumulation over two micro batches of the unpacked data exercise the per-example attention and
    # the gathered head under num_items_in_batch normalisation
    loss_b, grads_b, packed = one_step(make_recipe, tmp_path, "fast", fast_paths=True, micro_batch_size=1,
                                       gradient_accumulation_steps=1, sample_packing=True)
    assert len(packed.train) == 1
    assert loss_b == pytest.approx(loss_a, abs=TOLERANCE)
    assert_same_grads(grads_a, grads_b)
    loss_c, grads_c, _ = one_step(make_recipe, tmp_path, "fast_ga", fast_paths=True, micro_batch_size=2,
                                  gradient_accumulation_steps=2)
    assert loss_c == pytest.approx(loss_a, abs=TOLERANCE)
    assert_same_grads(grads_a, grads_c)
