"""Merge a LoRA adapter into its base: one plain Hugging Face model folder.

A merged model is a plain Hugging Face model: W' = W + (alpha / r) * B @ A for every adapted layer, with
the modules trained in full (modules_to_save) copied in. It is written in full precision from an
*unquantized* base, also for QLoRA: merging into 4-bit weights would round the update away.
The LoRA variants merge through peft too: rsLoRA's scale is alpha / sqrt(r); DoRA's weight is
m * (W + s*B@A) / |W + s*B@A| per output row; a PiSSA / OLoRA run saved its adapter converted for the original
base (finetune/model/lora_variants.py), so it merges like any LoRA (tests/test_lora_variants.py checks each).
A vision-language run merges whole: the tower, the projector and the language model (adapted or not), with the
run's processor (tokenizer, image processor, chat template) beside them, so AutoModelForImageTextToText and
AutoProcessor load the folder as they load the base.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune.atomic import honour_umask, temp_dir
from finetune.errors import ModelError
from finetune.model.trained import Trained, load_adapter_model, saved_processor


def _keep_prompt_format(run_folder: Path, merged_folder: Path) -> None:
    """The merged model has no run.json: record the prompt format its run trained with beside it."""
    from finetune.model.prompt_format import FORMAT_FILE, served_format

    name, why = served_format(run_folder)
    (merged_folder / FORMAT_FILE).write_text(json.dumps({"format": name, "why": why}) + "\n")


def merge_adapter(trained: Trained, out_dir: Path, dtype: str = "fp32") -> Path:
    """Write base + adapter as one HF model folder (weights, config, tokenizer), atomically."""
    if not trained.is_adapter:
        raise ModelError(f"`{trained.folder}` holds a fully fine-tuned model, not an adapter: nothing to merge, "
                         "it can be used as it is")
    model, tokenizer = load_adapter_model(trained, dtype)
    merged = model.merge_and_unload()
    processor = saved_processor(trained)  # a vision-language run's: it saves the tokenizer with the image side
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(out_dir)  # honours the umask, like any other tool's output
    try:
        merged.save_pretrained(str(tmp))
        (processor or tokenizer).save_pretrained(str(tmp))
        _keep_prompt_format(trained.folder, tmp)
        honour_umask(tmp)  # safetensors writes 0600 files (finetune/atomic.py)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
