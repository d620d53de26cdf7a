"""A vision-language model's vision side in a plan: its weights, an image's tokens, activations and FLOPs (pure math;
the numbers come from the model and its processor through finetune/model/vision_budget.py).

An image at the recipe's pixel budget (image_max_pixels) is `patches_per_image` tokens in the vision tower (its
tiles' patches, a class token included where the tower has one) and `tokens_per_image` tokens in the language model's
sequence, which the language model's own plan already holds inside sequence_len.

Activations the tower keeps for backward, fitted against the tensors autograd saves (CPU, saved_tensors_hooks; SigLIP
and CLIP towers, transformers 5; tests/test_plan_vision.py re-measures them), e = bytes of the compute dtype:

    per layer and patch   e x (8h + m x I + 4) + 4a   norms' inputs and outputs, q k v, attention output, the MLP's
                          m tensors of width I (m = 2 for gelu, 3 for CLIP's quick_gelu), the norms' statistics,
                          the attention's log-sum-exp (fp32)
    per patch             e x (h + 3)                 the final norm
    per image             e x its pixel values        the patch embedding's input

A frozen tower (freeze_vision_tower, the default) takes no gradient and has no input that does: autograd records
nothing, so it keeps no activations. A projector that trains keeps its input (the tower's output, e x h per patch)
and, in an MLP, its hidden layer before and after the activation (e x 2 x its width per image feature). FLOPs per image: 2 per matmul weight and patch forward (x3 when the tower trains in full: input and weight
gradients; x2 under LoRA: input gradients only), the patch embedding's once per patch of pixels, plus attention's
4 x layers x h x tile length per patch forward.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VisionShape:
    tower_params: int
    projector_params: int
    layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    mlp_saved: int  # tensors of width intermediate_size the MLP saves per token: 2 (gelu), 3 (CLIP's quick_gelu)
    patches_per_image: int  # tower tokens for one image at the pixel budget: all tiles, class tokens included
    tile_length: int  # tokens one tower forward attends over (a tile's, or the whole image's)
    pixel_values_per_image: int  # numbers the tower reads for one image (channels x height x width, all tiles)
    features_per_image: int  # rows the projector maps for one image (the image feature tokens)
    tokens_per_image: int  # tokens one image takes in the language model's sequence (boundaries included)
    projector_hidden: int  # widths of the projector's inner layers (an MLP's hidden width; 0 for one linear layer)
    image_size: tuple[int, int]  # (width, height) of the budget's image
    tower_matmul_params: int  # tower weights used in a matmul per token (its linear layers)
    patch_embedding_params: int  # the patch embedding's weights, applied once per patch of pixels
    class_tokens: int  # tower tokens of one image that are not patches of pixels (CLIP's class token, per tile)
    projector_matmul_params: int
    tower: str = "frozen"  # frozen | full | lora: how the tower trains
    projector: str = "full"  # frozen | full | lora


def tower_layer_bytes_per_patch(shape: VisionShape, e: int) -> int:
    h, inter = shape.hidden_size, shape.intermediate_size
    return e * (8 * h + shape.mlp_saved * inter + 4) + 4 * shape.num_heads


def activation_bytes(shape: VisionShape, images: int, e: int) -> int:
    """Bytes the vision side keeps for backward for `images` images: the tower's when it trains (in full or with
    adapters: the inputs of every layer are needed), the projector's when it does."""
    per_image = 0
    if shape.tower != "frozen":
        per_image += (shape.layers * tower_layer_bytes_per_patch(shape, e) + e * (shape.hidden_size + 3)) \
            * shape.patches_per_image + e * shape.pixel_values_per_image
    if shape.projector != "frozen":
        per_image += e * (shape.hidden_size * shape.patches_per_image
                          + 2 * shape.projector_hidden * shape.features_per_image)
    return per_image * images


_PASSES = {"frozen": 1, "lora": 2, "full": 3}  # forward; + input gradients; + weight gradients


def flops_per_image(shape: VisionShape) -> float:
    """Training FLOPs (forward, and backward where the part trains) for one image: tower and projector."""
    tower = 2.0 * shape.tower_matmul_params * shape.patches_per_image \
        + 2.0 * shape.patch_embedding_params * (shape.patches_per_image - shape.class_tokens) \
        + 4.0 * shape.layers * shape.hidden_size * shape.tile_length * shape.patches_per_image
    projector = 2.0 * shape.projector_matmul_params * shape.features_per_image
    return tower * _PASSES[shape.tower] + projector * _PASSES[shape.projector]


def _count(n: float) -> str:
    return f"{n / 1e6:,.1f}M" if n >= 1e5 else f"{n:,.0f}"


def _size(n: float, units=(("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))) -> str:
    name, scale = next(((u, s) for u, s in units if n >= s), units[-1])
    return f"{n / scale:,.1f} {name}"


def describe(shape: VisionShape, images: int, e: int) -> str:
    """The plan's vision line."""
    width, height = shape.image_size
    flops = flops_per_image(shape) * images
    return (f"vision: tower {_count(shape.tower_params)} parameters ({shape.tower}), projector "
            f"{_count(shape.projector_params)} ({shape.projector}); an image at the pixel budget ({width} x {height}) "
            f"is {shape.patches_per_image:,} tower tokens and {shape.tokens_per_image:,} tokens of the sequence; "
            f"{images} image(s) per micro batch (one a sequence): {_size(activation_bytes(shape, images, e))} of "
            f"activations kept for backward (in the activations above), "
            + (f"{flops / 1e12:,.2f} TFLOPs" if flops >= 1e11 else f"{flops / 1e6:,.1f} MFLOPs")
            + " per micro batch")
