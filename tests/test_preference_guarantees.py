"""DPO keeps SFT's guarantees: packed pairs train exactly as unpacked ones (and no packed segment sees another),
a run SIGKILLed mid-step resumes exactly with the reference table it stored (and refuses to resume without it),
and the reference pass runs once per data and model: a second run reads the stored table, a changed model or
changed data recomputes it. Multi-process and DeepSpeed: tests/test_preference_distributed.py.

Runs are fp32 with LoRA dropout 0 (except the resume test, which wants dropout's RNG restored), on the tiny
model and the chat pairs of tests/test_preference_data.py."""

from __future__ import annotations

import math
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import write_jsonl
from finetune.errors import DataError, ModelError
from finetune.recipe_load import load_recipe
from finetune.train.run import run_training
from test_preference_data import _sequence_logps, chat_pair, dpo_recipe

KILLER = Path(__file__).parent / "kill_during_training.py"
TOLERANCE = 1e-5  # relative, on each step's loss: fp32 sums of the same pairs in another order differ ~1e-7
# absolute, on each LoRA weight after 4 AdamW steps at lr 2e-3 (tests/test_distributed.py's bound): Adam's
# update divides by sqrt(v), so the ~1e-7 rounding of a tiny gradient moves a weight ~1e-6, 1/1000 of a step
ADAPTER_ATOL = 1e-5


def per_step(summary: dict) -> list[tuple]:
    return [(e["step"], e["loss"], e["grad_norm"]) for e in summary["log_history"] if "loss" in e]


def adapter(folder: Path) -> dict:
    return load_file(str(folder / "adapter_model.safetensors"))


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max((a[k] - b[k]).abs().max().item() for k in a)


# --- packed = unpacked --------------------------------------------------------------------------------------

@pytest.mark.parametrize("sft_term", [0.0, 0.5], ids=["dpo", "dpo+sft"])
def test_packed_pairs_train_exactly_as_unpacked(tmp_path, tiny_model_dir, sft_term):
    """16 pairs, every optimizer step holds all of them: unpacked as 4 micro batches of 4 pairs, packed as ~6
    rows of 2-3 pairs each (one row a micro batch), so the step's pairs and chosen tokens are counted over micro
    batches of different sizes. Same loss and gradient norm every step, same adapter at the end. With
    `rpo_alpha` the SFT term's token mean is taken over the step too."""
    runs = {}
    for name, layout in {"unpacked": dict(micro_batch_size=4, gradient_accumulation_steps=4),
                         "packed": dict(micro_batch_size=1, gradient_accumulation_steps=16, sample_packing=True)}.items():
        folder = tmp_path / name
        folder.mkdir()
        runs[name] = run_training(dpo_recipe(folder, tiny_model_dir, n=16, val_set_size=0, num_epochs=4,
                                             rpo_alpha=sft_term or None, **layout))
    unpacked, packed = runs["unpacked"], runs["packed"]
    rows = packed["data"]["packing"]["train"]["rows"]
    assert 16 / rows >= 2 and rows > 4  # several pairs a row, and more rows than one micro batch of 4
    steps_u, steps_p = per_step(unpacked), per_step(packed)
    assert [s for s, *_ in steps_p] == [s for s, *_ in steps_u] == [1, 2, 3, 4]
    for (step, loss_u, norm_u), (_, loss_p, norm_p) in zip(steps_u, steps_p):
        assert loss_p == pytest.approx(loss_u, rel=TOLERANCE), step
        assert norm_p == pytest.approx(norm_u, rel=TOLERANCE), step
    assert steps_u[-1][1] < steps_u[0][1] - 1e-3  # it trained: equal losses are not equal because nothing moved
    final_u, final_p = adapter(tmp_path / "unpacked" / "out"), adapter(tmp_path / "packed" / "out")
    assert max_difference(final_u, final_p) <= ADAPTER_ATOL
    assert max(v.abs().max().item() for k, v in final_u.items() if "lora_B" in k) > 1e-3  # B moved off zero


def _probe_batch(tiny_model_dir, tmp_path):
    """A packed DPO setup: the store, a packed batch of its first rows (the real collator) and the model."""
    from finetune.data import build_dataset
    from finetune.data.preference_collate import PreferenceCollator
    from finetune.data.preference_rows import PACKED
    from finetune.model import build_model
    from finetune.model.loader import load_tokenizer

    recipe = dpo_recipe(tmp_path, tiny_model_dir, n=12, val_set_size=0, sample_packing=True)
    tokenizer = load_tokenizer(recipe)
    prepared = build_dataset(recipe, tokenizer)
    model, tokenizer = build_model(recipe, tokenizer, "fp32", "sdpa")
    collator = PreferenceCollator(prepared.store, tokenizer.pad_token_id)
    rows = [prepared.train[i] for i in range(2)]
    assert all(len(row[PACKED]) >= 2 for row in rows), rows  # several pairs a row: chosen, rejected, chosen, ...
    return prepared.store, collator, collator(rows), model.eval()


def test_no_packed_segment_sees_another(tmp_path, tiny_model_dir):
    """The preference collator's packed rows (chosen and rejected of several pairs back to back, sharing their
    prompt text) give every response the log-prob it has alone; the guard passes such a model."""
    from finetune.model.sequence_logps import response_logps
    from finetune.train.preference_setup import probe_preference

    store, collator, batch, model = _probe_batch(tiny_model_dir, tmp_path)
    assert "position_ids" in batch and "attention_mask" not in batch
    with torch.no_grad():
        packed = response_logps(model, model.get_output_embeddings(), batch)
    items = batch["pair_ids"].tolist()
    alone = _sequence_logps(model, [store.sequences(i)[0] for i in items] + [store.sequences(i)[1] for i in items])
    got = [packed[batch["chosen_index"][k]].item() for k in range(len(items))]
    got += [packed[batch["rejected_index"][k]].item() for k in range(len(items))]
    assert got == pytest.approx(alone, rel=1e-5, abs=1e-5)
    assert packed.numel() == 2 * len(items)
    assert probe_preference(model, collator, collator.pad_token_id, "sdpa", packed=True) is False  # gathered head


def test_the_guard_refuses_a_model_whose_packed_segments_see_each_other(tmp_path, tiny_model_dir):
    """The same model with its position_ids dropped (what an attention path ignoring packed boundaries does):
    a preference run with sample_packing refuses to start, naming the way out."""
    from finetune.train.preference_setup import probe_preference

    _, collator, _, model = _probe_batch(tiny_model_dir, tmp_path)

    def drop_positions(module, args, kwargs):
        kwargs.pop("position_ids", None)
        return args, kwargs

    model.register_forward_pre_hook(drop_positions, with_kwargs=True)
    with pytest.raises(ModelError, match="sample_packing: false"):
        probe_preference(model, collator, collator.pad_token_id, "sdpa", packed=True)
