"""A trained run: find its adapter or model (a recipe's output_dir or a folder) and load it for use.

Serving (inference.py), evaluation and export (finetune/export/: merge, GGUF) all start here. A vision-language run
(its base, or its full model, is one transformers loads with AutoModelForImageTextToText) loads with that class, and
its processor (tokenizer, image processor, chat template) is the one the run saved beside the adapter or model.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import ModelError

DTYPES = ("fp32", "bf16", "fp16")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # what AutoProcessor reads first


@dataclass
class Trained:
    """What a training run left: a folder with an adapter or a full model, and where its base lives."""

    folder: Path
    is_adapter: bool
    base_source: str | None  # for an adapter: the base model folder or hub id
    recipe: object | None = None
    checkpoint_of: Path | None = None  # a checkpoint evaluated in place of a run that did not finish: its output_dir
    checkpoint_step: int | None = None

    @functools.cached_property
    def vision(self) -> bool:
        """Whether the run is a vision-language model's: read from its base's config (an adapter) or its own."""
        from finetune.model.vision import is_vision_source

        return is_vision_source(self.base_source if self.is_adapter else str(self.folder))

    def model_class(self):
        """The Auto class that loads the run's model (and its base): image-text-to-text or causal LM."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        return AutoModelForImageTextToText if self.vision else AutoModelForCausalLM


def is_recipe_path(target: str) -> bool:
    return Path(target).suffix in (".yml", ".yaml") and Path(target).is_file()


def locate(target: str, overrides: list[str] = (), newest_checkpoint: bool = False) -> Trained:
    """A recipe (its output_dir), an adapter folder or a model folder -> what is there. ModelError if nothing.
    `newest_checkpoint`: a recipe whose run did not finish (no final model) gives its newest complete checkpoint."""
    recipe = None
    if is_recipe_path(target):
        from finetune.recipe import load_recipe

        recipe = load_recipe(target, list(overrides))
        folder, where = Path(recipe.output_dir), f"the recipe's output_dir `{recipe.output_dir}`"
    else:
        folder, where = Path(target), f"`{target}`"
    if (folder / "adapter_config.json").is_file():
        refuse_unconverted(folder)
        return Trained(folder, True, base_model_of(folder, recipe), recipe)
    if (folder / "config.json").is_file():
        return Trained(folder, False, None, recipe)
    newest = newest_checkpoint_of(folder)
    if newest is not None and newest_checkpoint and recipe is not None:
        step, checkpoint = newest
        found = locate(str(checkpoint))  # refuses a PiSSA / OLoRA checkpoint (refuse_unconverted)
        return Trained(checkpoint, found.is_adapter, base_model_of(checkpoint, recipe) if found.is_adapter else None,
                       recipe, checkpoint_of=folder, checkpoint_step=step)
    if newest is not None:
        raise ModelError(unfinished_message(folder, newest))
    raise ModelError(
        f"no trained adapter or model in {where}: looked for {folder / 'adapter_config.json'} (a LoRA/QLoRA "
        f"adapter) and {folder / 'config.json'} (a full model), and no checkpoint. Train first (`finetune train "
        "RECIPE`), or pass the folder the run wrote."
    )


def refuse_unconverted(folder: Path) -> None:
    """A PiSSA / OLoRA adapter as it trained (a checkpoint: only the final save is converted to plain LoRA for the
    original base, finetune/model/lora_variants.py) needs its residual base: loading it on the original base makes
    peft decompose that base again, so the adapter switched off is not the model training started from and the
    adapter on it is not what trained. One message instead of quietly wrong numbers."""
    try:
        init = json.loads((folder / "adapter_config.json").read_text()).get("init_lora_weights")
    except (OSError, ValueError):
        return  # unreadable: peft reports it when loading
    if isinstance(init, str) and (init.startswith("pissa") or init == "olora"):
        raise ModelError(
            f"{folder} is a `peft_init_lora_weights: {init}` adapter as it trained (a checkpoint): it applies to the "
            "base with its starting decomposition taken out, not to the original base, so loading, evaluating or "
            "merging it here would give wrong numbers. Only the run's final adapter is converted for the original "
            "base: finish the run (`finetune train RECIPE` resumes from its checkpoint), then use its output_dir")


