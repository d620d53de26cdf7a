"""axolotl's multimodal (vision-language) keys -> finetune's (issue 39 item 8). Pure data + small functions.

Checked against axolotl's schema (src/axolotl/utils/schemas/model.py, multimodal.py, config.py: processor_type,
processor_kwargs, image_size, image_resize_algorithm, role_boundaries, freeze_mm_modules), its processing strategy
(processing_strategies.py: how image_size resizes) and its multimodal examples (examples/{llava, qwen2-vl, gemma3,
smolvlm2, llama-3-vision, qwen3.5}/) at the commit finetune/recipe/axolotl/keys.py names. What `finetune validate` says
of each key (HINTS) is finetune/recipe/axolotl/vision.py: the recipe reads it too.

What axolotl trains in a vision-language model, and finetune's keys for it (finetune/recipe/vision.py):
- a full fine-tune trains every weight, the vision tower's too: `freeze_vision_tower: false`;
- `lora_target_linear: true` adapts every linear layer, the tower's too (its names are matched everywhere):
  `freeze_vision_tower: false`;
- the examples' `lora_target_modules` regex over the language model's layers adapts those only, not the projector:
  `all-linear` with `freeze_multi_modal_projector: true`;
- `freeze_mm_modules: true` freezes the tower and the projector.
`finetune port` (convert.py) calls port_key for each of TOP_KEYS where it stands, then finish() once.
"""

from __future__ import annotations

import re
from typing import Any

from finetune.recipe.axolotl.vision import BLOCKING, HINTS

TOP_KEYS = ("processor_type", "processor_kwargs", "skip_prepare_dataset", "remove_unused_columns", "image_size",
            "image_resize_algorithm", "freeze_mm_modules", "role_boundaries")

_PIXEL_KWARGS = {"min_pixels": "image_min_pixels", "max_pixels": "image_max_pixels"}
# axolotl's examples: 'model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj'
_LAYER_REGEX = re.compile(
    r"^(?:model\.)?(?:(?:language_model|text_model)\.)?(?:model\.)?layers\.\[\\d\]\+\."
    r"(?:\(_checkpoint_wrapped_module\.\)\?)?(?P<blocks>\([a-z_|]+\)|[a-z_]+)\.(?P<projs>\([a-z|]+\)|[a-z]+)_proj$")
_ATTENTION = ("self_attn", "cross_attn")
_PROJ = {"q", "k", "v", "o"}, {"gate", "up", "down"}  # attention's, the MLP's


def is_multimodal(config: dict) -> bool:
    """axolotl trains a vision-language model with a processor: its examples all say `processor_type`."""
    return bool(config.get("processor_type"))


def pixels(image_size) -> int | None:
    """axolotl's image_size (N: an N x N square; [width, height]) as a pixel count."""
    if isinstance(image_size, int) and image_size > 0:
        return image_size * image_size
    if isinstance(image_size, (list, tuple)) and len(image_size) == 2 and all(
            isinstance(n, int) and n > 0 for n in image_size):
        return image_size[0] * image_size[1]
    return None


def port_key(key: str, value: Any, config: dict, out) -> None:
    """One of TOP_KEYS (set) where it stands in the recipe: finetune settings, a dropped line, or a decision."""
    if key == "freeze_mm_modules" and value is True:
        for name in ("freeze_vision_tower", "freeze_multi_modal_projector"):
            out.settings[name] = True
            out.note(name, "from axolotl `freeze_mm_modules: true` (the vision tower and the projector)")
    elif key == "image_size" and pixels(value):
        _image_size(value, config, out)
    elif key == "processor_kwargs" and isinstance(value, dict):
        _processor_kwargs(value, config, out)
    elif key == "image_resize_algorithm":
        if not config.get("image_size"):
            out.drop(key, value, "dropped, not needed: axolotl resizes with it only when `image_size` is set")
        elif str(value).lower() == "bicubic":
            out.drop(key, value, "dropped, not needed: finetune scales images with bicubic too")
        else:
            out.block(key, value, f"axolotl resizes images to `image_size` with {value}; finetune scales them with "
                      "bicubic, so every image's pixels differ slightly: delete the line to train with bicubic, or "
                      "keep training this recipe with axolotl")
    elif key in BLOCKING:
        out.block(key, value, f"{HINTS[key]}: delete the line (`finetune preprocess RECIPE --show 1` marks what is "
                  "supervised), or keep training this recipe with axolotl")
    elif key == "freeze_mm_modules":
        out.drop(key, value, "dropped: false is axolotl's default (what trains: `freeze_vision_tower`)")
    elif key in ("image_size", "processor_kwargs"):
        out.drop(key, value, f"dropped: not a size axolotl reads ({HINTS[key]})")
    else:
        out.drop(key, value, "dropped, " + HINTS[key])


