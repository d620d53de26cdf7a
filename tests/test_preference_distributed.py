"""DPO scales out as SFT does (tests/test_distributed.py): two CPU processes under DDP (gloo) and under DeepSpeed
ZeRO-2 and ZeRO-3 give the per-step losses one process gives with the same global batch (LoRA, packed, a full
fine-tune, a model that post-processes its logits; and a reward model, packed with the prompt held once, under DDP
and ZeRO-3: its per-pair loss over the whole step, its score head in the forward); the reference table the two processes compute together
(each a strided share of the pairs, gathered) equals one process's; a second run reads it on both processes
(and trains on it exactly: its losses are checked like the others').

What used to break under ZeRO-3, and is held here:
- a hang in the reference pass. The LM head ran outside the forward on the response positions, chunk by chunk,
  and under ZeRO-3 every call of the (partitioned) head gathers its weight from all processes: processes whose
  batches hold different numbers of response tokens made different numbers of chunks, so different numbers of
  collectives, and waited for each other forever (on CPU, gloo sometimes aborts instead: "collective mismatch").
  The tiny model's 512-token vocabulary fits any batch in one chunk, which hid it; the launch below makes the
  chunks as small as a ~150k vocabulary makes them (FINETUNE_TEST_CHUNK_LOGITS). Under ZeRO-3 the head now runs
  once, inside the forward, on the gathered rows (finetune/model/sequence_logps.py).
- with gradients, each chunk ran under activation checkpointing, and the recompute found the head's gathered
  weight freed again by ZeRO-3 (CheckpointError at the first backward, even with one chunk).
- the probe that decides whether the loss reads the model's full logits ran when training began and its answer
  was dropped; the trainer now runs it at its first loss, before the reference pass.
- the reference pass runs inside the first loss on every process: each process must run as many forwards, so
  the shorter share repeats an item (33 pairs: 17 and 16 here).

Same global batch, fp32, LoRA dropout 0: one process runs micro batch 2 x accumulation 2, two processes micro
batch 2 each; TOLERANCE is test_distributed.py's. Every run of the launch has its own cache_dir (except the
one that must read another's), so each computes its reference table with two processes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import write_jsonl
from finetune.recipe import load_recipe
from finetune.train.launch import free_port
from test_distributed import DRIVER, TOLERANCE, assert_same_losses, losses
from test_preference_data import chat_pair

pytest.importorskip("deepspeed", reason="pip install 'finetune[deepspeed]' (it is in the test extra)")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU multi-process checks: run them with "
                                "CUDA_VISIBLE_DEVICES= python -m pytest tests/test_preference_distributed.py")
PAIRS = 33  # odd: the reference pass's shares are 17 and 16 pairs
CHUNK_LOGITS = 8 * 512  # 8 rows of the tiny vocabulary a chunk, as 2**26 logits are 441 rows of a 152k vocabulary


def build_granite(out: Path, tokenizer_dir: Path) -> Path:
    """A tiny Granite: a Llama whose forward divides the logits by `logits_scaling`. One process: the head run
    outside the forward would miss it, so the probe picks full logits; under ZeRO-3 the head runs in the forward
    on the gathered rows, scaling included."""
    from transformers import AutoTokenizer, GraniteConfig, GraniteForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = GraniteConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=None, logits_scaling=4.0, tie_word_embeddings=False)
    GraniteForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("prefdist")
    rng = random.Random(1)
    write_jsonl(root / "pairs.jsonl", [chat_pair(rng) for _ in range(PAIRS)])
    build_granite(root / "granite", tiny_model_dir)
    recipe = {
        "base_model": str(tiny_model_dir),
        "method": "dpo",
        "datasets": [{"path": "pairs.jsonl", "type": "preference"}],
        "sequence_len": 128,
        "micro_batch_size": 2,
        "global_batch_size": 4,  # 2 x 2 accumulation on one process, 2 x 1 x 2 processes
        "max_steps": 4,
        "learning_rate": 1e-3,
        "lr_scheduler": "constant",
        "logging_steps": 1,
        "adapter": "lora",
        "lora_r": 4,
        "lora_dropout": 0.0,  # dropout draws differ between 1 and 2 processes
        "precision": "fp32",
        "output_dir": "single",
        "cache_dir": "single_cache",
        "report_to": ["none"],
    }
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


SINGLE = {  # one process, in this process
    "lora": [],
    "packed": ["sample_packing=true", "output_dir=single_packed"],
    "full": ["adapter=none", "max_steps=2", "output_dir=single_full"],
    "granite": ["base_model=granite", "output_dir=single_granite"],
    "reward_packed": ["method=reward", "sample_packing=true", "output_dir=single_reward"],
}


@pytest.fixture(scope="module")
def single(workdir) -> dict:
    from finetune.train import run_training

    return {name: run_training(load_recipe(workdir / "recipe.yml", overrides, world_size=1))
            for name, overrides in SINGLE.items()}


RUNS = {  # run name -> --set overrides, in order (ZeRO-3 last: transformers keeps it process-wide)
    "ddp": "output_dir=mp_ddp,cache_dir=mp_ddp_cache",
    # reads the table "ddp" stored (packing does not change the pairs, so not the table's key) and scores the pairs
    # its packed rows add, trains packed
    "ddp_packed_again": "output_dir=mp_ddp_packed,cache_dir=mp_ddp_cache,sample_packing=true",
    "zero2": "output_dir=mp_zero2,cache_dir=mp_zero2_cache,deepspeed=zero2",
    "reward_ddp_packed": "method=reward,sample_packing=true,output_dir=mp_reward,cache_dir=mp_reward_cache",
    "zero3_packed": "output_dir=mp_zero3_packed,cache_dir=mp_zero3_packed_cache,deepspeed=zero3,sample_packing=true",
    # zero3_packed in 2 steps, then resumed to 4 from its DeepSpeed checkpoint: its own cache, so the resume scores
    # the pairs steps 3-4 add with the adapter switched off (gathered under ZeRO-3 on both processes)
    "zero3_packed_2": "output_dir=mp_zero3_resume,cache_dir=mp_zero3_resume_cache,deepspeed=zero3,sample_packing=true,"
                      "max_steps=2,checkpoint_interval=2",
    "zero3_packed_resumed": "output_dir=mp_zero3_resume,cache_dir=mp_zero3_resume_cache,deepspeed=zero3,"
                            "sample_packing=true,checkpoint_interval=2",
    "zero3_full": "output_dir=mp_zero3_full,cache_dir=mp_zero3_full_cache,deepspeed=zero3,adapter=none,max_steps=2",
    "zero3_granite": "output_dir=mp_zero3_granite,cache_dir=mp_zero3_granite_cache,deepspeed=zero3,base_model=granite",
    "reward_zero3_packed": "method=reward,sample_packing=true,deepspeed=zero3,output_dir=mp_reward_zero3,"
                           "cache_dir=mp_reward_zero3_cache",
}


@pytest.fixture(scope="module")
def multiproc(workdir) -> dict:
    """Every run of RUNS in one 2-process launch; returns {rank: {run: result}}."""
    results = workdir / "results"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(DRIVER), str(workdir / "recipe.yml"),
               str(results), *(f"{name}={overrides}" for name, overrides in RUNS.items())]
    # ~40 s on 2 CPU cores; a hang (the failure this file guards against) ends at the timeout
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "FINETUNE_TEST_CHUNK_LOGITS": str(CHUNK_LOGITS)})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return {rank: json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.multiproc
@pytest.mark.parametrize("run, single_run", [("ddp", "lora"), ("ddp_packed_again", "packed"), ("zero2", "lora"),
                                             ("zero3_packed", "packed"), ("zero3_full", "full"),
                                             ("zero3_granite", "granite"), ("reward_ddp_packed", "reward_packed"),
                                             ("reward_zero3_packed", "reward_packed")])
def test_two_processes_match_one_process(multiproc, single, run, single_run):
    expected = losses(single[single_run])
    assert len({round(loss, 4) for _, loss in expected}) == len(expected)  # the loss moved every step
    for rank in (0, 1):
        result = multiproc[rank][run]
        assert result["world_size"] == 2 and result["steps"] == single[single_run]["steps"]
        assert_same_losses(losses(result), expected)


@pytest.mark.multiproc
def test_the_reference_table_of_two_processes_equals_one_process(multiproc, single):
    """Each process scores its share of the pairs the run reads; the gathered table is one process's (batches of
    other pairs, so other padding: float rounding only). 4 steps of 4 pairs read fewer than the 33 pairs (NaN rows:
    not scored); the two processes read the pairs the one process reads (the same seeded order, sharded)."""
    one = torch.load(single["lora"]["preference"]["reference_table"])
    assert one.shape == (PAIRS, 2)
    for run in ("ddp", "zero2", "zero3_packed"):
        assert multiproc[0][run]["reference"]["reference_pass_s"] is not None  # computed, not read
        assert multiproc[1][run]["reference"]["reference_table"] == multiproc[0][run]["reference"]["reference_table"]
        two = torch.load(multiproc[0][run]["reference"]["reference_table"])
        scored = ~torch.isnan(two).any(dim=1)
        assert scored.sum() >= multiproc[0][run]["reference"]["reference_items"]["read"] > 0, run
        assert torch.isfinite(one[scored]).all(), run  # one process scored every pair two processes read
        torch.testing.assert_close(two[scored], one[scored], rtol=TOLERANCE, atol=1e-4, msg=run)


@pytest.mark.multiproc
def test_a_second_run_reads_the_table_on_every_process(multiproc):
    """The packed second run reads the first one's table and scores only the pairs its rows add (its steps read
    other pairs than the unpacked run's), the same on both processes."""
    for rank in (0, 1):
        first, again = multiproc[rank]["ddp"], multiproc[rank]["ddp_packed_again"]
        assert first["reference"]["reference_pass_s"] is not None
        assert again["reference"]["reference_table"] == first["reference"]["reference_table"]
        items = again["reference"]["reference_items"]
        assert items["scored"] < items["read"]  # what the first run scored is read from its table
    assert multiproc[0]["ddp_packed_again"]["reference"]["reference_items"] == \
        multiproc[1]["ddp_packed_again"]["reference"]["reference_items"]


