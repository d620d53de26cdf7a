"""What `finetune plan` needs of a vision-language model (plan/vision.py does the arithmetic): its three parts on
the meta device (weights counted, no memory), and one image at the recipe's pixel budget through its processor (the
tower's patches and tiles from the pixel values, the sequence's tokens from the encoder training uses).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass

from finetune.errors import ModelError
from finetune.model.vision import PARTS, vision_parts


@dataclass
class VisionPlan:
    model: object  # the whole model on the meta device
    frozen: object  # name -> bool: in a part the recipe freezes
    unquantized: object  # name -> bool: kept out of QLoRA's 4-bit storage (tower and projector)
    shape: object  # plan.vision.VisionShape


def meta_vision_model(config):
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def budget_image(max_pixels: int, min_pixels: int | None):
    """The largest image the budget lets through (a square), as an image part the encoder reads."""
    from PIL import Image

    side = max(math.isqrt(max_pixels), math.isqrt(min_pixels or 0))
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (128, 96, 64)).save(buffer, format="PNG")
    return {"type": "image", "base64": base64.b64encode(buffer.getvalue()).decode()}


def _tower_counts(tower, config, pixel_values, grid=None) -> tuple[int, int, int]:
    """(tower tokens for the image, tokens one tower forward attends over, class tokens among them) from the
    processor's pixel values."""
    if pixel_values.dim() == 2:  # Qwen2-VL: rows of flattened patches, one grid (t, h, w) per image
        patches = int(grid.prod(-1).sum()) if grid is not None else pixel_values.shape[0]
        return patches, patches, 0
    tiles = math.prod(pixel_values.shape[:-3])  # (images, C, H, W) or (batch, tiles, C, H, W)
    height, width = pixel_values.shape[-2:]
    patch = config.patch_size
    per_tile = (height // patch) * (width // patch)
    embeddings = getattr(tower, "embeddings", None)
    cls = 1 if getattr(embeddings, "class_embedding", None) is not None else 0  # CLIP's class token
    return tiles * (per_tile + cls), per_tile + cls, tiles * cls


def image_counts(processor, max_pixels: int, min_pixels: int | None, tower, config, feature_id: int | None) -> dict:
    """One image at the budget: its size, pixel values, tower patches, and its tokens in the sequence."""
    from finetune.data.vision.encode import ImageEncoder, Rejected
    from finetune.data.vision.images import load_image

    part = budget_image(max_pixels, min_pixels)
    image = load_image(part, max_pixels=max_pixels, min_pixels=min_pixels)
    pixels = processor.image_processor(images=[image], return_tensors="pt")
    patches, tile, cls = _tower_counts(tower, config, pixels["pixel_values"], pixels.get("image_grid_thw"))
    record = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "?"}]},
                           {"role": "assistant", "content": "!"}]}
    example = ImageEncoder(processor, max_pixels, min_pixels).encode(record, train_on_inputs=False)
    if isinstance(example, Rejected):
        raise ModelError(f"the processor could not encode an image at the pixel budget: {example.detail}")
    # the positions the model fills with image features: its config's image token
    features = sum(1 for i in example.input_ids if i == feature_id) if feature_id is not None else \
        example.image_tokens
    return {"image_size": image.size, "pixel_values": int(pixels["pixel_values"].numel()), "patches": patches,
            "tile": tile, "class_tokens": cls, "tokens": example.image_tokens, "features": features}


def _how(part: str, frozen: set, adapter: str) -> str:
    return "frozen" if part in frozen else "full" if adapter == "none" else "lora"


def plan_vision(config, processor, keys, adapter: str) -> VisionPlan:
    """The vision side of a plan. `keys`: the recipe, or recipe.vision.VisionKeys() (its freeze keys and pixel
    budget); `adapter`: none | lora | qlora."""
    import torch

    from finetune.plan.vision import VisionShape

    model = meta_vision_model(config)
    parts = vision_parts(model)
    frozen = parts.frozen(keys)
    sizes = dict.fromkeys(PARTS, 0)
    matmul = dict.fromkeys(PARTS, 0)
    patch_embedding = 0
    linears = []  # the projector's linear layers' input widths, in order
    for name, module in model.named_modules():
        part = parts.part_of(name)
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if part is not None:
            sizes[part] += own
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d)):
                patch_embedding += module.weight.numel()
            elif isinstance(module, torch.nn.Linear):
                matmul[part] += module.weight.numel()
                linears += [module.in_features] if part == "multi_modal_projector" else []
            elif part == "multi_modal_projector":  # Gemma 3's projection is a bare parameter used in a matmul
                matmul[part] += sum(p.numel() for p in module.parameters(recurse=False) if p.dim() == 2)
    tower = model.get_submodule(parts.vision_tower[0])
    vision = config.vision_config
    feature_id = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
    counts = image_counts(processor, keys.image_max_pixels, keys.image_min_pixels, tower, vision, feature_id)
    hidden = getattr(vision, "embed_dim", None) or vision.hidden_size  # Qwen2-VL's tower width is embed_dim
    shape = VisionShape(
        tower_params=sizes["vision_tower"], projector_params=sizes["multi_modal_projector"],
        layers=getattr(vision, "num_hidden_layers", None) or vision.depth, hidden_size=hidden,
        intermediate_size=getattr(vision, "intermediate_size", None) or int(hidden * vision.mlp_ratio),
        num_heads=getattr(vision, "num_attention_heads", None) or vision.num_heads,
        mlp_saved=3 if getattr(vision, "hidden_act", "") == "quick_gelu" else 2,
        patches_per_image=counts["patches"], tile_length=counts["tile"], pixel_values_per_image=counts["pixel_values"],
        features_per_image=counts["features"], tokens_per_image=counts["tokens"], image_size=counts["image_size"],
        projector_hidden=sum(linears[1:]),
        tower_matmul_params=matmul["vision_tower"], projector_matmul_params=matmul["multi_modal_projector"],
        patch_embedding_params=patch_embedding, class_tokens=counts["class_tokens"],
        tower=_how("vision_tower", frozen, adapter), projector=_how("multi_modal_projector", frozen, adapter))

    def in_part(name: str, chosen) -> bool:
        return parts.part_of(name) in chosen
    return VisionPlan(model, lambda name: in_part(name, frozen),
                      lambda name: in_part(name, {"vision_tower", "multi_modal_projector"}), shape)
