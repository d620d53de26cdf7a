"""Start-up: a `finetune train` process does not import optional libraries its recipe does not use.

`from transformers import Trainer` imports peft, which imports bitsandbytes, whose import calls torch.compile
and so loads all of inductor; accelerate's Trainer set-up imports DeepSpeed whenever it is installed. Measured
in one run on CPU (benchmarks/bench_first_step.py, docs/performance.md), these are seconds of every start-up
of a plain LoRA or full fine-tune that uses neither.

The command line (finetune/commands/train.py) knows the recipe before anything heavy is imported, so it marks
the unused ones absent the way Python's import system documents: a `None` entry in `sys.modules` makes
`import name` raise ImportError and `importlib.util.find_spec(name)` return None, which is exactly what peft,
transformers and accelerate check ("not installed"). Only that one process, which runs this one recipe, is
affected, for as long as its command runs (restore_libraries); the library (`run_training`) never does this.
`FINETUNE_IMPORT_ALL=1` turns it off.
"""

from __future__ import annotations

import os
import sys

# accelerate's own switch for DeepSpeed (`accelerate launch --use_deepspeed`, or its config file)
ACCELERATE_DEEPSPEED = "ACCELERATE_USE_DEEPSPEED"


def unused_libraries(recipe) -> list[str]:
    """The optional libraries this recipe's training never calls."""
    from finetune.model import quantized_base
    from finetune.model.bnb import BNB_OPTIMIZERS

    uses_bnb = quantized_base(recipe) or recipe.optimizer in BNB_OPTIMIZERS or _prequantized(recipe.base_model)
    uses_deepspeed = recipe.deepspeed is not None or os.environ.get(ACCELERATE_DEEPSPEED, "").lower() in ("1", "true")
    return [name for name, used in (("bitsandbytes", uses_bnb), ("deepspeed", uses_deepspeed)) if not used]


def _prequantized(base_model: str) -> bool:
    """Whether the base may load through bitsandbytes on its own: a model saved already quantized (its config
    names a quantization, e.g. the hub's `...-bnb-4bit` repositories). Only what can be ruled out here is: a
    .gguf file (dequantized by transformers, never bitsandbytes) or a local folder whose config names no
    quantization. A hub id, whose config is not read before the loader runs, keeps bitsandbytes."""
    import json
    from pathlib import Path

    if base_model.endswith(".gguf"):
        return False
    config = Path(base_model) / "config.json"
    if not config.is_file():
        return True  # a hub id (or a path the loader will report): keep every library
    try:
        return "quantization_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return True  # unreadable: keep every library, let the loader report the problem


def skip_unused_libraries(recipe) -> list[str]:
    """Mark the recipe's unused optional libraries absent in this process; returns their names."""
    if os.environ.get("FINETUNE_IMPORT_ALL", "").lower() in ("1", "true"):
        return []
    skipped = []
    for name in unused_libraries(recipe):
        if name in sys.modules:  # already imported (an embedding application): leave it
            continue
        sys.modules[name] = None  # documented import-system behaviour: "not installed" for this process
        skipped.append(name)
    return skipped


def restore_libraries(names: list[str]) -> None:
    """Undo skip_unused_libraries' marks once its command is done: a notebook that trains a LoRA recipe, then a
    QLoRA one, in the same Python must find bitsandbytes the second time."""
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