@pytest.mark.multiproc
def test_a_zero3_resume_ends_where_the_straight_run_ends(multiproc, workdir):
    """DPO under ZeRO-3 (LoRA, packed), stopped after 2 steps and resumed to 4: the same losses and the same adapter
    as 4 steps straight; steps 3-4's pairs scored by the resume itself (adapter off), as the straight run did."""
    from test_preference_guarantees import ADAPTER_ATOL

    for rank in (0, 1):
        first, resumed = multiproc[rank]["zero3_packed_2"], multiproc[rank]["zero3_packed_resumed"]
        assert first["steps"] == 2 and resumed["resumed_from"].endswith("mp_zero3_resume/checkpoints/step-2")
        assert resumed["reference"]["reference_items"]["scored"] > 0  # the rows the first run did not read
        assert_same_losses(losses(resumed), losses(multiproc[rank]["zero3_packed"]))
    resumed, straight = (load_file(str(workdir / out / "adapter_model.safetensors"))
                         for out in ("mp_zero3_resume", "mp_zero3_packed"))
    assert resumed.keys() == straight.keys() and resumed
    assert max((resumed[k] - straight[k]).abs().max().item() for k in resumed) <= ADAPTER_ATOL


@pytest.mark.multiproc
def test_zero3_full_finetune_saves_what_one_process_trains(multiproc, single, workdir, tiny_model_dir):
    saved = load_file(str(workdir / "mp_zero3_full" / "model.safetensors"))
    reference = load_file(str(workdir / "single_full" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert saved.keys() == reference.keys()
    for name, tensor in saved.items():  # full shapes (not ZeRO-3's empty shards), trained like one process
        assert tensor.shape == reference[name].shape, name
        assert torch.allclose(tensor.float(), reference[name].float(), atol=1e-4), name
    assert any(not torch.equal(saved[k], base[k]) for k in base)
    assert not torch.equal(saved["lm_head.weight"], base["lm_head.weight"])  # the gathered head's gradient arrived


class _Lengths:
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def length(self, item):
        return self.lengths[item]


@pytest.mark.parametrize("items, world, budget", [(33, 2, 200), (5, 4, 100), (3, 4, 1000), (64, 3, 300), (1, 2, 1),
                                                  (40, 2, 60)])
def test_every_process_runs_as_many_reference_batches_and_the_shares_cover_every_item(items, world, budget):
    """What keeps the reference pass from hanging: the same number of forwards on every process. A forward holds
    at most `budget` padded token slots (items x the longest), or one item longer than that."""
    from finetune.train.preference.reference import my_batches

    store = _Lengths(random.Random(items).choices(range(5, 90), k=items))
    shares = [my_batches(store, budget, rank, world) for rank in range(world)]
    assert len({len(share) for share in shares}) == 1
    for batch in (batch for share in shares for batch in share):
        assert len(batch) == 1 or len(batch) * max(store.length(i) for i in batch) <= budget
    scored = [item for share in shares for batch in share for item in batch]
    assert set(scored) == set(range(items))
    if budget >= 300 and items >= 8 * world:  # items are batched, not scored one by one
        assert max(len(batch) for share in shares for batch in share) > 1


@pytest.mark.parametrize("zero3", [False, True])
def test_under_zero3_the_head_runs_once_per_forward_however_many_response_tokens(tiny_model_dir, monkeypatch, zero3):
    """What keeps ZeRO-3 processes in step: one call of the head per forward, whatever the batch holds (each call
    is a collective there). Elsewhere the head runs chunk by chunk. Both give the full-logits log-probs."""
    from transformers import AutoModelForCausalLM

    import finetune.model.sequence_logps as logps

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    if zero3:
        monkeypatch.setattr(head.weight, "ds_id", 0, raising=False)  # how DeepSpeed 0.19 marks a partitioned weight
    monkeypatch.setattr(logps, "CHUNK_LOGITS", CHUNK_LOGITS)
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 2):  # batches of 1 and 2 sequences: ~10 and ~20 response tokens
        ids = torch.randint(1, 500, (rows, 24), generator=gen)
        labels = ids.clone()
        labels[:, :12] = -100
        batch = {"input_ids": ids, "labels": labels, "sequence_index": torch.arange(rows)[:, None].expand(-1, 24),
                 "sequence_lengths": torch.full((rows,), 24)}
        calls.clear()
        with torch.no_grad():
            gathered = logps.response_logps(model, head, batch)
            expected = logps.response_logps(model, head, batch, full_logits=True)
        torch.testing.assert_close(gathered, expected, rtol=1e-5, atol=1e-4)
        head_calls = calls[:-1]  # the last call is the full-logits forward's
        supervised = int((labels[:, 1:] != -100).sum())
        if zero3:
            assert head_calls == [supervised]  # once, in the forward, on the supervised rows only
        else:
            assert head_calls[0] == 0 and len(head_calls) == 1 + -(-supervised // 8)  # zero rows, then the chunks
