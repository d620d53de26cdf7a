"""The preference losses (finetune/train/preference/loss.py) against TRL 1.16 as the oracle.

For each method, TRL's own trainer (DPOTrainer, KTOTrainer, experimental ORPOTrainer and CPOTrainer with
loss_type="simpo") computes its loss on ONE batch from its own dataset preparation and collator; then, on the
same token sequences (TRL's tokenized batch, so tokenization is not what is compared) and the same model, a
plain forward pass + log_softmax + gather gives per-sequence log-probs, which go through our functions. Loss and
every parameter's gradient must agree to 1e-5 (gradients relative to their largest entry). The policy is the
tiny model fine-tuned a few steps on half the chosen and half the rejected answers, so its log-probs are far
from the reference's (the untouched tiny model) in both directions, and the losses are not in their linear
regime. fp32, no dropout, CPU. The properties below the TRL checks need no TRL.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from finetune.train.preference import loss as L

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL's trainers ping the hub at construction

PAIRS = [
    {"prompt": "what is the cat", "chosen": " the cat sat on the mat", "rejected": " dog"},
    {"prompt": "hello world", "chosen": " thanks please", "rejected": " no no no bad red river"},
    {"prompt": "one plus two equals", "chosen": " three", "rejected": " five six seven"},
    {"prompt": "write code", "chosen": " python function list number", "rejected": " rain sun"},
]
TOL = 1e-5


# --- the models and TRL -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl", minversion="1.16")


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory):
    """(policy, reference) folders: the reference is the tiny model; the policy is it after 20 Adam steps on the
    chosen answers of pairs 0-1 and the rejected answers of pairs 2-3 (prompts included)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    texts = [p["prompt"] + (p["chosen"] if i < 2 else p["rejected"]) for i, p in enumerate(PAIRS)]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(0)
    for _ in range(20):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    policy = tmp_path_factory.mktemp("policy") / "model"
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    return policy, tiny_model_dir


def _load(path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)


def _trainer(trainer_cls, config_cls, model_dirs, tmp_path, records, reference=True, batch_size=None, **config):
    """TRL's trainer on `records`, fp32 on CPU, its micro batch all of them unless `batch_size`."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    policy, ref = model_dirs
    args = config_cls(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                      gradient_checkpointing=False, per_device_train_batch_size=batch_size or len(records),
                      **config)
    kwargs = {"ref_model": _load(ref)} if reference else {}
    trainer = trainer_cls(model=_load(policy), args=args, train_dataset=Dataset.from_list(records),
                          processing_class=AutoTokenizer.from_pretrained(policy), **kwargs)
    trainer.model.train()  # TRL files metrics under "train" only in training mode
    return trainer


def _rows(trainer, indices=None):
    dataset = trainer.train_dataset
    return [dataset[i] for i in (range(len(dataset)) if indices is None else indices)]


def _backward(model, loss):
    """loss and every parameter's gradient, the model's gradients cleared after."""
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _assert_same(ours, theirs):
    (loss, grads), (trl_loss, trl_grads) = ours, theirs
    assert abs(loss.item() - trl_loss.item()) <= TOL * max(1.0, abs(trl_loss.item())), (loss, trl_loss)
    assert grads.keys() == trl_grads.keys() and len(grads) > 0
    scale = max(g.abs().max().item() for g in trl_grads.values())
    assert scale > 0
    worst = max((grads[n] - trl_grads[n]).abs().max().item() for n in grads)
    assert worst <= TOL * scale, f"gradients differ by {worst:.3g} (largest entry {scale:.3g})"


def _token_logps(model, input_ids, attention_mask, supervised):
    """(per-sequence summed log-probs of the supervised tokens, their counts, per-token log-probs): a plain
    forward, log_softmax over the full logits, gather. `supervised` marks the tokens that are scored."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    per_token = logits.log_softmax(-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = supervised[:, 1:].bool()
    per_token = per_token * mask
    return per_token.sum(-1), mask.sum(-1), per_token


def _dpo_logps(trainer, batch):
    """TRL's DPO batch is [chosen rows; rejected rows] with a completion mask."""
    args = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    logps, tokens, per_token = _token_logps(trainer.model, *args)
    with torch.no_grad():
        ref, _, _ = _token_logps(trainer.ref_model, *args)
    (pc, pr), (rc, rr), (nc, nr) = logps.chunk(2), ref.chunk(2), tokens.chunk(2)
    return pc, pr, rc, rr, nc, nr, per_token.chunk(2)[0], batch["completion_mask"][:, 1:].chunk(2)[0].bool()


