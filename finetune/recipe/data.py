"""The recipe's data keys: `datasets:` (one DatasetSpec per source: a records file, or a raw source ingested
first) and how records become tokens (chat template, sequence length, packing, the eval split, caches)."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Literal

import os

from pydantic import Field, model_validator

from finetune.recipe.tags import CONTENT, INGEST, TOKENS, TRAIN, Strict, affects

RECORD_TYPES = ("auto", "completion", "instruction", "chat", "preference", "unpaired", "prompt")
# What a records dataset's `map:` may name: the raw sources' record fields, and the conversation (the field of
# turns, the keys of a turn's role and text). finetune/ingest/record_map.py reads records by them.
FLAT_MAP_FIELDS = ("text", "instruction", "input", "output", "system", "user", "assistant")
CONVERSATION_MAP_FIELDS = ("messages", "role", "content")
# GRPO: the column holding the prompt; every other column is kept for the reward functions
PROMPT_MAP_FIELDS = ("prompt",)
# preference pairs: the fields holding the two answers (with a conversation mapping, or alone to rename them)
PAIR_MAP_FIELDS = ("chosen", "rejected")
# a chat record's images: the column read beside the turns (finetune/ingest/record_images.py)
IMAGES_MAP_FIELDS = ("images",)
RECORDS_MAP_FIELDS = FLAT_MAP_FIELDS + CONVERSATION_MAP_FIELDS + PROMPT_MAP_FIELDS + PAIR_MAP_FIELDS + IMAGES_MAP_FIELDS


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
RECORDS_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")


def looks_like_hub_id(path: str) -> bool:
    """`tatsu-lab/alpaca`, `squad`: at most one slash, not absolute, no records file extension."""
    return bool(_HUB_ID.match(path)) and PurePath(path).suffix.lower() not in RECORDS_SUFFIXES


def records_map_problems(mapping: dict) -> list[str]:
    """Problems with a records dataset's `map:`, one sentence each."""
    problems = [f"`map` cannot name `{field}` for records: it maps record fields ({', '.join(RECORDS_MAP_FIELDS)}) "
                "to the data's fields" for field in mapping if field not in RECORDS_MAP_FIELDS]
    conversation = set(mapping) & set(CONVERSATION_MAP_FIELDS)
    flat = set(mapping) & set(FLAT_MAP_FIELDS) - {"system"}
    if "prompt" in mapping and len(mapping) > 1:
        problems.append("`map` names `prompt` (a GRPO prompt record) with other fields; a prompt record maps only "
                        "`prompt`, and keeps every other column for the rewards")
    if set(mapping) & set(PAIR_MAP_FIELDS) and (flat or "prompt" in mapping):
        problems.append("`map` names `chosen`/`rejected` with flat fields; a pair maps them alone or with a "
                        "conversation (`messages`, `role`, `content`)")
    not_chat = set(mapping) & {"text", "instruction", "input", "output", "chosen", "rejected"}
    if "images" in mapping and not_chat:
        problems.append(f"`map` names `images` with {', '.join(f'`{f}`' for f in sorted(not_chat))}; images go with "
                        "a chat record: map them with the conversation (`messages`, `role`, `content`), with `user` "
                        "and `assistant`, or alone beside records that hold `messages`")
    if conversation and flat:
        problems.append(f"`map` mixes a conversation ({', '.join(sorted(conversation))}) with flat fields "
                        f"({', '.join(sorted(flat))}); map one record shape")
    return problems

