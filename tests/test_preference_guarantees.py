"""DPO keeps SFT's guarantees: packed pairs train exactly as unpacked ones (and no packed segment sees another),
a run SIGKILLed mid-step resumes exactly with the reference table it stored (and refuses to resume without it),
and the reference pass runs once per data and model: a second run reads the stored table, a changed model or
changed data recomputes it. Multi-process and DeepSpeed: tests/test_preference_distributed.py.

Runs are fp32 with LoRA dropout 0 (except the resume test, which wants dropout's RNG restored), on the tiny
model and the chat pairs of tests/test_preference_data.py."""

from __future__ import annotations

import math
import random
import re
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
from finetune.recipe import load_recipe
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
    rows of 2-3 pairs each (one row a micro batch, each pair's prompt held once), so the step's pairs and chosen
    tokens are counted over micro batches of different sizes. Same loss and gradient norm every step, same adapter at the end. With
    `rpo_alpha` the SFT term's token mean is taken over the step too."""
    runs = {}
    layouts = {"unpacked": dict(micro_batch_size=4, gradient_accumulation_steps=4),
               "packed": dict(micro_batch_size=1, gradient_accumulation_steps=16, sample_packing=True)}
    for name, layout in layouts.items():
        folder = tmp_path / name
        folder.mkdir()
        runs[name] = run_training(dpo_recipe(folder, tiny_model_dir, n=16, val_set_size=0, num_epochs=4,
                                             rpo_alpha=sft_term or None, **layout))
    unpacked, packed = runs["unpacked"], runs["packed"]
    # packed on CPU, pairs hold their prompt once (tests/test_preference_shared_prompt.py): the same training
    assert packed["preference"]["shared_prompt"] and not unpacked["preference"]["shared_prompt"]
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
    from finetune.data.preference.collate import PreferenceCollator
    from finetune.data.preference.rows import PACKED
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
    from finetune.train.preference.setup import probe_preference

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
    from finetune.train.preference.setup import probe_preference

    _, collator, _, model = _probe_batch(tiny_model_dir, tmp_path)

    def drop_positions(module, args, kwargs):
        kwargs.pop("position_ids", None)
        return args, kwargs

    model.register_forward_pre_hook(drop_positions, with_kwargs=True)
    with pytest.raises(ModelError, match="sample_packing: false"):
        probe_preference(model, collator, collator.pad_token_id, "sdpa", packed=True)


# --- the reference table: computed once per data and model -------------------------------------------------

def test_a_second_run_reads_the_reference_table_and_a_changed_model_or_data_recomputes_it(tmp_path, tiny_model_dir,
                                                                                         capfd):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    settings = dict(n=8, val_set_size=0, max_steps=2)

    def run(output_dir, n=8):
        return run_training(dpo_recipe(tmp_path, model, output_dir=output_dir, **{**settings, "n": n}))

    first = run("first")
    table_path = Path(first["preference"]["reference_table"])
    assert first["preference"]["reference_pass_s"] is not None and table_path.is_file()
    stored = torch.load(table_path)
    capfd.readouterr()

    second = run("second")  # same data, same model, another output_dir: no pass, the same training
    assert second["preference"]["reference_pass_s"] is None
    assert second["preference"]["reference_table"] == str(table_path)
    err = capfd.readouterr().err
    assert f"read from {table_path}" in err and "one no-grad pass" not in err
    assert per_step(second) == per_step(first)

    # the stored numbers are the ones the loss uses: raise every chosen reference log-prob by 5 and the first
    # step (policy = the starting model) has every pair's DPO logit at -beta x 5
    torch.save(stored + torch.tensor([5.0, 0.0]), table_path)
    beta = first["preference"]["settings"]["rl_beta"]
    shifted = run("shifted")
    assert shifted["preference"]["reference_pass_s"] is None
    assert per_step(shifted)[0][1] == pytest.approx(math.log1p(math.exp(beta * 5.0)), rel=1e-5)
    torch.save(stored, table_path)

    # the model's weights change in place (an SFT run written again into the same folder): computed anew
    weights = load_file(str(model / "model.safetensors"))
    save_file({k: v + 0.01 if "embed" in k else v for k, v in weights.items()}, str(model / "model.safetensors"),
              metadata={"format": "pt"})
    changed_model = run("changed_model")
    assert changed_model["preference"]["reference_pass_s"] is not None
    new_path = Path(changed_model["preference"]["reference_table"])
    assert new_path != table_path and new_path.is_file()
    assert (torch.load(new_path) - stored).abs().max() > 1e-3  # the new model's numbers, not a copy
    assert torch.equal(torch.load(table_path), stored)  # the first model's table is left as it was

    changed_data = run("changed_data", n=9)  # one more pair
    assert changed_data["preference"]["reference_pass_s"] is not None
    assert Path(changed_data["preference"]["reference_table"]) not in (table_path, new_path)
    assert len(list(table_path.parent.glob("*.pt"))) == 3


def scored_rows(summary: dict) -> set[int]:
    table = torch.load(summary["preference"]["reference_table"])
    return set((~torch.isnan(table).any(dim=1)).nonzero().flatten().tolist())


def test_the_reference_pass_scores_only_the_pairs_the_run_reads_and_a_longer_run_adds_the_rest(tmp_path,
                                                                                               tiny_model_dir, caplog):
    """Issue 43, item 7: a 6-step run scored all 166 pairs, with no progress shown. 32 pairs, 8 held out: 2 steps of
    4 pairs read 8 train pairs and the 8 eval pairs; a longer run on the same data and model scores only what it
    adds. A resumed run that reads pairs its first run did not (2 steps, then 4) scores them with its adapter switched
    off (a fresh LoRA on a base started as the base) and trains as 4 steps straight (a second read's finding 9; it
    was refused). A pair the pass left out that a step read would make its loss NaN: the run stops
    (`on_nonfinite: stop`)."""
    import logging

    settings = dict(n=32, val_set_size=8, micro_batch_size=4, gradient_accumulation_steps=1, checkpoint_interval=2,
                    lr_scheduler="constant")  # steps 1-2 at the rates of a 4-step run: the resume can equal it
    with caplog.at_level(logging.INFO, logger="finetune"):
        short = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="short", max_steps=2, **settings))
    assert "reference log-probs: one no-grad pass over the 16 pairs this run reads (of 32 in the data)" in caplog.text
    progress = [m for m in caplog.messages if re.match(r"reference log-probs: \d+ of 16 pairs \(\d+%, ", m)]
    assert progress and progress[-1].startswith("reference log-probs: 16 of 16 pairs (100%")  # off a terminal
    first = scored_rows(short)
    sixteen = torch.load(short["preference"]["reference_table"])
    assert len(first) == 16 and set(range(24, 32)) <= first  # 8 train pairs, every eval pair
    assert short["eval_loss_before"] == pytest.approx(math.log(2), abs=1e-6) and short["steps"] == 2
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="finetune"):
        longer = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="longer", max_steps=4, **settings))
    assert "over the 8 pairs this run reads (of 32 in the data; 16 more in the cached table)" in caplog.text
    assert longer["preference"]["reference_table"] == short["preference"]["reference_table"]
    assert first < scored_rows(longer) and len(scored_rows(longer)) == 24
    assert per_step(longer)[:2] == per_step(short)  # the same order and the same cached numbers for steps 1-2
    torch.save(sixteen, short["preference"]["reference_table"])  # back to the 16 rows: steps 3-4's are missing
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="finetune"):
        resumed = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="short", max_steps=4, **settings))
    assert resumed["resumed_from"] and "scored with the adapter switched off" in caplog.text
    assert "over the 8 pairs this run reads" in caplog.text
    rebuilt, straight = (torch.load(r["preference"]["reference_table"]) for r in (resumed, longer))
    assert torch.allclose(rebuilt, straight, atol=1e-6, equal_nan=True)  # the same rows as the straight run's
    for (step, loss, norm), (step_, loss_, norm_) in zip(per_step(resumed), per_step(longer), strict=True):
        assert step == step_ and loss == pytest.approx(loss_, abs=1e-6) and norm == pytest.approx(norm_, abs=1e-6)
    assert max_difference(adapter(tmp_path / "short"), adapter(tmp_path / "longer")) <= 1e-6


