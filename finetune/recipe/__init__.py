"""The recipe: one flat `Recipe` (the only place a default lives), its loading and its checks.

    schema.py    Recipe, composed of the key groups below (the YAML keys are flat; the groups are for readers)
    model.py     the base model, its tokenizer, attention, compile, checkpointing
    vision.py    a vision-language model's three parts (which train) and an image's pixel budget
    adapter.py   full / LoRA / QLoRA and the quantized base
    methods.py   `method:` and each method's settings (which method reads which key, its default there)
    data.py      `datasets:` (one DatasetSpec per source) and how records become tokens
    training.py  batch, schedule, optimizer, precision, scale-out (DeepSpeed)
    distributed.py  `fsdp:` (FSDPSpec): FSDP2, the other scale-out engine, and what it refuses
    output.py    output_dir, logging, checkpoints, resume, the guard, trackers
    evaluation.py  `eval:` (EvalSpec)
    tags.py      what each key affects (the cache and checkpoint fingerprints read these), the Strict base
    load.py      load_recipe(): YAML + --set -> Recipe, every problem gathered into one RecipeError
    checks.py    cross-key checks that read the filesystem (output_dir, resume, DeepSpeed JSON, lm-eval)
    axolotl/     axolotl's keys and values with their finetune equivalents: load.py's hints, port/'s tables

`from finetune.recipe import Recipe, load_recipe` is the public face. Pure Python: nothing heavy is imported.
"""

from __future__ import annotations

__all__ = ["Recipe", "dump_recipe", "load_recipe", "recipe_from_dict"]


def __getattr__(name: str):
    """The public names, imported on first use: `finetune ingest` reads only data.py's DatasetSpec (its
    defaults), and importing load.py with it (every key group, the axolotl port, YAML) was ~0.1 s of
    every ingest run's start."""
    if name == "Recipe":
        from finetune.recipe.schema import Recipe

        return Recipe
    if name in ("dump_recipe", "load_recipe", "recipe_from_dict"):
        from finetune.recipe import load

        return getattr(load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