def _trl_metric(trainer, name):
    return trainer._metrics["train"][name][-1]


# --- DPO, conservative DPO, RPO, IPO ------------------------------------------------------------------------
def test_dpo_equals_trl_loss_gradients_and_metrics(trl, model_dirs, tmp_path):
    trainer = _trainer(trl.DPOTrainer, trl.DPOConfig, model_dirs, tmp_path, PAIRS, beta=0.1)
    batch = trainer.data_collator(_rows(trainer))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    pc, pr, rc, rr, *_ = _dpo_logps(trainer, batch)
    losses = L.dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert losses.shape == (len(PAIRS),)  # per pair, never reduced
    assert 0.1 < losses.min() and losses.max() < 5  # neither saturated nor linear: the test can tell
    _assert_same(_backward(trainer.model, losses.mean()), theirs)

    metrics = L.preference_metrics("dpo", pc, pr, 0.1, rc, rr)
    for name, values in metrics.items():
        assert values.mean().item() == pytest.approx(_trl_metric(trainer, name), abs=TOL), name
    assert 0 < metrics["rewards/accuracies"].mean() < 1  # the policy prefers chosen on some pairs only


def test_conservative_dpo_is_trl_on_the_pair_and_on_the_swapped_pair(trl, model_dirs, tmp_path):
    """TRL 1.16's "sigmoid" loss ignores label_smoothing (only robust/exo/aot read it), so the smoothed form
    -(1-e) log sig(b d) - e log sig(-b d) is checked against (1-e) x TRL(pairs) + e x TRL(pairs swapped)."""
    e = 0.2
    trainer = _trainer(trl.DPOTrainer, trl.DPOConfig, model_dirs, tmp_path, PAIRS, beta=0.1, label_smoothing=e)
    rows = _rows(trainer)
    swapped = [{**r, "chosen_ids": r["rejected_ids"], "rejected_ids": r["chosen_ids"]} for r in rows]
    batch, swapped_batch = trainer.data_collator(rows), trainer.data_collator(swapped)
    trl_loss = trainer.compute_loss(trainer.model, batch)
    _, unsmoothed_grads = _backward(trainer.model, trl_loss)
    trl_swapped, swapped_grads = _backward(trainer.model, trainer.compute_loss(trainer.model, swapped_batch))
    theirs = ((1 - e) * trl_loss.detach() + e * trl_swapped,
              {n: (1 - e) * g + e * swapped_grads[n] for n, g in unsmoothed_grads.items()})

    pc, pr, rc, rr, *_ = _dpo_logps(trainer, batch)
    ours = _backward(trainer.model, L.dpo_loss(pc, pr, rc, rr, beta=0.1, label_smoothing=e).mean())
    _assert_same(ours, theirs)
    assert abs(ours[0] - trl_loss.detach()) > 1e-3  # smoothing changed the loss: TRL's own value is not it


def test_rpo_sft_term_is_a_token_mean_over_the_chosen_responses(trl, model_dirs, tmp_path):
    """rpo_alpha in TRL 1.16: loss_type ["sigmoid", "sft"], loss_weights [1, alpha]; the SFT term is the mean
    of -log p over every chosen-response token of the micro batch."""
    alpha = 0.5
    trainer = _trainer(trl.DPOTrainer, trl.DPOConfig, model_dirs, tmp_path, PAIRS, beta=0.1,
                       loss_type=["sigmoid", "sft"], loss_weights=[1.0, alpha])
    batch = trainer.data_collator(_rows(trainer))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    pc, pr, rc, rr, nc, _, chosen_token_logps, _ = _dpo_logps(trainer, batch)
    nll = -chosen_token_logps.sum() / nc.sum()
    _assert_same(_backward(trainer.model, L.dpo_loss(pc, pr, rc, rr, 0.1).mean() + alpha * nll), theirs)


def test_ipo_equals_trl_with_its_length_normalization(trl, model_dirs, tmp_path):
    trainer = _trainer(trl.DPOTrainer, trl.DPOConfig, model_dirs, tmp_path, PAIRS, beta=0.5, loss_type="ipo")
    batch = trainer.data_collator(_rows(trainer))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    pc, pr, rc, rr, nc, nr, *_ = _dpo_logps(trainer, batch)
    assert not torch.equal(nc, nr)  # lengths differ, so the normalization is exercised
    losses = L.ipo_loss(pc, pr, rc, rr, nc, nr, beta=0.5)
    assert losses.shape == (len(PAIRS),)
    _assert_same(_backward(trainer.model, losses.mean()), theirs)
    # TRL logs DPO's unnormalized rewards for IPO too
    metrics = L.preference_metrics("ipo", pc, pr, 0.5, rc, rr)
    assert metrics["rewards/margins"].mean().item() == pytest.approx(_trl_metric(trainer, "rewards/margins"),
                                                                     abs=TOL)