@pytest.mark.parametrize("adapter_keys", [{"adapter": "qlora"}, {"peft_use_dora": True}], ids=["qlora", "dora"])
def test_a_qlora_or_dora_dpo_resume_equals_the_straight_run(tmp_path, tiny_model_dir, caplog, adapter_keys):
    """QLoRA (NF4 base, bitsandbytes on CPU), and DoRA: 2 steps, then resumed to 4, ends where 4 straight steps end:
    the same losses and gradient norms, the same adapter (fp32 rounding). The resume reads 4 pairs its first run did
    not and scores them with the adapter switched off, the base (quantized for QLoRA) the straight run's reference
    pass read: DoRA starts as the base too (it was refused). QLoRA failed on a CPU with AVX512-BF16: bitsandbytes
    repacked the 4-bit weights at the first no-grad pass and its backward read them wrong after
    (finetune/compat.py keep_4bit_layout); the resume's extra pass moved it."""
    import logging

    settings = dict(n=8, val_set_size=0, micro_batch_size=2, gradient_accumulation_steps=1, checkpoint_interval=2,
                    lr_scheduler="constant", lora_r=4, **adapter_keys)
    longer = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="longer", cache_dir="ref_cache",
                                     max_steps=4, **settings))
    short = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="short", max_steps=2, **settings))
    first = adapter(tmp_path / "short")
    with caplog.at_level(logging.INFO, logger="finetune"):
        resumed = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="short", max_steps=4, **settings))
    assert "scored with the adapter switched off" in caplog.text
    assert ("4-bit NF4" in caplog.text) == (adapter_keys.get("adapter") == "qlora")
    assert any(k.endswith(".lora_magnitude_vector") for k in adapter(tmp_path / "short")) == ("peft_use_dora" in adapter_keys)
    assert resumed["resumed_from"] == str(tmp_path / "short" / "checkpoints" / "step-2")
    assert per_step(resumed)[:2] == per_step(short) and len(per_step(resumed)) == 4
    rebuilt, straight = (torch.load(r["preference"]["reference_table"]) for r in (resumed, longer))
    assert torch.allclose(rebuilt, straight, atol=1e-5)  # ~3e-3 apart while bitsandbytes repacked on a CPU
    for (step, loss, norm), (step_, loss_, norm_) in zip(per_step(resumed), per_step(longer), strict=True):
        assert step == step_ and loss == pytest.approx(loss_, abs=1e-6) and norm == pytest.approx(norm_, abs=1e-6)
    assert max_difference(adapter(tmp_path / "short"), adapter(tmp_path / "longer")) <= ADAPTER_ATOL
    assert max_difference(first, adapter(tmp_path / "short")) > 0  # it trained after the resume


