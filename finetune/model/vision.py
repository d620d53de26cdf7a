"""Vision-language base models: telling one from a text model, its processor, and its three parts.

A base model is a vision-language model when transformers maps its config's model_type to
AutoModelForImageTextToText and the config has a vision tower (LLaVA, Idefics3 / SmolVLM, Gemma 3, Qwen2-VL...).
Its three parts are found from the model's structure, not a table of names per family: the vision tower is what
transformers' get_encoder(modality="image") answers, the language model what get_decoder() answers (plus the
output layer), and the projector every other module beside them (LLaVA's and Gemma 3's multi_modal_projector,
Idefics3's connector), or, where a family keeps it inside the tower, the tower's `merger` (Qwen2-VL).

The recipe's freeze_* keys (finetune/recipe/vision.py) decide what trains: a full fine-tune switches off the
gradients of a frozen part; LoRA puts adapters only on the linear layers of the parts that are not frozen, so
`all-linear` means the language model and the projector unless the tower is unfrozen. Everything that loads a
vision-language model (training, and the verbs built on a trained run) goes through load_processor and
model_class here.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ModelError
from finetune.log import get_logger
from finetune.model.targets import is_image_text_config

PARTS = ("vision_tower", "multi_modal_projector", "language_model")
PROJECTOR_IN_TOWER = ("merger",)  # Qwen2-VL / Qwen2.5-VL: the patch merger is the tower's last module


def is_vision_model(model) -> bool:
    """Whether a loaded model (under a PEFT wrapper or not) is a vision-language model."""
    return is_image_text_config(getattr(model, "config", None))


def vision_config(recipe):
    """The config of the recipe's base model when it is a vision-language model, else None."""
    from transformers import AutoConfig

    from finetune.model.loader import resolve_model_path

    source = resolve_model_path(recipe.base_model, recipe.cache_dir)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=recipe.trust_remote_code)
    except (OSError, ValueError):
        return None  # not loadable as a config here: the model loader says why, with its own message
    return config if is_image_text_config(config) else None