class DatasetSpec(Strict):
    """One training data source: a records file, or a raw source (HTML, CSV, SQL...) ingested first."""

    path: str = Field(
        description=(
            "Records: a JSONL, JSON, parquet or arrow file; a folder laid out like a hub dataset (parquet/arrow/JSON "
            "shards); a `save_to_disk` folder; or a Hugging Face hub dataset id (`tatsu-lab/alpaca`, with `name`, "
            "`split`, `revision`, `data_files`; docs/data-sources.md). Relative paths are relative to the recipe "
            "file. For a raw source "
            "type: an HTML file, folder or glob; a CSV/TSV file (.gz/.bz2/.zip too); a SQL dump; a SQLite file; "
            "a database URL (`type: database`); or a records file to clean (`type: records`)."
        ),
        json_schema_extra=affects(CONTENT),
    )
    type: Literal[  # type: ignore[valid-type]
        "auto", "completion", "instruction", "chat", "preference", "unpaired", "prompt", "html", "csv", "sql",
        "sqlite", "database", "records"
    ] = Field(
        "auto",
        description=(
            "Record shape: `completion` ({text}), `instruction` ({instruction, input, output}, alpaca prompt), "
            "`chat` ({messages: [{role, content}]}), `preference` ({prompt, chosen, rejected}, plain text or "
            "messages; also sharegpt- and alpaca-style pairs), `unpaired` ({prompt, completion, label}, for KTO), "
            "`prompt` ({prompt, ...the columns the rewards read}, for GRPO: docs/grpo.md), or `auto` to detect it from each record's keys (docs/preference.md). "
            "Raw sources, ingested and cleaned into records first (cached by content hash; see "
            "docs/ingestion.md): `html`, `csv`, `sql` (a dump file), `sqlite`, `database` (a SQLAlchemy URL), "
            "`records` (a JSONL/JSON file run through the cleaning steps)."
        ),
        json_schema_extra=affects(CONTENT, INGEST),
    )
    # --- raw sources: what becomes a record (docs/ingestion.md) ---
    map: dict[str, str] | None = Field(
        None,
        description=(
            "Record field -> column (CSV/SQL/database, and records datasets), a `{column}` template, or a CSS "
            "selector (HTML). Fields: text | instruction, input, output | system, user, assistant; records also "
            "take the conversation: `messages` (the field of turns), `role` and `content` (the keys of a turn), "
            "`system` (a field that becomes a system turn; in instruction data it replaces the alpaca prompt's "
            "opening sentence), and `images` (the column of a chat record's images: paths, bytes or an Image "
            "feature; default `images`, or the one Image column). E.g. {instruction: question, output: answer}; "
            "{messages: conversations, role: from, content: value}. Default: fields already named like record "
            "fields; sharegpt (`conversations` of from/value turns) is read as it is."
        ),
        json_schema_extra=affects(INGEST),
    )
    # --- records datasets: where and how to read them (docs/data-sources.md) ---
    roles: dict[str, Literal["system", "user", "assistant"]] | None = Field(  # type: ignore[valid-type]
        None,
        description=(
            "Records: a turn's role name in the data -> ours, e.g. {human: user, gpt: assistant, bot: assistant}. "
            "human, gpt, system, user and assistant are known without it; any other role is an error naming "
            "the record."
        ),
        json_schema_extra=affects(CONTENT),
    )
    name: str | None = Field(
        None, description="Records from a hub id or a hub-shaped folder: the dataset's config name.",
        json_schema_extra=affects(CONTENT),
    )
    split: str = Field(
        "train", description="Records from a hub id, a hub-shaped folder or a save_to_disk folder: the split read.",
        json_schema_extra=affects(CONTENT),
    )
    revision: str | None = Field(
        None, description="Records from a hub id: a branch, tag or commit (default: the main branch, resolved "
                          "to its commit for the cache key).",
        json_schema_extra=affects(CONTENT),
    )
    data_files: str | list[str] | None = Field(
        None, description="Records from a hub id or a hub-shaped folder: which files (globs) to read.",
        json_schema_extra=affects(CONTENT),
    )
    template: str | None = Field(
        None, description='Raw sources: completion text from a template of columns, e.g. "{title}\\n\\n{body}".',
        json_schema_extra=affects(INGEST),
    )
    table: str | None = Field(
        None, description="`sql`, `sqlite`, `database`: the table whose rows become records.",
        json_schema_extra=affects(INGEST),
    )
    query: str | None = Field(
        None, description="`sqlite`, `database`: a read-only SELECT whose rows become records.",
        json_schema_extra=affects(INGEST),
    )
    sql_dialect: Literal["auto", "mysql", "postgres", "sqlite"] = Field(
        "auto", description="`sql`: the dump's dialect (quoting and escapes); `auto` detects it.",
        json_schema_extra=affects(INGEST),
    )
    html_mode: Literal["document", "sections"] = Field(
        "document", description="`html`: one record per page, or one per heading section (see html_split_level).",
        json_schema_extra=affects(INGEST),
    )
    html_split_level: int = Field(
        2, ge=1, le=6,
        description="`html` with `html_mode: sections`: start a section at headings h1..hN (2: at h1 and h2).",
        json_schema_extra=affects(INGEST),
    )
    delimiter: str | None = Field(
        None, description="`csv`: field delimiter. Default: comma, tab for .tsv.", json_schema_extra=affects(INGEST),
    )
    encoding: str | None = Field(
        None, description="Raw sources: input encoding. Default: BOM, then the declared charset, then detection.",
        json_schema_extra=affects(INGEST),
    )
    unescape_html: bool = Field(
        False, description="`csv`, `sql`, `sqlite`, `database`: turn &amp; &lt; ... in cells into characters.",
        json_schema_extra=affects(INGEST),
    )
    # --- raw sources: cleaning ---
    slop: Literal["drop", "strip", "off"] = Field(
        "drop",
        description=(
            'Raw sources: a record whose response holds a slop/refusal phrase ("As an AI language model"...) '
            "is dropped, or only the offending sentences are stripped, or nothing is done (`off`)."
        ),
        json_schema_extra=affects(INGEST),
    )
    slop_phrases: list[str] = Field(
        [], description="Raw sources: extra slop phrases (case and spacing ignored).",
        json_schema_extra=affects(INGEST),
    )
    slop_file: str | None = Field(
        None, description="Raw sources: a file of extra slop phrases, one a line.", json_schema_extra=affects(INGEST),
    )
    slop_builtin: bool = Field(
        True, description="Raw sources: use the built-in, narrow, curated slop phrase list.",
        json_schema_extra=affects(INGEST),
    )
    normalize: bool = Field(
        True, description="Raw sources: unicode NFC and whitespace normalization.", json_schema_extra=affects(INGEST),
    )
    dedup: bool = Field(
        True, description="Raw sources: drop exact duplicates (after normalization).",
        json_schema_extra=affects(INGEST),
    )
    near_dedup: float | None = Field(
        None, gt=0.0, lt=1.0, description="Raw sources: drop near-duplicates at this Jaccard similarity, e.g. 0.85.",
        json_schema_extra=affects(INGEST),
    )
    min_chars: int = Field(
        1, ge=0, description="Raw sources: drop records shorter than this many characters.",
        json_schema_extra=affects(INGEST),
    )
    max_chars: int | None = Field(
        None, gt=0, description="Raw sources: drop records longer than this many characters.",
        json_schema_extra=affects(INGEST),
    )
    strict: bool = Field(
        False, description="Raw sources: fail when any input row, page or statement was unusable.",
        json_schema_extra=affects(INGEST),
    )

    @model_validator(mode="after")
    def _raw_source_options(self) -> "DatasetSpec":
        """Ingestion options only where they mean something: a setting is never silently ignored."""
        only = {"table": ("sql", "sqlite", "database"), "query": ("sqlite", "database"), "sql_dialect": ("sql",),
                "html_mode": ("html",), "html_split_level": ("html",), "delimiter": ("csv",),
                "map": ("html", "csv", "sql", "sqlite", "database"), "template": ("csv", "sql", "sqlite", "database")}
        records_keys = ("map", "roles", "name", "split", "revision", "data_files")
        for name in sorted(self.model_fields_set - {"path", "type"}):
            allowed = only.get(name)
            if name in records_keys[1:] and self.type not in RECORD_TYPES:
                raise ValueError(f"`{name}` applies to records datasets (type: {', '.join(RECORD_TYPES)}), "
                                 f"not to `type: {self.type}`")
            if self.type in RECORD_TYPES and name in records_keys:
                continue
            if self.type in RECORD_TYPES:
                raise ValueError(f"`{name}` applies to raw sources only; for a records file to be cleaned use "
                                 f"`type: records`, or set `type:` to html, csv, sql, sqlite or database")
            if allowed and self.type not in allowed:
                raise ValueError(f"`{name}` does not apply to `type: {self.type}`; it works with "
                                 f"{', '.join(allowed)}")
        if self.map and self.template:
            raise ValueError("give either `map` or `template`, not both")
        if self.type in RECORD_TYPES and self.map:
            for problem in records_map_problems(self.map):
                raise ValueError(problem)
        if self.type == "database" and not (self.query or self.table):
            raise ValueError("`type: database` needs `query: SELECT ...` or `table: NAME`")
        if self.max_chars is not None and self.max_chars < self.min_chars:
            raise ValueError(f"`max_chars` {self.max_chars} is below `min_chars` {self.min_chars}")
        return self