def test_a_resume_that_cannot_rebuild_the_reference_says_why():
    """The reference of a resumed run is rebuilt only where the adapter switched off gives the starting model."""
    from types import SimpleNamespace

    from finetune.train.preference.setup import unrebuildable

    def recipe(**keys):
        return SimpleNamespace(**{"adapter": "lora", "base_model": "base", "peft_use_dora": False,
                                  "peft_init_lora_weights": True, **keys})

    peft = SimpleNamespace(peft_config={"default": SimpleNamespace(modules_to_save=None, trainable_token_indices=None)})
    assert unrebuildable(recipe(), peft) is None
    assert unrebuildable(recipe(peft_init_lora_weights="gaussian"), peft) is None
    assert "full fine-tune" in unrebuildable(recipe(adapter="none"), SimpleNamespace())
    assert unrebuildable(recipe(peft_use_dora=True), peft) is None  # it starts as the base (m = |W|, B zero)
    assert "did not start as a no-op" in unrebuildable(recipe(peft_init_lora_weights="pissa"), peft)
    saved = SimpleNamespace(peft_config={"default": SimpleNamespace(modules_to_save=["lm_head"])})
    assert "modules_to_save" in unrebuildable(recipe(), saved)


# --- exact resume --------------------------------------------------------------------------------------------

