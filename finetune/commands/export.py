"""Export a trained run to one GGUF file (llama.cpp, Ollama, LM Studio) with an Ollama Modelfile beside it.

    finetune export recipe.yml --gguf                       # output_dir/gguf/<run>.f16.gguf
    finetune export outputs/run --gguf --quant q8_0 -o run.q8_0.gguf

A vision-language run also gets llama.cpp's mmproj file (its vision tower and projector): mmproj-<run>.<quant>.gguf.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from finetune.commands.args import add_overrides

# the same list as finetune.export.gguf_tensors.QUANT_TYPES, spelled here so `--help` never imports the library
QUANT_CHOICES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RECIPE_OR_OUTPUT_DIR",
                        help="a recipe (its output_dir holds the run), an adapter folder or a full model folder")
    parser.add_argument("--gguf", action="store_true", required=True,
                        help="write GGUF (the one format for now; required so the format is always explicit)")
    parser.add_argument("--quant", choices=QUANT_CHOICES, default="f16",
                        help="weight type: f16 (default, lossless for fp16/bf16-trained weights), bf16, f32, "
                             "q8_0 (half the size, near lossless), q5_*/q4_* (smaller, lossier)")
    parser.add_argument("-o", "--output", default=None,
                        help="the .gguf file to write (default: OUTPUT_DIR/gguf/<run>.<quant>.gguf); never overwritten")
    add_overrides(parser)


def run(args: argparse.Namespace) -> int:
    from finetune.export.gguf import export
    from finetune.export.gguf_mmproj import export_vision
    from finetune.model.trained import locate

    trained = locate(args.target, args.overrides)
    out = Path(args.output) if args.output else trained.folder / "gguf" / f"{trained.folder.name}.{args.quant}.gguf"
    # a vision-language run: its language model, and its tower and projector as llama.cpp's mmproj file beside it
    done = (export_vision if trained.vision else export)(trained, out, args.quant)
    mib = done.size_bytes / 2**20
    print(f"[finetune] wrote {done.gguf_path} ({mib:,.1f} MiB, {done.tensor_count} tensors, {args.quant}, "
          f"pre-tokenizer {done.pre_tokenizer}) and {done.modelfile_path}", file=sys.stderr)
    if done.mmproj_path is not None:  # a vision-language run: llama.cpp's --mmproj file beside the model
        print(f"[finetune] the vision tower and projector: {done.mmproj_path} (llama-mtmd-cli -m {done.gguf_path.name} "
              f"--mmproj {done.mmproj_path.name})", file=sys.stderr)
    print(done.gguf_path)
    return 0
