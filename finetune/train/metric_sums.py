"""Per-item metrics kept between two logs, on the device, and averaged over every process at the log: what the
pair-reading trainers (finetune/train/preference/, finetune/train/reward/) report under each metric's name.

    sums = MetricSums()
    sums.add({"accuracy": per_pair_tensor}, "train")   # each step: no sync, a device tensor
    sums.add_extremes({"min_reward": scores}, "train")    # min / max kept instead of a mean (name says which)
    logs.update(sums.take("train", trainer))            # at a log: means over every item since the last one

A mean is over items (pairs), not over micro batches, so packed micro batches holding different numbers of pairs weigh
every pair the same, and every process's items count (sums and counts reduced over the processes).
"""

from __future__ import annotations


class MetricSums:
    def __init__(self):
        self._sums = {"train": {}, "eval": {}}  # name -> (sum, count) of per-item values
        self._extremes = {"train": {}, "eval": {}}  # name -> its min (a name starting with "min") or max

    def add(self, metrics: dict, mode: str) -> None:
        sums = self._sums[mode]
        for name, values in metrics.items():
            values = values.detach().double()
            total, count = sums.get(name, (0.0, 0))
            sums[name] = (total + values.sum(), count + values.numel())  # a device tensor: no sync per step

    def add_extremes(self, metrics: dict, mode: str) -> None:
        kept = self._extremes[mode]
        for name, values in metrics.items():
            value = values.detach().double()
            value = value.min() if name.startswith("min") else value.max()
            kept[name] = value if name not in kept else (kept[name].minimum(value) if name.startswith("min")
                                                          else kept[name].maximum(value))

    def take(self, mode: str, trainer) -> dict[str, float]:
        """{name: value} since the last take, over every process; then forget them."""
        import torch

        sums, kept, out = self._sums[mode], self._extremes[mode], {}
        device, reduce = trainer.args.device, trainer.args.world_size > 1
        if sums:
            names = sorted(sums)
            totals = torch.stack([torch.as_tensor(sums[n][0], dtype=torch.float64) for n in names]).to(device)
            counts = torch.tensor([float(sums[n][1]) for n in names], dtype=torch.float64, device=device)
            if reduce:
                totals = trainer.accelerator.reduce(totals, reduction="sum")
                counts = trainer.accelerator.reduce(counts, reduction="sum")
            out.update({name: total / count for name, total, count in zip(names, totals.tolist(), counts.tolist())
                        if count})
        for name, value in sorted(kept.items()):
            value = value.to(device).reshape(1)
            if reduce:  # every process's, then theirs
                value = trainer.accelerator.gather(value)
            out[name] = float((value.min() if name.startswith("min") else value.max()).item())
        sums.clear()
        kept.clear()
        return out