# 40 pairs packed into 15 rows of 2-3 pairs, a row a micro batch, accumulation 2 -> 8 optimizer steps an epoch
# (the 8th has one micro batch); 2 epochs = 16 steps. Checkpoint at step 13 (mid epoch 2), the kill after the first
# micro batch of step 15. Packed, so the pairs a step normalizes by vary from micro batch to micro batch (the
# counts must be taken over the right batches after the resume skips into the epoch; unpacked, every micro batch
# holds the same number, the easier case). SFT's resume, both layouts: tests/test_resume.py. LoRA dropout draws
# from the RNG: resuming must restore it.
RESUME = dict(n=40, val_set_size=0, micro_batch_size=1, gradient_accumulation_steps=2, num_epochs=2, lora_r=4,
              lora_dropout=0.1, max_checkpoints=1, sample_packing=True)


def test_sigkill_mid_step_then_resume_matches_uninterrupted_run_and_reuses_the_reference(tmp_path, tiny_model_dir):
    # the uninterrupted run keeps its own cache: the killed run computes and stores its own table
    reference = run_training(dpo_recipe(tmp_path, tiny_model_dir, output_dir="reference", cache_dir="ref_cache",
                                        **RESUME))
    total = reference["steps"]
    assert total >= 6 and reference["data"]["packing"]["train"]["rows"] <= 40 / 2, reference["plan"]

    dpo_recipe(tmp_path, tiny_model_dir, output_dir="out", checkpoint_interval=total - 3, **RESUME)
    recipe = tmp_path / "recipe.yml"
    proc = subprocess.run([sys.executable, str(KILLER), str(recipe), str(total - 1)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "run.json").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{total - 3}"]
    tables = list((tmp_path / "cache" / "prepared" / "reference").glob("*.pt"))
    assert len(tables) == 1  # stored by the killed run at its first step
    assert torch.equal(torch.load(tables[0]), torch.load(reference["preference"]["reference_table"]))

    # without its table the run cannot resume: the model in the checkpoint is no longer the one it started from
    aside = tmp_path / "table.pt"
    tables[0].rename(aside)
    with pytest.raises(DataError, match="resuming needs the reference log-probs"):
        run_training(load_recipe(recipe))
    aside.rename(tables[0])

    first = adapter(out / "checkpoints" / f"step-{total - 3}")
    resumed = run_training(load_recipe(recipe))
    assert resumed["resumed_from"] == str(out / "checkpoints" / f"step-{total - 3}")
    assert resumed["preference"]["reference_pass_s"] is None  # read from the cache, not recomputed
    ref_steps, res_steps = per_step(reference), per_step(resumed)
    assert [s for s, *_ in res_steps] == list(range(1, total + 1))
    for (step, loss_a, norm_a), (_, loss_b, norm_b) in zip(ref_steps, res_steps):
        assert loss_b == pytest.approx(loss_a, abs=1e-6), step
        assert norm_b == pytest.approx(norm_a, abs=1e-6), step
    assert max_difference(adapter(tmp_path / "reference"), adapter(out)) <= 1e-6
    assert any(not torch.equal(first[k], v) for k, v in adapter(out).items())  # it trained after the resume
