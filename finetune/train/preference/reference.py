"""The reference: log-probs of the responses of every pair a run reads, under the model as it is before the first step.

DPO, IPO and KTO measure how far the policy has moved from a reference. Ours is the model the run starts
from, exactly as built (base, plus any adapter it continues, quantized or not, plus the fresh LoRA whose
zero-initialised B leaves its output unchanged), in evaluation mode (no dropout). With LoRA that is NOT the
base with the adapter switched off, which is what the usual "disable the adapter" reference computes and
which is wrong when the run continues an SFT adapter. No second model is held: the log-probs are computed
once, in one no-grad pass before the first optimizer step, and stored in a table keyed by the tokenized data,
the model's files and the settings that change its forward pass, next to the tokenized data
(cache_dir/prepared/reference/KEY.pt): a second run on the same data and model skips the pass.

The pass scores only the items the run reads (items_used): every eval item, and the train items of the micro
batches its optimizer steps take; a run shorter than an epoch reads the first max_steps x gradient accumulation
micro batches of the Trainer's own seeded order (the order a resumed run skips through), so a 6-step run scores
6 steps' pairs, not the whole split. The table holds a row per item, NaN where not scored: a later run on the same
data and model that reads more scores only the rows it lacks and stores the table again (a resumed run's model is
no longer the starting one: a fresh LoRA on a base scores them with its adapter switched off, the base it started
as; any other resume is refused, as without a table: setup.unrebuildable says why).

The pass runs where the first loss is computed (finetune/train/preference.py), through the model as the
Trainer holds it: wrapped by DDP or the DeepSpeed engine, so ZeRO-3's gathered weights and every process
take part. Each process scores a strided share of the items, in batches of items of similar length, and
the shares are gathered. A resumed run must find the table its first run stored: the model it holds then is
no longer the one it started from (finetune/train/run.py refuses otherwise).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from finetune.atomic import replaced_whole
from finetune.data.preference.rows import PACKED, UNPACKED

# recipe fields that change the starting model's forward pass (the data key covers data and tokenizer)
MODEL_FIELDS = ("base_model", "adapter", "load_in_4bit", "load_in_8bit", "lora_modules_to_save", "tokens",
                "special_tokens", "seed",
                # PiSSA / OLoRA hold W - B0A0 in the base (rounded in bf16), DoRA m / |W| x W: the start, up to rounding
                "peft_init_lora_weights", "peft_use_dora")
QUARTER_LINES = 16  # a pass over fewer items logs no progress lines off a terminal (its start and end lines say enough)
SMALL_FILE = 1 << 20  # files up to 1 MiB (configs, adapter configs) are hashed by content; weights by size + mtime


def model_fingerprint(recipe) -> str:
    from finetune.model.loader import resolve_model_path

    from finetune.model.loader import adapter_folder

    digest = hashlib.sha256()
    adapter = adapter_folder(recipe.base_model)  # an adapter on its base: both sets of files
    for source in [Path(resolve_model_path(recipe.base_model, recipe.cache_dir)), *([adapter] if adapter else [])]:
        if not source.is_dir():
            digest.update(str(source).encode())  # a hub id
            continue
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            stat = path.stat()
            digest.update(str(path.relative_to(source)).encode())
            if stat.st_size <= SMALL_FILE:
                digest.update(path.read_bytes())
            else:
                digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def reference_key(recipe, data_key: str, precision: str, images: str = "") -> str:
    """`images`: a vision-language model's, the hash of every prompt image's bytes (the data key holds the
    processor's settings and the records, whose image paths stay the same when an image is edited in place)."""
    fields = {name: getattr(recipe, name) for name in MODEL_FIELDS}
    key = {"data": data_key, "model": model_fingerprint(recipe), "precision": precision, "fields": fields}
    if images:
        key["images"] = images
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]


def reference_path(recipe, data_key: str, precision: str, images: str = "") -> Path:
    from finetune.data import prepared_root

    return prepared_root(recipe) / "reference" / f"{reference_key(recipe, data_key, precision, images)}.pt"


def load_table(path: Path, items: int):
    import torch

    if not path.is_file():
        return None
    table = torch.load(path, map_location="cpu", weights_only=True)
    return table if tuple(table.shape) == (items, 2) else None


