"""plan/steps.py against real HF Trainer runs: the predicted step count is the one the Trainer runs."""

from __future__ import annotations

import math

import pytest

from finetune.errors import FinetuneError
from finetune.plan.steps import dataloader_batches, optimizer_steps, steps_per_epoch


class _Examples:
    def __init__(self, n: int, length: int = 6):
        self.n, self.length = n, length

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        ids = torch.arange(self.length) % 30 + 1
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


@pytest.fixture(scope="module")
def micro_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def _trainer_steps(model, tmp_path, n, mbs, gas, epochs, max_steps) -> int:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=mbs, gradient_accumulation_steps=gas,
        num_train_epochs=epochs, max_steps=max_steps or -1, learning_rate=1e-4, report_to="none",
        save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_Examples(n))
    trainer.train()
    return trainer.state.global_step


# (examples, micro batch, accumulation, epochs, max_steps)
CASES = [
    (10, 2, 2, 1, None),  # 5 batches, accumulation remainder of 1 still steps -> 3
    (10, 2, 3, 1.5, None),  # fractional epochs stop mid-epoch: ceil(1.5 x 2) = 3
    (50, 2, 1, 0.28, None),  # 0.28 x 25 = 7.000000000000001 in floats: the Trainer runs 8 steps, not 7
    (9, 4, 4, 2.5, None),  # 3 batches under one accumulation of 4 -> 1 step per epoch -> 3
    (10, 2, 2, 1, 7),  # max_steps beyond one epoch (3 per epoch) wins over epochs
]


@pytest.mark.parametrize("n,mbs,gas,epochs,max_steps", CASES)
def test_predicted_steps_equal_trainer_steps(micro_model, tmp_path, n, mbs, gas, epochs, max_steps):
    predicted = optimizer_steps(n, mbs, gas, 1, epochs, max_steps)
    assert _trainer_steps(micro_model, tmp_path, n, mbs, gas, epochs, max_steps) == predicted


def test_float_epochs_follow_the_trainers_arithmetic():
    # 0.07 x 100 is 7.000000000000001 in floats: the Trainer's ceil gives 8, and so must we
    assert optimizer_steps(200, 2, 1, 1, 0.07, None) == 8 == math.ceil(0.07 * 100)
    assert optimizer_steps(20, 2, 1, 1, 0.5, None) == 5
    assert optimizer_steps(10, 3, 2, 1, 2, None) == 4  # a short last batch (3+3+3+1), 2 steps per epoch


@pytest.mark.parametrize("n,mbs,procs", [(10, 2, 2), (11, 2, 2), (7, 3, 4), (100, 4, 3), (1, 8, 8)])
def test_per_process_batches_match_accelerate_sharding(n, mbs, procs):
    """accelerate splits ceil(n / mbs) batches over the processes, padding the last (even_batches)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler = BatchSampler(SequentialSampler(range(n)), batch_size=mbs, drop_last=False)
    for index in range(procs):
        shard = BatchSamplerShard(sampler, num_processes=procs, process_index=index, even_batches=True)
        assert len(shard) == len(list(shard)) == dataloader_batches(n, mbs, procs)


def test_steps_per_epoch_rounds_remainders_up_and_never_below_one():
    assert steps_per_epoch(5, 2) == 3
    assert steps_per_epoch(1, 8) == 1
    assert steps_per_epoch(8, 8) == 1


def test_empty_dataset_is_a_user_error_naming_the_fix():
    with pytest.raises(FinetuneError, match="sequence_len"):
        optimizer_steps(0, 2, 1, 1, 1, None)
