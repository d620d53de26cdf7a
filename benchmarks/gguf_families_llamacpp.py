"""Does llama.cpp itself run each exported family as transformers runs the model? (outside CI: llama-cpp-python)

The tests read every family's GGUF back with transformers or gguf-py; this asks llama.cpp. For each family of
tests/test_export_gguf_families.py: the tiny model built there, exported (f32 unless --quant), then the logits of one text at
every position from transformers and from llama.cpp (llama-cpp-python, run in its own venv), side by side,
and whether llama.cpp tokenizes the text to transformers' ids.

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


def llamacpp_worker(gguf_path: str, ids: list[int]) -> dict:
    """In the llama venv: llama.cpp's tokenization of TEXT and its logits for `ids` at every position."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf_path, n_ctx=256, n_threads=1, logits_all=True, verbose=False)
    llm.eval(ids)
    return {"ids": llm.tokenize(TEXT.encode(), add_bos=True, special=True),
            "logits": [list(map(float, row)) for row in llm.scores[: len(ids)]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="model_types (default: every family the test builds)")
    parser.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    parser.add_argument("--quant", default="f32", help="the export's --quant (f32: exact; q8_0: the usual share)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        json.dump(llamacpp_worker(args.worker[0], json.loads(args.worker[1])), sys.stdout)
        return 0

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_export_gguf_families import TINY_CONFIGS, tiny_family_model
    from tiny import build_tokenizer

    from finetune.export.gguf import write_gguf
    from finetune.export.gguf_tensors import FAMILIES

    tokenizer = build_tokenizer()
    ids = tokenizer(TEXT)["input_ids"]
    print(f"{'family':<12} {'arch':<9} {'max |logit diff|':>16} {'logit range':>11} {'same argmax':>11}  ids")
    for model_type in args.families or list(TINY_CONFIGS):
        model = tiny_family_model(model_type, tokenizer)
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            out = Path(tmp) / "m.gguf"
            # general.name not after the family: llama.cpp sets Phi-3 token attributes by name ("phi3"), looking up
            # sentencepiece tokens ("</s>") this byte-level vocabulary does not have
            write_gguf(model, tokenizer, out, args.quant, "tiny")
            proc = subprocess.run([args.llama_python, __file__, "--worker", str(out), json.dumps(ids)],
                                  capture_output=True, text=True)
            if proc.returncode:
                print(f"{model_type:<12} llama.cpp failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            got = json.loads(proc.stdout)
            want = model(input_ids=torch.tensor([ids])).logits[0]
            theirs = torch.tensor(got["logits"])[:, : want.shape[-1]]
            same = (theirs.argmax(-1) == want.argmax(-1)).float().mean().item()
            print(f"{model_type:<12} {FAMILIES[model_type]:<9} {(theirs - want).abs().max().item():>16.2e} "
                  f"{want.abs().max().item():>11.3f} {same:>11.0%}  {'same' if got['ids'] == ids else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