def save_table(path: Path, table) -> None:
    """Temp file + rename: a crash never leaves a table that looks complete."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_whole(path) as tmp:
        torch.save(table, tmp)


def unscored(table, items: list[int]) -> list[int]:
    """The `items` whose row in `table` (None: no table yet) holds no log-probs."""
    if table is None:
        return list(items)
    import torch

    missing = torch.isnan(table[torch.tensor(items, dtype=torch.long)]).any(dim=1).tolist() if items else []
    return [item for item, gone in zip(items, missing) if gone]


def items_in_rows(rows: list[list[int]]) -> list[int]:
    """The items of the Trainer's dataset rows (one item a row unpacked, several packed), each once, in order."""
    return sorted({int(item) for row in rows for item in row})


def my_batches(store, budget_tokens: int, rank: int, world: int, items: list[int] | None = None) -> list[list[int]]:
    """This process's share of `items` (None: every item), in batches of similar length holding at most `budget_tokens` token
    slots (items x the longest item; at least one item); every process gets as many batches (ZeRO-3 needs every
    process in every forward pass), the short lists repeating their last item."""
    order = sorted(range(len(store)) if items is None else items, key=store.length)
    shares = [order[r::world] or order[:1] for r in range(world)]
    per_rank = [_fill(share, store, budget_tokens) for share in shares]
    batches, count = per_rank[rank], max(len(b) for b in per_rank)
    while len(batches) < count:
        batches.append(batches[-1][-1:])
    return batches


def _fill(items: list[int], store, budget_tokens: int) -> list[list[int]]:
    """Consecutive items (sorted by length) into batches of at most `budget_tokens` padded token slots."""
    batches, current = [], []
    for item in items:  # ascending length: the item being added is the batch's longest
        if current and (len(current) + 1) * store.length(item) > budget_tokens:
            batches.append(current)
            current = []
        current.append(item)
    return batches + ([current] if current else [])


def compute_table(model, head, collator, store, budget_tokens: int, prepare, full_logits: bool, rank: int, world: int,
                  items: list[int] | None = None, table=None, progress=None):
    """`table` ((items, 2) fp32 log-probs, NaN where not scored; None: an empty one) with the rows of `items` (None:
    every item) filled, on CPU, identical on every process: a pair's chosen and rejected response, or a KTO example's completion
    and its KL partner's completion after its prompt. A forward holds at most `budget_tokens` token slots (the run
    passes what a training micro batch holds: no gradients are kept here, so this fits wherever training fits).
    `progress(done)`: called with this process's items scored so far, after each batch."""
    import torch

    from finetune.model.sequence_logps import response_logps

    table = torch.full((len(store), 2), float("nan")) if table is None else table.clone()
    was_training = model.training
    model.eval()
    done = 0
    try:
        with torch.no_grad():
            for items in my_batches(store, budget_tokens, rank, world, items):
                # pairs that share their prompt: the batch as one packed row (its tokens are at most the slots)
                shared = getattr(collator, "share_prompt", False)
                batch = prepare(collator([{PACKED: items}] if shared else [{UNPACKED: [i]} for i in items]))
                logps = response_logps(model, head, batch, full_logits)
                if store.unpaired:
                    logps = torch.cat([logps, response_logps(model, head, batch["kl"], full_logits)]).view(2, -1).T
                else:
                    logps = torch.stack([logps[batch["chosen_index"]], logps[batch["rejected_index"]]], dim=1)
                table[torch.tensor(items)] = logps.float().cpu()
                done += len(items)
                if progress is not None:
                    progress(done)
    finally:
        model.train(was_training)
    if world > 1:
        import torch.distributed as dist

        shares = [None] * world
        dist.all_gather_object(shares, table)
        for share in shares:  # each process filled its own rows; the rest are NaN
            table = torch.where(torch.isnan(table), share, table)
    return table


def progress_reporter(total: int, what: str, bar: bool, say):
    """progress(done) for compute_table: a tqdm bar on a terminal (`bar`, as the Trainer's own), else a line through
    `say` at each quarter of a pass of at least QUARTER_LINES items; (progress, close)."""
    if bar:
        from tqdm import tqdm

        from finetune.compat import disable_tqdm_monitor

        disable_tqdm_monitor(tqdm)
        shown = tqdm(total=total, unit=f" {what}", desc="reference log-probs", dynamic_ncols=True, leave=False)
        return (lambda done: shown.update(min(done, total) - shown.n)), shown.close
    quarters = {round(total * q / 4) for q in (1, 2, 3, 4)} if total >= QUARTER_LINES else set()
    started = time.time()

    def report(done: int) -> None:  # one line for a batch that passes one quarter mark or more
        passed = [mark for mark in quarters if done >= mark]
        quarters.difference_update(passed)
        if passed:
            say(f"reference log-probs: {min(done, total):,} of {total:,} {what} ({100 * min(done, total) / total:.0f}%, "
                f"{time.time() - started:.1f} s)")

    return report, (lambda: None)
