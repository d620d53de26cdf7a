"""What each recipe key affects (the tags the fingerprints and cache keys are derived from), and the strict
base every part of the recipe is built on (unknown keys are errors, assignments are validated)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# What changing a setting changes. Every field of Recipe and DatasetSpec carries `affects` in its metadata
# (tests/test_settings.py fails on a field without it); the resume fingerprint, the tokenization cache key and
# the ingest cache key are derived from these tags, never listed by hand. A field may carry several tags;
# an empty tuple means: changes neither the data nor what a step is (paths, logging, checkpoint cadence...).
TRAIN = "train"  # what an optimizer step is, or what the weights and optimizer state mean: the resume fingerprint
TOKENS = "tokens"  # the tokenized examples, keyed by the value: the tokenization cache key (data/cache.py)
CONTENT = "content"  # the data or the tokenizer, keyed by the CONTENT hash of the files / tokenizer, not the value
INGEST = "ingest"  # what ingesting a raw source writes: the ingest cache key (ingest/source.py)
# How long training runs (num_epochs, max_steps). Not fingerprinted: a resumed run with a larger value is a
# legitimate "train longer"; the learning-rate schedule is then re-planned over the new total.
LENGTH = "length"
AFFECTS_TAGS = (TRAIN, TOKENS, CONTENT, INGEST, LENGTH)


def affects(*tags: str) -> dict:
    """Field metadata: `Field(..., json_schema_extra=affects(TRAIN))` (it also shows in the JSON schema)."""
    return {"affects": tags}


def field_affects(model: type[BaseModel], name: str) -> tuple[str, ...] | None:
    """The `affects` tags of one field; None when the field was never classified."""
    extra = model.model_fields[name].json_schema_extra
    return tuple(extra["affects"]) if isinstance(extra, dict) and "affects" in extra else None


def fields_affecting(model: type[BaseModel], tag: str) -> tuple[str, ...]:
    """The fields of `model` tagged `tag`, in declaration order."""
    return tuple(name for name in model.model_fields if tag in (field_affects(model, name) or ()))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
