"""One optimizer step's GRPO batch, built once per generation: the step's prompts -> completions -> rewards ->
advantages -> (old and reference log-probs) -> micro batches, and the loss normalizer of the WHOLE step.

The completions of a process are in its slots' order: each prompt's G completions in a row, micro batch k holding
completions k x micro_batch_size onward, so a group may span micro batches but never processes or steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass

import torch

SAMPLES_PER_LOG = 4  # prompts (with all their completions) written to completions.jsonl at each logging step


@dataclass(frozen=True)
class GRPOSettings:
    """The method's resolved settings, as the trainer reads them (finetune/train/grpo/setup.py builds it)."""

    group: int
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    loss_type: str
    epsilon: float
    epsilon_high: float
    beta: float
    iterations: int
    scale_rewards: str
    mask_truncated: bool
    micro_batch: int
    seed: int
    pad_id: int
    eos_ids: tuple
    chat: bool  # prompts are conversations: completions go to the rewards as [{"role": "assistant", ...}]
    share_prompt: bool  # score a prompt's completions after one copy of it (proved on the model: setup.probe_grpo)
    capacity: int  # tokens per scoring row (a prompt with its completions longer than this gets a row alone)


def generation_seed(seed: int, step: int, rank: int) -> int:
    """The sampling seed of one step on one process: a function of the step alone, never of the RNG's history, so a
    resumed run samples exactly what the uninterrupted one did."""
    return (seed * 1_000_003 + step * 1_009 + rank) % (2**63 - 1)


def _rows(slots: list[dict]) -> list[dict]:
    rows = []
    for batch in slots:
        rows += [{"index": int(i), "prompt_ids": list(p), "record": json.loads(r)}
                 for i, p, r in zip(batch["index"], batch["prompt_ids"], batch["record"])]
    return rows


def _prompts(rows: list[dict], group: int) -> list[dict]:
    """Every G-th slot: the step's prompts. Each group's G slots name one prompt (the sampler's layout)."""
    prompts = rows[::group]
    for g, first in enumerate(prompts):
        members = {row["index"] for row in rows[g * group:(g + 1) * group]}
        if members != {first["index"]}:
            raise RuntimeError(f"a GRPO group holds prompts {sorted(members)}: the sampler's layout was broken")
    return prompts


