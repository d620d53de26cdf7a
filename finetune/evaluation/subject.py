"""What `finetune eval` evaluates: a trained run (its recipe, folder and prompt format) and its models.

The base and the tuned model are used one at a time through `Models.side(name)`. The base is the model the run
started from: a preference run's reference (finetune/train/preference/reference.py), for every method and every way
of starting, and the report names it (`Subject.base_label`):
    an adapter trained fresh          the same module with its adapter disabled (peft's `disable_adapter()`): one
                                      copy of the weights serves both, the adapter is evaluated without merging
    an adapter that continued one     (base_model: an SFT run's adapter folder) the same module with the adapter it
                                      continued loaded beside the trained one and switched to (peft's set_adapter)
    a full fine-tune                  loaded from where the run started (run.json's base_model_path: a model or a
                                      merged folder); from an adapter folder, that adapter merged into its base
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import FinetuneError, ModelError
from finetune.log import get_logger

log = get_logger(__name__)

GGUF_DIR = "gguf"  # where `finetune export --gguf` writes by default (finetune/commands/export.py)
START = "start"  # the peft adapter name of the adapter a run continued, loaded beside the trained one ("default")


@dataclass
class Subject:
    recipe: object  # the Recipe the run trained with
    folder: Path  # the run's output folder: the adapter or the model, run.json
    is_adapter: bool
    base_source: str  # the base model folder (or hub id)
    prompt_format: str  # chat | alpaca | raw: what the run trained with (finetune/model/prompt_format.py)
    format_reason: str
    run: dict  # run.json ({} when absent)
    start_adapter: Path | None = None  # the adapter folder the run continued (its base_model), if it did

    @property
    def base_label(self) -> str:
        """The model the run started from, in words: what eval's "base" is."""
        if self.start_adapter is not None:
            how = "" if self.is_adapter else ", merged"
            return f"the adapter {self.start_adapter} on {self.base_source}{how} (the model the run started from)"
        return f"{self.base_source} (the model the run started from)"

    checkpoint_of: Path | None = None  # the folder is a checkpoint of this output_dir (its run did not finish, or
    checkpoint_step: int | None = None  # it was passed); the report goes to that output_dir, not the checkpoint

    @functools.cached_property
    def trained(self):
        """The run as the model stage finds it (finetune/model/trained.py): its Auto class, its processor."""
        from finetune.model.trained import Trained

        return Trained(self.folder, self.is_adapter, self.base_source, self.recipe)

    @property
    def formats(self) -> set[str]:
        """The record shapes the run trained on."""
        return subject_formats(self.run, self.recipe)

    @property
    def report_home(self) -> Path:
        """Where the report goes by default: the run's output folder (a checkpoint may be rotated away)."""
        return self.checkpoint_of or self.folder


def _run_json(folder: Path) -> dict:
    try:
        data = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def locate_subject(target: str, overrides: list[str] = (), recipe=None) -> Subject:
    """A recipe (its output_dir) or a run's output folder -> the Subject. ModelError when no trained model is
    there; FinetuneError when the folder does not say which recipe trained it."""
    from finetune.model.loader import resolve_model_path
    from finetune.model.prompt_format import FORMAT_FILE, format_for, served_format
    from finetune.model.trained import is_recipe_path, locate, newest_checkpoint_of, unfinished_message

    if overrides and not is_recipe_path(target):
        raise FinetuneError(f"--set overrides a recipe's keys, but `{target}` is not a recipe file; pass the recipe "
                            "(`finetune eval RECIPE.yml --set ...`) or drop --set")
    trained = locate(target, overrides, newest_checkpoint=True)  # ModelError: no adapter, model or checkpoint
    if trained.checkpoint_of is not None:
        log.warning(f"the run in {trained.checkpoint_of} did not finish (no final model): evaluating its newest "
                    f"checkpoint, {trained.folder} (step {trained.checkpoint_step})")
    run = _run_json(trained.folder)
    owner = checkpoint_owner(trained.folder)
    if not run and owner is not None:  # a checkpoint passed as the target: its run's record, if the run finished
        run = _run_json(owner)
        if not run and recipe is None and trained.recipe is None:
            raise FinetuneError(unfinished_message(owner, newest_checkpoint_of(owner)))
    recipe = recipe or trained.recipe
    if recipe is None:
        if not run.get("recipe"):
            raise FinetuneError(
                f"`{trained.folder}` holds a model but no run.json says which recipe trained it (its data, its "
                "eval split, its format); pass the recipe instead: `finetune eval RECIPE.yml`"
            )
        recipe = recorded_recipe(run["recipe"])
    if trained.is_adapter:
        base = trained.base_source
    else:
        base = run.get("base_model_path") or resolve_model_path(recipe.base_model, recipe.cache_dir)
    name, why = served_format(trained.folder)
    if not (trained.folder / "run.json").is_file() and not (trained.folder / FORMAT_FILE).is_file():
        # a checkpoint: no record of its own, so the record shapes its run (or recipe) trained on say it
        name, why = format_for(recipe.method, subject_formats(run, recipe))
    return Subject(recipe, trained.folder, trained.is_adapter, str(base), name, why, run, started_from(recipe),
                   trained.checkpoint_of, trained.checkpoint_step)


