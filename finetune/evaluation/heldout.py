"""Held-out data and the loss on it.

The examples are the training's own: the recipe's records through the one encoder (finetune/data), fitted to
sequence_len, and the same seeded eval split (`val_set_size`); or every record of a file given with `--data`,
which must hold the record shape the run trained on. Loss is the mean negative log-likelihood per supervised
token (labels != -100: the responses / assistant turns, exactly what training supervised), over all held-out
tokens at once; perplexity is exp(loss). The Trainer's eval_loss averages per batch instead, so it can differ
slightly from this number when examples differ in length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from finetune.contract import IGNORE_INDEX
from finetune.errors import DataError

BATCH_EXAMPLES = 8  # examples per forward pass: padded to the longest, small enough for a 2 GB model on CPU


@dataclass
class Heldout:
    examples: list  # finetune.data.formats.Example (SFT) or Pair (preference)
    records: list  # (shape, record) per example, in step
    source: str  # where they came from, for the report


def record_text(value) -> str:
    """A record's text for a report: a string, or a conversation's turns as `role: content` lines."""
    if isinstance(value, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in value)
    return "" if value is None else str(value)


def _check_shapes(path: str, found: set[str], trained: set[str]) -> None:
    foreign = found - trained - {"auto"}
    if foreign and "auto" not in trained:  # a run that does not record its shapes cannot be checked
        raise DataError(
            f"`{path}` holds {', '.join(sorted(foreign))} records, but the run trained on "
            f"{', '.join(sorted(trained))} records: its loss would be measured on a format the model never saw. "
            f"Pass a records file of the run's shape to --data (or `eval.data`), or leave it out to use the "
            "recipe's eval split"
        )


def heldout_data(subject, tokenizer, data_path: str | None) -> Heldout:
    """The held-out examples and their records: `data_path`'s records, or the recipe's eval split."""
    from finetune.recipe.methods import reads_pairs

    recipe = subject.recipe
    if data_path:
        from finetune.ingest.records import read_records, require_records_file

        require_records_file(data_path)
        shapes = {shape for shape, _ in read_records(data_path, "auto")}
        _check_shapes(data_path, shapes, subject.formats if not reads_pairs(recipe) else {"preference", "unpaired"})
        files, source = [("auto", data_path)], f"all records of {data_path}"
        if reads_pairs(recipe):
            return _preference(recipe, tokenizer, files, source, split_off=False)
        from finetune.data import tokenize_all

        records: list = []
        examples, _ = tokenize_all(recipe, tokenizer, files, records)
        return Heldout(examples, records, source)
    from finetune.data import record_files

    if recipe.val_set_size == 0:
        raise DataError(
            "the recipe holds nothing out (`val_set_size: 0`), so there is no eval split to evaluate on; pass a "
            "records file with --data (or `eval.data`), or set `val_set_size` (e.g. 32) and train again"
        )
    files = record_files(recipe)
    source = f"the recipe's eval split (val_set_size {recipe.val_set_size:g}, seed {recipe.seed})"
    if reads_pairs(recipe):
        return _preference(recipe, tokenizer, files, source, split_off=True)
    from finetune.data import tokenize_all

    records = []
    examples, _ = tokenize_all(recipe, tokenizer, files, records)
    held_idx = _held_indices(examples, recipe)
    return Heldout([examples[i] for i in held_idx], [records[i] for i in held_idx], source)


def _held_indices(items: list, recipe) -> list[int]:
    """The indices split() holds out: the same seeded draw (finetune/data split)."""
    from finetune.data import split

    tagged = list(range(len(items)))
    _, held = split(tagged, recipe)
    return held


def _preference(recipe, tokenizer, files, source: str, split_off: bool) -> Heldout:
    """Preference pairs (and their records) as training tokenized them."""
    from finetune.data.preference.pairs import tokenize_preferences

    records: list = []  # in step with the items: a dropped pair takes its record with it
    items, _ = tokenize_preferences(recipe, tokenizer, files, records)
    idx = _held_indices(items, recipe) if split_off else list(range(len(items)))
    return Heldout([items[i] for i in idx], [records[i] for i in idx], source)


def padded_batches(examples, pad_id: int):
    """(input_ids, attention_mask, labels) tensors, BATCH_EXAMPLES examples at a time, padded on the right."""
    import torch

    for start in range(0, len(examples), BATCH_EXAMPLES):
        chunk = examples[start:start + BATCH_EXAMPLES]
        width = max(len(ex.input_ids) for ex in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, ex in enumerate(chunk):
            n = len(ex.input_ids)
            ids[row, :n] = torch.tensor(ex.input_ids)
            labels[row, :n] = torch.tensor(ex.labels)
            mask[row, :n] = 1
        yield ids, mask, labels


def heldout_loss(model, examples, pad_id: int) -> dict:
    """{loss, perplexity, supervised_tokens, examples, per_example}: mean NLL per supervised token (next-token
    shifted); per_example: {"nll": each example's summed NLL, "tokens": its supervised tokens}, for the interval."""
    import torch

    device = next(model.parameters()).device
    nll_sums, counts = [], []
    with torch.no_grad():
        for ids, mask, labels in padded_batches(examples, pad_id):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            targets = labels[:, 1:].to(device)
            nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                ignore_index=IGNORE_INDEX, reduction="none").view(targets.shape)
            nll_sums += nll.sum(dim=1).tolist()  # ignored positions are 0
            counts += (targets != IGNORE_INDEX).sum(dim=1).tolist()
    count = sum(counts)
    if count == 0:
        raise DataError("the held-out examples have no supervised tokens; check `train_on_inputs` and the data")
    loss = sum(nll_sums) / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "supervised_tokens": count,
            "examples": len(examples), "per_example": {"nll": nll_sums, "tokens": counts}}


def loss_difference(sides: dict, seed: int) -> dict:
    """tuned - base held-out loss with its bootstrap interval over the examples, each weighted by its supervised
    tokens (so the mean is the per-token loss the sides report); pops each side's per_example lists."""
    from finetune.evaluation.uncertainty import paired_interval

    base, tuned = sides["base"].pop("per_example"), sides["tuned"].pop("per_example")
    kept = [i for i, n in enumerate(base["tokens"]) if n]
    return paired_interval([base["nll"][i] / base["tokens"][i] for i in kept],
                           [tuned["nll"][i] / tuned["tokens"][i] for i in kept], seed,
                           weights=[base["tokens"][i] for i in kept], unit="examples")