# --- SimPO and ORPO (no reference; the older paired collator) -----------------------------------------------
def _paired_logps(model, batch, side, whole_sequence=False):
    """Summed log-probs, counts and per-token log-probs of TRL's `chosen_*` / `rejected_*` rows: the response
    tokens (labels != -100), or every attended token after the first (ORPO's NLL)."""
    ids, attention = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"]
    supervised = attention if whole_sequence else batch[f"{side}_labels"] != -100
    return _token_logps(model, ids, attention, supervised)


@pytest.mark.parametrize("sft_weight", [0.0, 0.3])
def test_simpo_equals_trl_cpo_simpo(trl, model_dirs, tmp_path, sft_weight):
    """cpo_alpha is the SFT term's weight (rpo_alpha for simpo): a token mean over the chosen responses."""
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    trainer = _trainer(CPOTrainer, CPOConfig, model_dirs, tmp_path, PAIRS, reference=False, loss_type="simpo",
                       beta=2.0, simpo_gamma=1.0, cpo_alpha=sft_weight)
    batch = trainer.data_collator(_rows(trainer))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    pc, nc, chosen_token_logps = _paired_logps(trainer.model, batch, "chosen")
    pr, nr, _ = _paired_logps(trainer.model, batch, "rejected")
    losses = L.simpo_loss(pc, pr, nc, nr, beta=2.0, gamma=1.0)
    assert losses.shape == (len(PAIRS),)
    loss = losses.mean() + sft_weight * (-chosen_token_logps.sum() / nc.sum())
    _assert_same(_backward(trainer.model, loss), theirs)

    stored = trainer._stored_metrics["train"]
    for name, values in L.preference_metrics("simpo", pc, pr, 2.0, chosen_tokens=nc, rejected_tokens=nr).items():
        assert values.mean().item() == pytest.approx(stored[name][-1], abs=TOL), name


def test_orpo_equals_trl_and_its_nll_covers_the_prompt(trl, model_dirs, tmp_path):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    alpha = 0.1
    trainer = _trainer(ORPOTrainer, ORPOConfig, model_dirs, tmp_path, PAIRS, reference=False, beta=alpha)
    batch = trainer.data_collator(_rows(trainer))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    pc, nc, _ = _paired_logps(trainer.model, batch, "chosen")
    pr, nr, _ = _paired_logps(trainer.model, batch, "rejected")
    losses, log_odds = L.orpo_loss(pc, pr, nc, nr, alpha)
    assert losses.shape == log_odds.shape == (len(PAIRS),)
    whole, whole_tokens, _ = _paired_logps(trainer.model, batch, "chosen", whole_sequence=True)
    nll = -whole.sum() / whole_tokens.sum()  # prompt and response tokens, one mean over the micro batch
    _assert_same(_backward(trainer.model, nll + losses.mean()), theirs)

    response_only_nll = -pc.sum() / nc.sum()
    assert abs(response_only_nll.item() - nll.item()) > 1e-2  # TRL's ORPO NLL is not the response-only one
    stored = trainer._stored_metrics["train"]
    for name, values in L.preference_metrics("orpo", pc, pr, alpha, chosen_tokens=nc, rejected_tokens=nr).items():
        assert values.mean().item() == pytest.approx(stored[name][-1], abs=TOL), name
    assert stored["nll_loss"][-1] == pytest.approx(nll.item(), abs=TOL)


# --- KTO ----------------------------------------------------------------------------------------------------
UNPAIRED = [{"prompt": p["prompt"], "completion": p[side], "label": side == "chosen"}
            for p, side in zip(PAIRS + PAIRS, ["chosen", "rejected", "rejected", "chosen"] * 2)]


def _kto_logps(trainer, batch):
    def run(model, prefix):
        return _token_logps(model, batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"],
                            batch[f"{prefix}completion_mask"])[0]

    policy = run(trainer.model, "")
    with torch.no_grad():
        policy_kl, ref, ref_kl = run(trainer.model, "KL_"), run(trainer.ref_model, ""), run(trainer.ref_model, "KL_")
    return policy, ref, policy_kl, ref_kl