def checkpoint_owner(folder: Path) -> Path | None:
    """The output_dir whose complete checkpoint (or export) `folder` is, or None."""
    from finetune.run_folder import read_marker

    folder = Path(folder)
    if folder.parent.name in ("checkpoints", "exports") and read_marker(folder) is not None:
        return folder.parent.parent
    return None


def subject_formats(run: dict, recipe) -> set[str]:
    return set((run.get("data") or {}).get("formats") or ()) or {spec.type for spec in recipe.datasets}


def started_from(recipe) -> Path | None:
    """The adapter folder the run continued (its base_model), or None when it started from a model. A base_model
    path that is gone is refused: the model the run started from cannot be rebuilt, and comparing with another
    (the adapter's own base) would count the earlier stage as this run's gain."""
    from finetune.model.loader import adapter_folder

    start = adapter_folder(recipe.base_model)
    looks_local = recipe.base_model.startswith((".", "/", "~"))
    if start is None and looks_local and not Path(recipe.base_model).expanduser().exists():
        raise ModelError(f"the run started from `{recipe.base_model}`, which is gone; evaluation compares the trained "
                         "model with the model its run started from. Restore that folder, or evaluate with a recipe "
                         "whose base_model names it (`finetune eval RECIPE.yml --set base_model=PATH`)")
    return start


def recorded_recipe(data: dict):
    """The Recipe run.json records (a full dump, validated when it trained; its paths absolute). A dataset entry's
    raw-source options are dumped with their defaults, which a records entry refuses as set: keep what differs."""
    from finetune.recipe import Recipe
    from finetune.recipe.data import DatasetSpec

    defaults = {name: field.default for name, field in DatasetSpec.model_fields.items() if not field.is_required()}
    datasets = [{k: v for k, v in spec.items() if k in ("path", "type") or defaults.get(k, object()) != v}
                for spec in data.get("datasets", [])]
    return Recipe.model_validate({**data, "datasets": datasets})