def _image_size(value, config: dict, out) -> None:
    """axolotl resizes every image to image_size (up or down), then the processor bounds it with its kwargs."""
    n = pixels(value)
    kwargs = config.get("processor_kwargs") if isinstance(config.get("processor_kwargs"), dict) else {}
    high = min(n, kwargs["max_pixels"]) if isinstance(kwargs.get("max_pixels"), int) else n
    low = min(max(n, kwargs["min_pixels"]), high) if isinstance(kwargs.get("min_pixels"), int) else high
    how = (f"pads each image to a {value} x {value} square (black bars)" if isinstance(value, int)
           else f"stretches each image to {value[0]} x {value[1]}")
    out.settings["image_max_pixels"], out.settings["image_min_pixels"] = high, low
    out.note("image_max_pixels", f"from axolotl `image_size: {value}`: axolotl {how}; finetune keeps each image's "
             f"aspect, scaled to {low:,}-{high:,} pixels, the same pixel budget (so as many image tokens)")


def _processor_kwargs(value: dict, config: dict, out) -> None:
    rest = {k: v for k, v in value.items() if k not in _PIXEL_KWARGS}
    if not config.get("image_size"):  # with image_size, _image_size reads the bounds
        for theirs, ours in _PIXEL_KWARGS.items():
            if isinstance(value.get(theirs), int):
                out.settings[ours] = value[theirs]
                out.note(ours, f"from axolotl `processor_kwargs.{theirs}: {value[theirs]}` (finetune scales the image "
                         "to it before the processor sees it)")
    if rest:
        out.block("processor_kwargs", rest, "these processor settings change how images become tokens; finetune "
                  "uses the processor as the model saved it (its pixel bounds are `image_min_pixels` / "
                  "`image_max_pixels`): delete them, or save the processor with them beside a copy of the model "
                  "and point base_model at it")
    elif not value:
        out.drop("processor_kwargs", value, "dropped: empty")


def finish(config: dict, out) -> None:
    """Once every key is read: the regex LoRA targets, and what trains in a vision-language model."""
    _regex_targets(config, out)
    if not is_multimodal(config):
        return
    if config.get("unfrozen_parameters") or config.get("freeze_mm_modules") is True:
        pass  # a decision (unfrozen_parameters blocks), or the tower frozen already
    elif config.get("adapter") in (None, "", "none", "full"):
        out.settings["freeze_vision_tower"] = False
        out.note("freeze_vision_tower", "axolotl's full fine-tune of a vision-language model trains every weight, the "
                 "vision tower's too (finetune's default, and LLaMA-Factory's, keeps it frozen: `true`)")
    elif config.get("lora_target_linear") is True:
        out.settings["freeze_vision_tower"] = False
        out.note("freeze_vision_tower", "axolotl's `lora_target_linear: true` adapts every linear layer by name, the "
                 "vision tower's too")
    if not ({"image_max_pixels", "image_min_pixels"} & set(out.settings)):
        out.settings["image_max_pixels"] = 768 * 768
        out.note("image_max_pixels", "finetune's default: each image is scaled down to 768 x 768 pixels at most "
                 "before the processor sees it, where axolotl hands it over as it is (bounded by the processor "
                 "alone: Qwen2-VL's allows 12.8 million pixels, 16k tokens); raise it to train on larger images")


def _regex_targets(config: dict, out) -> None:
    """axolotl passes a string `lora_target_modules` to peft as a regular expression over module names."""
    targets = out.settings.get("lora_target_modules")
    if not isinstance(targets, str) or targets == "all-linear":
        return
    if config.get("lora_target_linear") is True:  # axolotl lists the regex beside every linear layer's name
        out.settings["lora_target_modules"] = "all-linear"
        out.comments["lora_target_modules"] = [f"from axolotl's `lora_target_linear: true`: every linear layer "
                                               f"(the regex `{targets}` joins their names as one more name)"]
        return
    found = _LAYER_REGEX.match(targets)
    if found is None:
        return out.block("lora_target_modules", targets, "a regular expression over module names (peft matches it "
                         "whole); finetune takes `all-linear` or a list of layer names or suffixes (`finetune targets "
                         "RECIPE` lists them, part by part for a vision-language model)")
    blocks, projs = ({name for name in found[group].strip("()").split("|")} for group in ("blocks", "projs"))
    names = sorted({f"{block}.{proj}_proj" for block in blocks for proj in projs
                    if proj in _PROJ[0 if block in _ATTENTION else 1]})
    every = (blocks >= {"self_attn", "mlp"} and projs >= _PROJ[0] | _PROJ[1])
    out.settings["lora_target_modules"] = "all-linear" if every else names
    said = "every linear layer of the decoder layers" if every else ", ".join(names)
    out.comments["lora_target_modules"] = [f"from axolotl's regex `{targets}`: {said}"]
    if is_multimodal(config) and "freeze_multi_modal_projector" not in out.settings:
        out.settings["freeze_multi_modal_projector"] = True
        out.note("freeze_multi_modal_projector", "axolotl's regex adapts the language model's layers only: no "
                 "adapters on the projector (the vision tower is frozen by default)")