def _default_cache_dir() -> str:
    return os.environ.get("FINETUNE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "finetune")


class DataKeys(Strict):
    """Where the training data comes from and how it becomes tokens."""

    datasets: list[DatasetSpec] = Field(
        min_length=1, description="Training data sources.", json_schema_extra=affects(CONTENT),
    )

    chat_template: Literal["tokenizer_default", "chatml", "chatml_tools", "jinja"] = Field(
        "tokenizer_default",
        description=(
            "How chat records are rendered: the tokenizer's own template (ChatML if it has none), ChatML, "
            "`chatml_tools` (ChatML with the Hermes / Qwen2.5 tool format: tools, <tool_call> JSON, tool results; "
            "for tool transcripts and agents), or the Jinja template in chat_template_jinja."
        ),
        json_schema_extra=affects(TOKENS),
    )

    chat_template_jinja: str | None = Field(
        None, description="A Jinja chat template, with `chat_template: jinja`.", json_schema_extra=affects(TOKENS),
    )

    # tokens (truncation, drops) and train: with sample_packing it is the packed row length, packed after the cache
    sequence_len: int = Field(
        2048, gt=0, description="Longest example, in tokens.", json_schema_extra=affects(TOKENS, TRAIN),
    )

    excess_length_strategy: Literal["drop", "truncate", "error"] = Field(
        "drop", description="What to do with an example longer than sequence_len. Counted and reported.",
        json_schema_extra=affects(TOKENS),
    )

    sample_packing: bool = Field(
        False,
        description=(
            "Pack whole training examples into rows of sequence_len tokens (best-fit decreasing, seeded), position "
            "ids restarting at each example so examples never attend to each other (checked on the model before "
            "training). micro_batch_size then counts packed rows, not examples."
        ),
        json_schema_extra=affects(TRAIN),
    )

    # affects nothing a checkpoint holds: only how the eval split is batched
    eval_sample_packing: bool | None = Field(
        None, description="Pack the eval split too. Default: the same as sample_packing.", json_schema_extra=affects(),
    )

    # train: it changes the data order, so what each step sees
    group_by_length: bool = Field(
        False,
        description="Without packing: batch examples of similar length together to cut padding (order less random).",
        json_schema_extra=affects(TRAIN),
    )

    # tokens: it changes which records become examples (and the split drawn from them)
    dataset_exact_deduplication: bool = Field(
        False,
        description="Train each record once: a record identical to an earlier one, in the same dataset or another "
                    "(the same canonical record: prompt, chosen and rejected of a pair), is dropped and counted. "
                    "axolotl's key of the same name.",
        json_schema_extra=affects(TOKENS),
    )

    dataset_processes: int = Field(
        1, gt=0, description="Processes that tokenize records (worth it from ~100k records; each loads the tokenizer).",
        json_schema_extra=affects(),
    )

    train_on_inputs: bool = Field(
        False,
        description="Supervise prompts too. Off: only responses / assistant turns carry a loss.",
        json_schema_extra=affects(TOKENS),
    )

    roles_to_train: list[Literal["system", "user", "assistant"]] = Field(
        ["assistant"], min_length=1,
        description=("Chats: the turns that carry a loss (without train_on_inputs). An assistant turn is its answer "
                     "after the generation prompt; another role's turn is the whole rendered turn. Image tokens never "
                     "do. axolotl's key of the same name."),
        json_schema_extra=affects(TOKENS),
    )

    val_set_size: float = Field(
        0.0, ge=0.0, description="Held-out eval split: a fraction (< 1) or a number of examples (>= 1).",
        json_schema_extra=affects(TOKENS),
    )

    dataset_prepared_path: str | None = Field(
        None, description="Where tokenized datasets are cached. Default: cache_dir/prepared.",
        json_schema_extra=affects(),
    )

    cache_dir: str = Field(
        default_factory=_default_cache_dir,
        description="Cache for converted models and prepared data. Default: $FINETUNE_CACHE_DIR or ~/.cache/finetune.",
        json_schema_extra=affects(),
    )
