"""The slop filter's recall and false positives, with the built-in phrase list alone and with the
phrase list plus the built-in patterns, on tests/assets/ingest/slop:

  slop_variants.txt         boilerplate sentences in the variants seen in public instruction sets
  clean_instructions.jsonl  clean instruction/response pairs, 40 of them near misses that talk about AI,
                            assistants, opinions and browsing (made by make_clean_sample.py)

Run: python benchmarks/bench_slop.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "assets" / "ingest" / "slop"


def main() -> int:
    from finetune.ingest.slop import SlopMatcher

    variants = [line.strip() for line in (SAMPLES / "slop_variants.txt").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    clean = [json.loads(line)["output"] for line in (SAMPLES / "clean_instructions.jsonl").open(encoding="utf-8")]
    full = SlopMatcher.build()
    for name, matcher in (("phrases only", dataclasses.replace(full, patterns=())), ("phrases + patterns", full)):
        caught = sum(bool(matcher.find(text)) for text in variants)
        flagged = [text for text in clean if matcher.find(text)]
        print(f"{name:18s}  slop variants caught {caught}/{len(variants)}  clean responses flagged "
              f"{len(flagged)}/{len(clean)} ({len(flagged) / len(clean):.1%})")
        for text in flagged:
            print(f"    false positive: {text[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