@pytest.mark.parametrize("indices", [[0, 1, 2, 3], [0, 3]], ids=["both-labels", "desirable-only"])
def test_kto_equals_trl_loss_gradients_and_metrics(trl, model_dirs, tmp_path, indices):
    trainer = _trainer(trl.KTOTrainer, trl.KTOConfig, model_dirs, tmp_path, UNPAIRED[:4], beta=0.1,
                       desirable_weight=1.3, undesirable_weight=0.7)
    batch = trainer.data_collator(_rows(trainer, indices))
    theirs = _backward(trainer.model, trainer.compute_loss(trainer.model, batch))

    policy, ref, policy_kl, ref_kl = _kto_logps(trainer, batch)
    kl = L.kto_kl(policy_kl, ref_kl)
    losses = L.kto_loss(policy, ref, batch["label"], kl, 0.1, desirable_weight=1.3, undesirable_weight=0.7)
    assert losses.shape == (len(indices),)
    _assert_same(_backward(trainer.model, losses.mean()), theirs)

    assert kl.item() == pytest.approx(_trl_metric(trainer, "kl"), abs=TOL)
    assert kl.item() > 0  # the clamp did not decide this case
    metrics = L.kto_metrics(policy, ref, batch["label"], 0.1)
    for name, values in metrics.items():
        if values.numel():
            assert values.mean().item() == pytest.approx(_trl_metric(trainer, name), abs=TOL), name
        else:  # a micro batch without undesirable examples: TRL logs nothing for them, nor a margin
            assert name not in trainer._metrics["train"]
    assert ("rewards/margins" in trainer._metrics["train"]) == bool(metrics["rewards/rejected"].numel())


def test_kto_kl_pairs_rotate_completions_within_each_batch_in_dataset_order(trl, model_dirs, tmp_path):
    """TRL 1.16 builds the mismatched KL pairs once, at dataset preparation: within each consecutive chunk of
    per_device_train_batch_size rows, row i gets the completion of row i-1 (the first gets the chunk's last), and
    it reads the rows in order (train_sampling_strategy "sequential"), so the chunks are the micro batches.
    Paired records are unpaired chosen-first: [chosen of every pair..., rejected of every pair...]."""
    paired = PAIRS[:3]
    rows = _rows(_trainer(trl.KTOTrainer, trl.KTOConfig, model_dirs, tmp_path, paired, batch_size=3, beta=0.1))
    assert [r["label"] for r in rows] == [True] * 3 + [False] * 3
    assert [r["completion"].removesuffix("<|endoftext|>") for r in rows] == \
        [p["chosen"] for p in paired] + [p["rejected"] for p in paired]
    for start in (0, 3):  # two chunks of 3: all desirable, then all undesirable
        chunk = rows[start:start + 3]
        for i, row in enumerate(chunk):
            assert row["KL_completion_ids"] == chunk[i - 1]["completion_ids"]

    # 5 rows in chunks of 2: (0 1) (2 3) (4); the last chunk's one row is paired with its own completion
    trainer = _trainer(trl.KTOTrainer, trl.KTOConfig, model_dirs, tmp_path, UNPAIRED[:5], batch_size=2, beta=0.1)
    assert trainer.args.train_sampling_strategy == "sequential"
    rows = _rows(trainer)
    kl_source = [1, 0, 3, 2, 4]
    assert [r["KL_completion_ids"] for r in rows] == [rows[j]["completion_ids"] for j in kl_source]


# --- properties (no TRL) ------------------------------------------------------------------------------------
def _pairs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g, dtype=torch.float64) * 30 + 1) for _ in range(4)]


def test_dpo_at_policy_equal_reference_is_log_2_smoothed_or_not():
    pc, pr, _, _ = _pairs()
    for e in (0.0, 0.1, 0.3):
        assert torch.allclose(L.dpo_loss(pc, pr, pc, pr, beta=0.1, label_smoothing=e),
                              torch.full_like(pc, math.log(2)))


def test_swapping_chosen_and_rejected_flips_the_margin_and_smoothing_mixes_the_two():
    pc, pr, rc, rr = _pairs()
    beta, e = 0.5, 0.1
    straight = L.preference_metrics("dpo", pc, pr, beta, rc, rr)
    swapped = L.preference_metrics("dpo", pr, pc, beta, rr, rc)
    assert torch.allclose(straight["rewards/margins"], -swapped["rewards/margins"])
    assert torch.equal(straight["rewards/accuracies"] + swapped["rewards/accuracies"],
                       (straight["rewards/margins"] != 0).double())
    loss, loss_swapped = L.dpo_loss(pc, pr, rc, rr, beta), L.dpo_loss(pr, pc, rr, rc, beta)
    assert not torch.allclose(loss, loss_swapped)
    assert torch.allclose(L.dpo_loss(pc, pr, rc, rr, beta, label_smoothing=e), (1 - e) * loss + e * loss_swapped)
    delta = (pc - rc) - (pr - rr)  # the formula, written out once
    formula = -(1 - e) * torch.log(torch.sigmoid(beta * delta)) - e * torch.log(torch.sigmoid(-beta * delta))
    assert torch.allclose(L.dpo_loss(pc, pr, rc, rr, beta, e), formula)