def build_step(trainer, slots: list[dict], step: int):
    """(micro batches, normalizer, metrics, samples) for the optimizer step `step` from the dataloader's slots."""
    from finetune.train.grpo.advantages import group_advantages, zscore_groups
    from finetune.train.grpo.generation import generate_completions

    settings: GRPOSettings = trainer.grpo
    prompts = _prompts(_rows(slots), settings.group)
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    started = time.perf_counter()
    completions = generate_completions(
        model, [p["prompt_ids"] for p in prompts], settings.group, settings.max_completion_length,
        seed=generation_seed(settings.seed, step, trainer.accelerator.process_index), eos_ids=list(settings.eos_ids),
        pad_id=settings.pad_id, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    trainer.generation_seconds += time.perf_counter() - started
    trainer.generated_completions += len(completions.ids)
    trainer.generated_tokens += sum(completions.lengths)
    records = [p["record"] for p in prompts for _ in range(settings.group)]
    state = {"global_step": step, "max_steps": trainer.state.max_steps, "epoch": trainer.state.epoch}  # TRL's fields
    batch = trainer.rewards.score(**reward_inputs(trainer.processing_class, records, completions, settings.chat),
                                  trainer_state=state)
    values = torch.tensor(batch.values, dtype=torch.float32).T  # [N, F], NaN where missing
    weights = torch.tensor(trainer.rewards.weights, dtype=torch.float32)
    adv = group_advantages(values, weights, settings.group, settings.scale_rewards)  # raw: what is logged
    normalize = list(getattr(trainer.rewards, "normalize", None) or [])
    if any(normalize):  # `normalize: true` rewards z-scored within each group before the sum: what trains
        adv = dataclasses.replace(adv, advantages=group_advantages(
            zscore_groups(values, normalize, settings.group), weights, settings.group, settings.scale_rewards
        ).advantages)
    micro = micro_batches([p["prompt_ids"] for p in prompts for _ in range(settings.group)], completions,
                          adv.advantages, settings)
    _add_logps(trainer, model, micro, settings)
    normalizer = step_normalizer_all(trainer, micro, settings)
    metrics = step_metrics(adv, completions, batch, trainer.rewards.names)
    return micro, normalizer, metrics, samples(prompts, completions, adv, settings.group, trainer.processing_class,
                                               dict(zip(trainer.rewards.names, batch.values)))


def reward_inputs(tokenizer, records: list[dict], completions, chat: bool) -> dict:
    """TRL's keyword arguments: prompts, completions (text, or [assistant message] for chat prompts), completion_ids,
    and every other column of the records."""
    from finetune.data.grpo.prompts import reward_columns

    texts = tokenizer.batch_decode(completions.ids, skip_special_tokens=True)
    return {"prompts": [r["prompt"] for r in records],
            "completions": [[{"role": "assistant", "content": t}] for t in texts] if chat else texts,
            "completion_ids": [list(ids) for ids in completions.ids],
            "columns": reward_columns(records)}


def micro_batches(prompt_ids: list[list[int]], completions, advantages, settings: GRPOSettings) -> list[dict]:
    from finetune.train.grpo.loss import drop_truncated

    out = []
    for start in range(0, len(prompt_ids), settings.micro_batch):
        ids = [list(c) for c in completions.ids[start:start + settings.micro_batch]]
        width = max(1, max(len(c) for c in ids))
        padded = torch.full((len(ids), width), settings.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.float32)
        for i, c in enumerate(ids):
            padded[i, :len(c)], mask[i, :len(c)] = torch.tensor(c, dtype=torch.long), 1.0
        if settings.mask_truncated:
            mask = drop_truncated(mask, padded, settings.eos_ids)
        out.append({"prompt_ids": prompt_ids[start:start + settings.micro_batch], "completion_ids": ids,
                    "group": [n // settings.group for n in range(start, start + len(ids))],
                    "completion_mask": mask, "advantages": advantages[start:start + settings.micro_batch].clone()})
    return out


def _add_logps(trainer, model, micro: list[dict], settings: GRPOSettings) -> None:
    """old_logps (mu > 1: the ratio's denominator, at generation time) and ref_logps (beta > 0: the adapter off)."""
    from finetune.train.grpo.scoring import score_batch

    if settings.iterations == 1 and settings.beta == 0:
        return
    was_training = model.training
    model.eval()  # no dropout in a no-grad scoring pass (TRL scores old/ref log-probs the same way)
    try:
        with torch.no_grad():
            for batch in micro:
                if settings.iterations > 1:
                    batch["old_logps"] = score_batch(model, batch, settings)[0].detach()
                if settings.beta > 0:
                    with model.disable_adapter():
                        batch["ref_logps"] = score_batch(model, batch, settings)[0].detach()
    finally:
        model.train(was_training)


def step_normalizer_all(trainer, micro: list[dict], settings: GRPOSettings) -> torch.Tensor:
    """The loss normalizer over every completion of the step on every process."""
    from finetune.train.grpo.loss import step_normalizer

    counts = torch.tensor([sum(len(b["completion_ids"]) for b in micro),
                           sum(float(b["completion_mask"].sum()) for b in micro)], dtype=torch.float64,
                          device=trainer.args.device)
    if trainer.accelerator.num_processes > 1:
        counts = trainer.accelerator.reduce(counts, reduction="sum")
    sequences, tokens = int(counts[0].item()), counts[1:].cpu()
    return torch.tensor(step_normalizer(settings.loss_type, [tokens], sequences, settings.max_completion_length),
                        dtype=torch.float64)


def step_metrics(adv, completions, batch, names: list[str]) -> dict:
    """TRL's step metrics (name -> (value, weight 1)): averaged over the steps of a logging window."""
    lengths = [len(c) for c in completions.ids]
    metrics = {"reward": adv.reward_mean, "reward_std": adv.reward_std, "frac_reward_zero_std": adv.zero_std_groups,
               "completions/mean_length": sum(lengths) / len(lengths), "completions/min_length": min(lengths),
               "completions/max_length": max(lengths),
               "completions/clipped_ratio": sum(completions.is_truncated) / len(lengths)}
    for i, name in enumerate(names):
        metrics[f"rewards/{name}/mean"] = float(adv.function_mean[i])
        metrics[f"rewards/{name}/std"] = float(adv.function_std[i])
        metrics[f"rewards/{name}/missing"] = float(torch.isnan(torch.tensor(batch.values[i])).float().mean())
    return {k: (float(v), 1.0) for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}


def samples(prompts: list[dict], completions, adv, group: int, tokenizer, by_function: dict[str, list[float]]
            ) -> list[dict]:
    """completions.jsonl's entries: a few prompts with every completion, its total reward (weighted), each reward
    function's value (`by_function`: name -> one value per completion, NaN where missing; None in the file),
    its advantage and whether it was cut at max_completion_length."""
    def value(v) -> float | None:
        return None if math.isnan(float(v)) else float(v)

    out = []
    for g, prompt in enumerate(prompts[:SAMPLES_PER_LOG]):
        members = range(g * group, (g + 1) * group)
        out.append({"prompt": prompt["record"]["prompt"],
                    "completions": tokenizer.batch_decode([completions.ids[i] for i in members], skip_special_tokens=True),
                    "rewards": [value(adv.rewards[i]) for i in members],
                    "rewards_by_function": {name: [value(values[i]) for i in members]
                                            for name, values in by_function.items()},
                    "advantages": [round(float(adv.advantages[i]), 4) for i in members],
                    "truncated": [bool(completions.is_truncated[i]) for i in members]})
    return out
