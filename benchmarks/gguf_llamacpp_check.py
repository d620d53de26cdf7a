"""Does llama.cpp run an exported GGUF as transformers runs the merged model? (outside CI: needs llama-cpp-python)

For each chat prompt: the prompt rendered with the run's chat template, tokenized by transformers and by
llama.cpp (must be the same ids, BOS included or not as the file says), then 32 greedy tokens from each.

    python -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python   # compiles, minutes
    finetune export recipe.yml --gguf --quant f16 -o run.f16.gguf
    python benchmarks/gguf_llamacpp_check.py recipe.yml run.f16.gguf --llama-python /tmp/llamavenv/bin/python

Runs in the project's venv (transformers side) and starts --llama-python for the llama.cpp side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for writing clear emails.",
    "Write a Python function that reverses a string.",
    "Explain what a GGUF file is in one sentence.",
]
NEW_TOKENS = 32


def llamacpp_worker(gguf_path: str) -> None:
    """stdin: [{"text", "ids"}]; stdout: [{"ids" llama.cpp tokenized, "greedy" 32 ids}]. Runs in the llama venv."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf_path, n_ctx=1024, n_threads=2, verbose=False)
    results = []
    for case in json.load(sys.stdin):
        ids = llm.tokenize(case["text"].encode(), add_bos=True, special=True)  # BOS only if the file says so
        greedy = []
        llm.reset()
        for token in llm.generate(case["ids"], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            if token == llm.token_eos() or len(greedy) == NEW_TOKENS:
                break
            greedy.append(token)
        results.append({"ids": ids, "greedy": greedy})
    json.dump(results, sys.stdout)


def transformers_side(target: str) -> tuple[list[dict], object]:
    import torch

    from finetune.export.gguf import load_model
    from finetune.model.trained import locate, saved_tokenizer

    trained = locate(target)
    tokenizer = saved_tokenizer(trained.folder)
    model = load_model(trained, tokenizer)
    cases = []
    for prompt in PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        greedy = [t for t in out[0, len(ids):].tolist() if t != tokenizer.eos_token_id]
        cases.append({"text": text, "ids": ids, "greedy": greedy})
    return cases, tokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="the recipe or run folder that was exported")
    parser.add_argument("gguf", nargs="+", help="exported .gguf files to check (e.g. f16 and q8_0)")
    parser.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        llamacpp_worker(args.gguf[0])
        return 0
    cases, tokenizer = transformers_side(args.target)
    for path in args.gguf:
        proc = subprocess.run([args.llama_python, __file__, args.target, path, "--worker"], capture_output=True,
                              text=True, input=json.dumps([{"text": c["text"], "ids": c["ids"]} for c in cases]))
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        same_ids = same_greedy = 0
        matched = []
        for case, got in zip(cases, json.loads(proc.stdout)):
            same_ids += got["ids"] == case["ids"]
            same_greedy += got["greedy"] == case["greedy"]
            prefix = next((i for i, (a, b) in enumerate(zip(got["greedy"], case["greedy"])) if a != b),
                          min(len(got["greedy"]), len(case["greedy"])))
            matched.append(prefix)
            if got["greedy"] != case["greedy"]:
                print(f"  differs after {prefix} tokens:\n    transformers {tokenizer.decode(case['greedy'])!r}"
                      f"\n    llama.cpp    {tokenizer.decode(got['greedy'])!r}")
        print(f"{path}: prompt ids identical {same_ids}/{len(cases)}; greedy {NEW_TOKENS} tokens identical "
              f"{same_greedy}/{len(cases)}; tokens matching before the first difference {matched}")
        print(f"  e.g. {tokenizer.decode(cases[0]['greedy'])!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
