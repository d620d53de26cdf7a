"""What porting an axolotl recipe produces (finetune/port/convert.py and methods.py fill it): the finetune settings,
a comment per axolotl key that did not port as it was, the keys kept for a decision, what to do before training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml


def inline(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("...") else text  # safe_dump ends a bare scalar with "..."
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Ported:
    """The converted recipe and, for the YAML, one comment per axolotl key that did not port as it was."""

    settings: dict = field(default_factory=dict)
    comments: dict[str, list[str]] = field(default_factory=dict)  # finetune key (or "" = dropped) -> comments
    # (how many keys were set before it, "key: value" as written, why): rendered as comments in the source's order
    dropped: list[tuple[int, str, str]] = field(default_factory=list)
    hub_paths: list[str] = field(default_factory=list)  # dataset paths that look like hub ids: download first
    # keys kept as written because finetune cannot honour what they change: the recipe does not load until edited
    blocked: dict[str, str] = field(default_factory=dict)  # key -> "`key: value`: why"
    data_edits: list[str] = field(default_factory=list)  # records finetune does not read as they are: convert first
    todo: list[str] = field(default_factory=list)  # what to do before training, said once the recipe is written
    # settings inside a key (`datasets[0].field_x`, `fsdp_config.KEY`) left out, each said in its key's comments
    nested_dropped: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)  # `dropped` entries that head a block (`trl:`), not keys

    @property
    def dropped_count(self) -> int:
        """How many axolotl settings the recipe leaves out, each with a comment: top-level keys and keys inside
        one (a dataset's, fsdp_config's)."""
        return sum(written not in self.headers for _, written, _ in self.dropped) + len(self.nested_dropped)

    def note_dropped(self, key: str, where: str, text: str) -> None:
        """`where` (a setting inside `key`) is left out: said on `key`, counted."""
        self.note(key, text)
        self.nested_dropped.append(where)

    def note(self, key: str, text: str) -> None:
        self.comments.setdefault(key, []).append(text)

    def block(self, key: str, value: Any, why: str) -> None:
        self.settings[key] = value
        self.note(key, f"NEEDS YOUR DECISION: {why}")
        self.blocked[key] = f"`{key}: {inline(value)}`: {why}"

    def unblock(self, key: str, value: Any, why: str) -> None:
        """A key kept for a decision (`value` as written), decided away: out of the recipe, a dropped key's comment
        where it stood."""
        position = list(self.settings).index(key)
        del self.settings[key], self.blocked[key]
        self.comments.pop(key, None)
        self.dropped = [(n - (n > position), written, reason) for n, written, reason in self.dropped]
        self.drop(key, value, why)
        self.dropped[-1] = (position, *self.dropped[-1][1:])

    def drop(self, key: str, value: Any, why: str) -> None:
        written = yaml.safe_dump({key: value}, sort_keys=False, allow_unicode=True, width=100).rstrip()
        self.dropped.append((len(self.settings), written, why))
