"""Does llama.cpp itself run each exported family as transformers runs the model? (outside CI: llama-cpp-python)

The tests read every family's GGUF back with transformers or gguf-py; this asks llama.cpp. For each family of
tests/test_export_gguf_families.py: the tiny model built there, exported (f32 unless --quant), then the logits of
one text at every position from transformers and from llama.cpp (llama-cpp-python, run in its own venv), side by
side, and whether llama.cpp tokenizes the text to transformers' ids. Then the sentencepiece vocabularies of the
tests (Gemma's and Llama 2's shapes): llama.cpp's ids for each test text against transformers'.

    python -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python numpy   # compiles, minutes
    python benchmarks/gguf_families_llamacpp.py --llama-python /tmp/llamavenv/bin/python [--quant q8_0] [qwen3 ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TEXT = "the cat sat on the mat, the quick dog runs to the river 12345 and back again to the house"


def llamacpp_worker(gguf_path: str) -> None:
    """In the llama venv. stdin {"ids", "texts"}; stdout {"logits" for ids at every position, "tokens" per text}."""
    from llama_cpp import Llama

    job = json.load(sys.stdin)
    llm = Llama(model_path=gguf_path, n_ctx=256, n_threads=1, logits_all=True, verbose=False)
    result = {"tokens": [llm.tokenize(t.encode(), add_bos=False, special=True) for t in job["texts"]]}
    if job["ids"]:
        llm.eval(job["ids"])
        result["logits"] = [list(map(float, row)) for row in llm.scores[: len(job["ids"])]]
    json.dump(result, sys.stdout)


def _llama_cpp(args, path: Path, ids: list[int], texts: list[str]) -> dict | None:
    proc = subprocess.run([args.llama_python, __file__, "--worker", str(path)], capture_output=True, text=True,
                          input=json.dumps({"ids": ids, "texts": texts}))
    if proc.returncode:
        print(f"  llama.cpp failed on {path.name}: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(proc.stdout)


def families(args, tokenizer, write_gguf) -> None:
    import torch

    from finetune.export.gguf_tensors import FAMILIES
    from test_export_gguf_families import TINY_CONFIGS, tiny_family_model

    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    print(f"{'family':<12} {'arch':<9} {'max |logit diff|':>16} {'logit range':>11} {'same argmax':>11}  ids")
    for model_type in args.families or list(TINY_CONFIGS):
        model = tiny_family_model(model_type, tokenizer)
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            out = Path(tmp) / "m.gguf"
            # general.name not after the family: llama.cpp sets Phi-3 token attributes by name ("phi3"), looking up
            # sentencepiece tokens ("</s>") this byte-level vocabulary does not have
            write_gguf(model, tokenizer, out, args.quant, "tiny")
            got = _llama_cpp(args, out, ids, [TEXT])
            if got is None:
                continue
            want = model(input_ids=torch.tensor([ids])).logits[0]
            theirs = torch.tensor(got["logits"])[:, : want.shape[-1]]
            same = (theirs.argmax(-1) == want.argmax(-1)).float().mean().item()
            print(f"{model_type:<12} {FAMILIES[model_type]:<9} {(theirs - want).abs().max().item():>16.2e} "
                  f"{want.abs().max().item():>11.3f} {same:>11.0%}  {'same' if got['tokens'][0] == ids else 'DIFFER'}")


def sentencepiece(args, write_gguf) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from test_export_gguf_families import SPM_TEXTS, spm_tokenizer

    for style in ("gemma", "llama2"):
        tokenizer = spm_tokenizer(style)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1)
        with tempfile.TemporaryDirectory() as tmp:
            write_gguf(LlamaForCausalLM(config), tokenizer, Path(tmp) / "m.gguf", "f16", "tiny")
            got = _llama_cpp(args, Path(tmp) / "m.gguf", [], SPM_TEXTS)
        if got is not None:
            same = [t == tokenizer(text, add_special_tokens=False)["input_ids"]
                    for t, text in zip(got["tokens"], SPM_TEXTS)]
            print(f"sentencepiece ({style}): llama.cpp's ids equal transformers' for {sum(same)}/{len(same)} texts"
                  + "".join(f"\n  differs: {text!r}" for text, ok in zip(SPM_TEXTS, same) if not ok))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="model_types (default: every family the test builds)")
    parser.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    parser.add_argument("--quant", default="f32", help="the export's --quant (f32: exact; q8_0: the usual share)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        llamacpp_worker(args.worker)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tiny import build_tokenizer

    from finetune.export.gguf import write_gguf

    families(args, build_tokenizer(), write_gguf)
    sentencepiece(args, write_gguf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