def newest_checkpoint_of(output_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint or export a run left in `output_dir`, or None."""
    from finetune.run_folder import Layout, complete_checkpoints

    found = complete_checkpoints(Layout(Path(output_dir)))
    return max(found, key=lambda pair: pair[0]) if found else None


def unfinished_message(output_dir: Path, newest: tuple[int, Path]) -> str:
    """What to do with a run that did not finish: no final model, no run.json, but checkpoints."""
    step, checkpoint = newest
    return (f"the run in `{output_dir}` did not finish: it wrote no final model and no run.json (which would say "
            f"which recipe trained it), only checkpoints, the newest {checkpoint} (step {step}). Evaluate that "
            "checkpoint through the recipe that trained it: `finetune eval RECIPE.yml` (a recipe whose run did not "
            "finish evaluates its newest checkpoint), or finish the run first: `finetune train RECIPE.yml` resumes "
            "from it")


def base_model_of(adapter_dir: Path, recipe=None) -> str:
    """The base an adapter was trained on: the recipe's, else the one run.json / adapter_config.json record."""
    from finetune.model.loader import resolve_model_path

    if recipe is not None:
        return resolve_model_path(recipe.base_model, recipe.cache_dir)
    run = adapter_dir / "run.json"
    if run.is_file():
        recorded = json.loads(run.read_text()).get("base_model_path")
        if recorded:
            return recorded
    base = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelError(f"{adapter_dir / 'adapter_config.json'} does not name its base model; pass the recipe instead")
    return base


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def saved_tokenizer(folder):
    """The run's tokenizer, saved beside its adapter or full model."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def saved_processor(trained: Trained):
    """A vision-language run's processor as the run saved it (its tokenizer and chat template included); None for a
    text run. A folder without one (an adapter copied alone) gets its base's processor with the run's tokenizer."""
    if not trained.vision:
        return None
    from transformers import AutoProcessor

    for source in (trained.folder, trained.base_source):
        if source is not None and any((Path(source) / name).is_file() for name in PROCESSOR_FILES):
            processor = AutoProcessor.from_pretrained(str(source))
            if Path(source) != trained.folder:
                processor.tokenizer = saved_tokenizer(trained.folder)
            return processor
    raise ModelError(f"`{trained.folder}` holds a vision-language model's run but no processor "
                     f"({' / '.join(PROCESSOR_FILES)}) beside it or its base: copy the base model's processor files "
                     "into the run folder")


def load_full_model(trained: Trained, dtype: str = "fp32"):
    """A fully fine-tuned run's model, with its own Auto class (a vision-language model whole)."""
    try:
        return trained.model_class().from_pretrained(str(trained.folder), dtype=torch_dtype(dtype))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the model in `{trained.folder}` ({exc.__class__.__name__}: "
                         f"{str(exc)[:200]})") from None


def load_adapter_model(trained: Trained, dtype: str = "fp32", quantization_config=None, tokenizer=None,
                       method: str = "sft"):
    """(PeftModel, tokenizer): the base (unquantized unless asked), grown to the run's vocabulary, plus the adapter.
    `tokenizer`: the run's, when the caller has loaded it already; `method`: the run's (a reward model's base is its
    sequence-classification class, the adapter brings the trained score head)."""
    from peft import PeftModel

    from finetune.model import reward_loader
    from finetune.model.loader import _not_found

    tokenizer = tokenizer or saved_tokenizer(trained.folder)
    try:
        loader = reward_loader() if method == "reward" else trained.model_class().from_pretrained
        base = loader(trained.base_source, dtype=torch_dtype(dtype), quantization_config=quantization_config)
    except (OSError, ValueError) as exc:
        raise _not_found(trained.base_source, exc) from None
    if len(tokenizer) > base.get_input_embeddings().num_embeddings:
        # the run added tokens: the adapter carries the trained embedding / lm_head rows for them; the base's new
        # rows start as training started them (transformers' mean_resizing: the old rows' mean, with 1e-5 of their
        # covariance), so "base" with the adapter switched off is the model the run started from
        base.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    from finetune.compat import peft_wrapping

    with peft_wrapping(trained.folder):
        return PeftModel.from_pretrained(base, str(trained.folder)), tokenizer