def test_ipo_is_zero_at_its_target_margin_and_normalizes_by_length():
    beta = 0.1
    nc, nr = torch.tensor([4.0, 10.0]), torch.tensor([8.0, 2.0])
    rc, rr = torch.tensor([-20.0, -30.0]), torch.tensor([-25.0, -9.0])
    pr = rr + torch.tensor([-3.0, 1.0])
    pc = rc + nc * ((pr - rr) / nr + 1 / (2 * beta))  # normalized margin exactly 1/(2 beta)
    assert torch.allclose(L.ipo_loss(pc, pr, rc, rr, nc, nr, beta), torch.zeros(2), atol=1e-5)
    # the same summed log-ratios over twice the tokens are half the normalized margin
    assert not torch.allclose(L.ipo_loss(pc, pr, rc, rr, 2 * nc, 2 * nr, beta), torch.zeros(2), atol=1e-3)


def test_simpo_and_orpo_at_equal_average_log_probs():
    n_c, n_r = torch.tensor([3.0, 7.0]), torch.tensor([6.0, 14.0])
    pc, pr = -2.0 * n_c, -2.0 * n_r  # same average log-prob, different lengths and sums
    assert torch.allclose(L.simpo_loss(pc, pr, n_c, n_r, beta=2.0, gamma=1.0),
                          torch.nn.functional.softplus(torch.tensor(1.0)).expand(2))
    losses, log_odds = L.orpo_loss(pc, pr, n_c, n_r, alpha=0.1)
    assert torch.allclose(log_odds, torch.zeros(2)) and torch.allclose(losses, torch.full((2,), 0.1 * math.log(2)))
    better, _ = L.orpo_loss(pc + 1, pr, n_c, n_r, alpha=0.1)
    assert (better < losses).all()


def test_kto_kl_is_detached_averaged_then_clamped():
    policy_kl = torch.tensor([-3.0, -5.0], requires_grad=True)
    ref_kl = torch.tensor([-4.0, -4.5])
    kl = L.kto_kl(policy_kl, ref_kl)
    assert not kl.requires_grad and kl.shape == () and kl.item() == pytest.approx(0.25)
    assert L.kto_kl(ref_kl, policy_kl.detach()).item() == 0.0  # negative estimates clamp to 0
    # several processes: their means are averaged BEFORE the clamp (-0.25 and +0.15 -> 0, not 0.075)
    other_rank = torch.tensor(0.15)
    assert L.kto_kl(ref_kl, policy_kl.detach(), lambda t: torch.cat([t, other_rank.reshape(1)]).mean()) == 0.0


def test_kto_weights_and_labels_pick_the_branch():
    policy, ref = torch.tensor([-5.0, -5.0, -9.0]), torch.tensor([-6.0, -6.0, -8.0])
    kl = torch.tensor(0.2)
    desirable = torch.tensor([True, False, True])
    base = L.kto_loss(policy, ref, desirable, kl, 0.1)
    weighted = L.kto_loss(policy, ref, desirable, kl, 0.1, desirable_weight=2.0, undesirable_weight=0.5)
    assert torch.allclose(weighted, base * torch.tensor([2.0, 0.5, 2.0]))
    assert base[0] < base[1]  # the same log-ratio (+1) is good for a desirable example, bad for an undesirable one
    only_desirable = L.kto_loss(policy, ref, torch.ones(3, dtype=torch.bool), kl, 0.1, undesirable_weight=7.0)
    assert torch.allclose(only_desirable, 1 - torch.sigmoid(0.1 * ((policy - ref) - kl)))
    metrics = L.kto_metrics(policy, ref, torch.ones(3, dtype=torch.bool), 0.1)
    assert metrics["rewards/rejected"].numel() == 0 and metrics["rewards/chosen"].numel() == 3


def test_losses_are_per_pair_so_concatenating_micro_batches_changes_nothing():
    pc, pr, rc, rr = _pairs(8)
    whole = L.dpo_loss(pc, pr, rc, rr, 0.1)
    parts = torch.cat([L.dpo_loss(pc[:3], pr[:3], rc[:3], rr[:3], 0.1),
                       L.dpo_loss(pc[3:], pr[3:], rc[3:], rr[3:], 0.1)])
    assert torch.equal(whole, parts)