def model_class(recipe):
    """The Auto class that loads the base model: image-text-to-text for a vision-language model, else causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if vision_config(recipe) is not None else AutoModelForCausalLM


def unquantized_modules(recipe) -> list[str] | None:
    """A quantized vision-language model keeps its vision tower, projector and output layer in the compute dtype
    (bitsandbytes' skip list): they are small beside the language model, and 4-bit image features cost quality.
    None for a text model (transformers' default: the output layer)."""
    config = vision_config(recipe) if recipe.adapter == "qlora" or recipe.load_in_4bit or recipe.load_in_8bit else None
    if config is None:
        return None
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):  # shapes only: the names of the parts, no weights
        parts = vision_parts(AutoModelForImageTextToText.from_config(config))
    return [*parts.vision_tower, *parts.multi_modal_projector, *([parts.output_layer] if parts.output_layer else [])]


def load_processor(recipe, tokenizer):
    """The processor of a vision-language base model, using `tokenizer` (load_tokenizer's: the recipe's tokens and
    pad token) and the model's own chat template; None for a text model."""
    if vision_config(recipe) is None:
        return None
    from transformers import AutoProcessor

    from finetune.model.loader import resolve_model_path

    source = resolve_model_path(recipe.base_model, recipe.cache_dir)
    try:
        processor = AutoProcessor.from_pretrained(source, trust_remote_code=recipe.trust_remote_code)
    except (OSError, ValueError, ImportError) as exc:
        raise ModelError(f"`{recipe.base_model}` is a vision-language model, but its processor cannot be loaded "
                         f"({exc.__class__.__name__}: {str(exc)[:300]}); its folder needs the processor's files "
                         "(preprocessor_config.json / processor_config.json) beside the model") from None
    if getattr(processor, "image_processor", None) is None or getattr(processor, "image_token", None) is None:
        raise ModelError(f"the processor of `{recipe.base_model}` ({type(processor).__name__}) has no image "
                         "processor or image token: finetune cannot encode images for it")
    if recipe.chat_template == "chatml":
        raise ModelError("`chat_template: chatml` cannot place images: a vision-language model renders its "
                         "conversations with its own template (`chat_template: tokenizer_default`), or with a "
                         "`chat_template: jinja` that renders image parts as the processor's image token")
    if recipe.chat_template == "tokenizer_default" and processor.chat_template:
        tokenizer.chat_template = processor.chat_template
    processor.tokenizer = tokenizer
    return processor


def tokenizer_and_processor(recipe):
    """(tokenizer, processor or None): what the data stage encodes the recipe's records with."""
    from finetune.model.loader import load_tokenizer

    tokenizer = load_tokenizer(recipe)
    return tokenizer, load_processor(recipe, tokenizer)


@dataclass
class Parts:
    """Module-name prefixes of each part (a parameter belongs to the part with the longest prefix of its name)."""

    vision_tower: list[str]
    multi_modal_projector: list[str]
    language_model: list[str]  # the decoder, then the output layer when there is one
    output_layer: str | None = None

    def part_of(self, name: str) -> str | None:
        best, length = None, -1
        for part in PARTS:
            for prefix in getattr(self, part):
                if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > length:
                    best, length = part, len(prefix)
        return best

    def frozen(self, recipe) -> set[str]:
        return {part for part in PARTS if getattr(recipe, f"freeze_{part}")}


def vision_parts(model) -> Parts:
    """The three parts of a vision-language model (the transformers model, not a PEFT wrapper), found from its
    structure."""
    names = {id(module): name for name, module in model.named_modules()}
    tower = model.get_encoder(modality="image")
    decoder = model.get_decoder()
    if tower is model or decoder is model or id(tower) not in names:
        raise ModelError(f"{type(model).__name__}: finetune cannot find its vision tower and language model")
    tower_name, decoder_name = names[id(tower)], names[id(decoder)]
    projector = [f"{tower_name}.{child}" for child, _ in tower.named_children() if child in PROJECTOR_IN_TOWER]
    inner = tower_name.rpartition(".")[0]  # the module holding the tower and the language model
    holder = model.get_submodule(inner) if inner else model
    projector += [f"{inner}.{child}".lstrip(".") for child, module in holder.named_children()
                  if module is not tower and module is not decoder and any(True for _ in module.parameters())]
    output = model.get_output_embeddings()
    output_name = names[id(output)] if output is not None else None
    return Parts([tower_name], projector, [decoder_name, *([output_name] if output_name else [])], output_name)


def report_parts(model, recipe=None) -> tuple[dict, object]:
    """For `finetune targets`: {part: (module prefixes, frozen)} under the recipe's freeze_* keys (their defaults
    without a recipe), and name -> part."""
    from finetune.recipe.vision import VisionKeys

    parts = vision_parts(model)
    frozen = parts.frozen(recipe if recipe is not None else VisionKeys())
    return {part: (getattr(parts, part), part in frozen) for part in PARTS}, parts.part_of


def freeze_parts(model, recipe) -> dict[str, int]:
    """Full fine-tune: no gradients for the frozen parts. Returns the trainable parameters of each part."""
    parts = vision_parts(model)
    frozen = parts.frozen(recipe)
    if frozen == set(PARTS):
        raise ModelError("freeze_vision_tower, freeze_multi_modal_projector and freeze_language_model are all true: "
                         "nothing would train; set one of them to false")
    trainable = dict.fromkeys(PARTS, 0)
    for name, param in model.named_parameters():
        part = parts.part_of(name)
        if part in frozen:
            param.requires_grad_(False)
        elif part is not None and param.requires_grad:
            trainable[part] += param.numel()
    return trainable


def lora_target_names(model, recipe) -> list[str]:
    """The full names of the layers LoRA adapts in a vision-language model: the recipe's targets (`all-linear`: every
    linear layer but the output layer) inside the parts that are not frozen."""
    from finetune.model.targets import check_targets, matched_groups, module_groups

    groups = module_groups(model)
    check_targets(groups, recipe.lora_target_modules)
    parts = vision_parts(model)
    frozen = parts.frozen(recipe)
    names = [name for group in matched_groups(groups, recipe.lora_target_modules) for name in group.names
             if parts.part_of(name) not in frozen]
    if not names:
        raise ModelError(f"`lora_target_modules` {recipe.lora_target_modules} match no layer outside the frozen parts "
                         f"({', '.join(sorted(frozen))}); unfreeze a part (freeze_*: false) or target its layers")
    return names


def describe_parts(model, recipe, adapted: list[str] | None = None) -> str:
    """One line: each part, frozen or trained, and how (for the log)."""
    parts = vision_parts(model)
    frozen = parts.frozen(recipe)
    adapted_parts = {parts.part_of(name) for name in adapted or ()}
    how = "LoRA" if adapted is not None else "full"
    return "; ".join(f"{part.replace('_', ' ')} ({', '.join(getattr(parts, part)) or 'none'}): "
                     f"{'frozen' if part in frozen else how if adapted is None or part in adapted_parts else 'frozen'}"
                     for part in PARTS)


def log_parts(model, recipe, adapted: list[str] | None = None) -> None:
    get_logger(__name__).info(f"vision-language model: {describe_parts(model, recipe, adapted)}")


def is_vision_source(source: str | None, trust_remote_code: bool = False) -> bool:
    """Whether a model folder or hub id holds a vision-language model (False when its config cannot be read here:
    the loader that follows says why)."""
    if source is None:
        return False
    from transformers import AutoConfig

    try:
        return is_image_text_config(AutoConfig.from_pretrained(str(source), trust_remote_code=trust_remote_code))
    except (OSError, ValueError):
        return False