def find_gguf(subject: Subject, given: str | None) -> Path | None:
    """The GGUF to evaluate: the one given, else the newest `finetune export` wrote into the output folder. None for
    a vision-language run: transformers reads a GGUF's language model only, never llama.cpp's mmproj file."""
    if subject.trained.vision:
        if given:
            raise FinetuneError(f"--gguf: `{given}` would be evaluated without its images: transformers loads only "
                                "the language model of a GGUF, not llama.cpp's mmproj file. Evaluate the merged "
                                "model (`finetune merge`, then `finetune eval` on the run) or the GGUF in llama.cpp")
        if any((subject.folder / GGUF_DIR).glob("*.gguf")):
            log.info(f"{subject.folder / GGUF_DIR}: a vision-language run's GGUF is not evaluated here (transformers "
                     "reads its language model only, without llama.cpp's mmproj file)")
        return None
    if given:
        if not Path(given).is_file():
            raise FinetuneError(f"--gguf: no file at `{given}`; export one with `finetune export RUN --gguf`")
        return Path(given)
    found = sorted((subject.folder / GGUF_DIR).glob("*.gguf"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_tokenizer(subject: Subject) -> tuple[object, object]:
    """(tokenizer, processor or None) the run saved: a vision-language run's processor holds its tokenizer."""
    from finetune.model.trained import saved_processor, saved_tokenizer

    processor = saved_processor(subject.trained)
    return (processor.tokenizer if processor is not None else saved_tokenizer(subject.folder)), processor


class Models:
    """The run's tokenizer (and a vision-language run's processor) and its models, base and tuned (and a GGUF
    export when given), one at a time."""

    def __init__(self, subject: Subject, gguf: Path | None = None, tokenizer=None, processor=None):
        from finetune.model.trained import load_adapter_model

        self.subject, self.gguf = subject, gguf
        if tokenizer is None:
            tokenizer, processor = run_tokenizer(subject)
        self.tokenizer, self.processor = tokenizer, processor
        self.model_class = subject.trained.model_class()
        self._base = None
        if subject.is_adapter:
            # fp32 everywhere: the numbers compare models, not precisions (a 4-bit QLoRA base is dequantized)
            self.tuned, _ = load_adapter_model(subject.trained, "fp32", None, self.tokenizer)
            if subject.start_adapter is not None:  # the base is the base + the adapter the run continued
                self.tuned.load_adapter(str(subject.start_adapter), adapter_name=START)
        else:
            self.tuned = _load(subject.folder, self.model_class)
        self.tuned.to(device()).eval()

    def collator(self):
        """What makes the held-out batches: training's collator (a vision-language run's adds the pixels)."""
        from finetune.data.collate import Collator

        text = Collator(self.pad_id)
        if self.processor is None:
            return text
        from finetune.data.vision.collate import VisionCollator
        from finetune.model.vision_prompt import pixel_budget

        return VisionCollator(text, self.processor, *pixel_budget(self.subject.recipe))

    def pixels(self):
        """A vision-language run's pixel inputs for rows of image tokens (training's, with its pixel budget); None
        for a text run."""
        if self.processor is None:
            return None
        from finetune.data.vision.collate import Pixels
        from finetune.model.vision_prompt import pixel_budget

        return Pixels(self.processor, *pixel_budget(self.subject.recipe))

    def sides(self) -> tuple[str, ...]:
        return ("base", "tuned", "gguf") if self.gguf else ("base", "tuned")

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @contextlib.contextmanager
    def side(self, name: str):
        """The model called `name`: "base", "tuned" or "gguf" (loaded for the block, then let go)."""
        if name == "tuned":
            yield self.tuned
        elif name == "gguf":
            model = load_gguf(self.gguf, self.tokenizer, self.tuned.config)
            try:
                yield model
            finally:
                del model
        elif self.subject.is_adapter and self.subject.start_adapter is not None:
            self.tuned.set_adapter(START, inference_mode=True)
            try:
                yield self.tuned
            finally:
                self.tuned.set_adapter("default", inference_mode=True)
        elif self.subject.is_adapter:
            with self.tuned.disable_adapter():
                yield self.tuned
        else:
            if self._base is None:
                self._base = self._load_start().to(device()).eval()
            yield self._base

    def _load_start(self):
        """A full fine-tune's starting model: the model folder, or the adapter it started from merged into its base
        (as finetune/model/__init__.py's continue_adapter built it)."""
        from finetune.model.trained import Trained, load_adapter_model

        start = self.subject.start_adapter
        if start is None:
            return _load(self.subject.base_source, self.model_class)
        trained = Trained(start, True, self.subject.base_source, None)
        model, _ = load_adapter_model(trained, "fp32", None, self.tokenizer)
        return model.merge_and_unload()


def _load(source, model_class=None, **kwargs):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs.setdefault("dtype", torch.float32)  # fp32, like an adapter's base here: models compared, not precisions
    try:
        return (model_class or AutoModelForCausalLM).from_pretrained(str(source), **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the model at `{source}`: {exc}") from None


def load_gguf(path: Path, tokenizer, config=None):
    """A GGUF export, dequantized by transformers (gguf_file=), grown to the run's vocabulary if needed. `config`: the
    run's model config (a GGUF does not hold every hyperparameter transformers needs; it guesses the rest). A GGUF
    transformers reads back without some of the run's weights (its GGUF loader does not map every family llama.cpp
    runs: Mixtral's experts) or not at all is a ModelError, never a drift measured against freshly drawn weights."""
    try:
        model, info = _load(path.parent, gguf_file=path.name, config=config, output_loading_info=True)
        missing = sorted(info.get("missing_keys") or [])
        why = f"it reads it without {len(missing)} of the model's weights, e.g. `{missing[0]}`" if missing else ""
    except (TypeError, KeyError, RuntimeError, NotImplementedError) as exc:  # a family it has no reader for
        why = f"its GGUF loader fails: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if why:
        raise ModelError(f"transformers cannot read `{path}` back whole (a `{getattr(config, 'model_type', '?')}`: "
                         f"{why}), so there is no GGUF drift to measure here; llama.cpp reads the file itself "
                         f"(docs/export.md). Evaluate without it: move it out of `{path.parent}`, or pass --gguf "
                         "another file")
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        raise ModelError(f"`{path}` has {model.get_input_embeddings().num_embeddings} token embeddings, the run's "
                         f"tokenizer {len(tokenizer)}: it is not an export of this run")
    return model.to(device()).eval()
