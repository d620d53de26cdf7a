"""The model families finetune knows: per transformers `model_type`, what each fast path does with it.

A family is data, not a code path. One row per `model_type` says whether packed rows may train on it (and why
not), whether packed rows on CPU may run example by example (finetune/model/varlen_attention.py), whether
transformers gives its class an SDPA and a flex_attention path, whether it is a mixture of experts, and what
is worth knowing about its attention (sliding windows, linear-attention layers, soft-capping, sinks). The fast
paths read these rows instead of naming families; tests/test_families.py runs every row through every method
(the family matrix) and holds `sdpa` / `flex` to transformers' own class flags; `finetune models --markdown`
writes docs/models.md from the rows.

A family with no row takes the generic path: padded rows, SDPA (eager where the class has no SDPA): no sample
packing, and with it no per-example attention on CPU and no flex_attention; GRPO scores each completion in a row
of its own. The run says so in one line (`generic_path`). Regional compile is not a family matter: it compiles
transformers' decoder layers whatever they hold, after a probe on the device (finetune/train/fast_paths.py). A
family joins by one row here, once the matrix passes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ModelError
from finetune.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Family:
    model_type: str
    name: str  # the models people know it by
    # "" when packed rows train on it (the packing guard still proves isolation on the real model each run);
    # otherwise why packing is refused
    packing: str = ""
    # "" when packed rows on CPU may run attention example by example; otherwise why not. A checkpoint whose
    # config turns on sliding windows is refused there in any family (per_example_attention)
    per_example: str = ""
    sdpa: bool = True  # transformers' class has an SDPA path (else eager); tests hold it to _supports_sdpa
    flex: bool = True  # ... and a flex_attention path; tests hold it to _supports_flex_attn
    moe: bool = False  # a mixture of experts
    attention: str = "causal softmax attention"  # what its attention layers are, for docs/models.md
    notes: str = ""


_PLAIN = "plain causal softmax attention"
_WINDOW = ("sliding-window layers: a per-example call would have to reproduce the window; packed rows take the "
           "masked kernel, which applies it")
_LINEAR = ("its linear-attention (Gated DeltaNet) layers run a recurrence and a causal convolution along the whole "
           "row: transformers 5.23's PyTorch path takes no example boundaries, so a packed example would read the "
           "state of the one before it")

ROWS = (
    Family("llama", "Llama 2 / 3 / 3.x, TinyLlama, SmolLM / SmolLM2", attention=_PLAIN),
    Family("mistral", "Mistral 7B, Mistral Nemo / Small", attention=_PLAIN + "; sliding window where the config sets "
           "one (Mistral 7B v0.1)", notes="a checkpoint with `sliding_window` set packs on the masked kernel"),
    Family("qwen2", "Qwen2, Qwen2.5", attention=_PLAIN + " with q/k/v biases",
           notes="shipped configs leave the sliding window off (use_sliding_window: false)"),
    Family("qwen3", "Qwen3 (dense)", attention=_PLAIN + " with q/k norms"),
    Family("qwen3_moe", "Qwen3 MoE (30B-A3B, 235B-A22B)", moe=True, attention=_PLAIN + " with q/k norms"),
    Family("qwen3_next", "Qwen3-Next (hybrid linear attention)", packing=_LINEAR, per_example="no packing", flex=False,
           moe=True, attention="hybrid: Gated DeltaNet linear attention, with a full softmax layer every few",
           notes="trains on padded rows; GRPO scores each completion in a row of its own"),
    Family("gemma", "Gemma (1), CodeGemma", attention=_PLAIN + "; multi-query in the 2B",
           notes="+1 RMSNorm weights; embeddings scaled by sqrt(hidden size)"),
    Family("gemma2", "Gemma 2", sdpa=False,
           per_example="attention logit soft-capping, which SDPA cannot apply",
           attention="soft-capped attention, alternating sliding-window and global layers",
           notes="+1 RMSNorm weights; final logits soft-capped too"),
    Family("gemma3_text", "Gemma 3 (text), Gemma 3 1B", per_example=_WINDOW,
           attention="5 sliding-window layers to 1 global; q/k norms", notes="+1 RMSNorm weights"),
    Family("phi3", "Phi-3, Phi-3.5, Phi-4-mini", attention=_PLAIN + "; fused qkv and gate_up projections",
           notes="Phi-3-mini-4k's config sets a sliding window (2047): it packs on the masked kernel"),
    Family("olmo2", "OLMo 2", attention=_PLAIN + " with q/k norms; norms after the blocks"),
    Family("smollm3", "SmolLM3", attention=_PLAIN + "; every 4th layer without RoPE (NoPE)"),
    Family("granite", "Granite 3.x", attention=_PLAIN + "; embedding, residual, attention and logit multipliers"),
    Family("glm", "GLM-4 9B (the first HF-native GLM-4)", attention=_PLAIN + "; partial rotary"),
    Family("glm4", "GLM-4 (0414)", attention=_PLAIN + "; partial rotary, norms after attention and MLP"),
    Family("gpt_oss", "gpt-oss (20B, 120B)", sdpa=False, moe=True,
           packing="transformers 5.23 builds its attention masks without position_ids (transformers PR #39997, "
                   "open), so the masked kernels would let packed examples attend to each other",
           per_example="no packing; and attention sinks (a learned per-head logit), which SDPA cannot apply",
           attention="attention sinks, alternating sliding-window and full layers",
           notes="trains on padded rows; GRPO scores each completion in a row of its own"),
    Family("mixtral", "Mixtral 8x7B, 8x22B", moe=True, attention=_PLAIN),
    Family("olmoe", "OLMoE", flex=False, moe=True, attention=_PLAIN + " with q/k norms"),
    Family("deepseek_v3", "DeepSeek-V3, R1, Kimi K2 (DeepSeek-V3 layout)", moe=True,
           attention="multi-head latent attention (low-rank q and kv, decoupled rotary dims)",
           notes="first layers dense, then shared + routed experts; the multi-token-prediction layer is not built "
                 "by transformers"),
)
FAMILIES: dict[str, Family] = {row.model_type: row for row in ROWS}

# Vision-language families (AutoModelForImageTextToText: finetune/model/vision.py, docs/vision.md), SFT only so far:
# tests/test_vision_families.py is their matrix (packed == unpacked loss where packing is allowed). flex=False: their
# classes have the path, but flex_attention with image tokens is not proven here (a GPU check), so `auto` keeps sdpa
_IMAGE_BLOCKS = ("its image tokens attend to each other both ways (token_type_ids), and the attention mask transformers "
                 "builds for that lets the examples of a packed row see each other (a packed row's loss differs from "
                 "its examples' alone)")
VISION_ROWS = (
    Family("llava", "LLaVA 1.5 (a CLIP tower, an MLP projector, a Llama / Mistral / Vicuna)", flex=False,
           attention="the language model's"),
    Family("idefics3", "Idefics3, SmolVLM (a SigLIP tower, a pixel-shuffle connector, a Llama)", flex=False,
           attention="the language model's"),
    Family("smolvlm", "SmolVLM2 (Idefics3's classes and layout; its processor needs the num2words package)",
           flex=False, attention="the language model's"),
    Family("gemma3", "Gemma 3 4B / 12B / 27B (image-text)", packing=_IMAGE_BLOCKS, per_example="no packing",
           flex=False, attention="Gemma 3's, with image tokens attending both ways"),
    Family("qwen2_vl", "Qwen2-VL", packing="its 3-D rotary positions (mrope) are computed from a whole row's tokens and "
           "image grids, so examples packed into one row would not each start at position 0", per_example="no packing",
           flex=False, attention="Qwen2's, with 3-D rotary positions (mrope)"),
)
VISION_FAMILIES: dict[str, Family] = {row.model_type: row for row in VISION_ROWS}


def family(model_type: str | None) -> Family | None:
    return FAMILIES.get(model_type or "") or VISION_FAMILIES.get(model_type or "")


def per_example_attention(config) -> tuple[bool, str]:
    """(packed rows on CPU may run attention example by example for this config, why not)."""
    row = family(getattr(config, "model_type", None))
    if row is None:
        return False, f"model_type `{getattr(config, 'model_type', '?')}` is not in the family table"
    if row.per_example:
        return False, row.per_example
    # a vision-language model's window is its language model's: in text_config, not on the outer config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or []
    if getattr(text, "sliding_window", None) or any(t != "full_attention" for t in layer_types):
        return False, "this checkpoint's config sets a sliding window"
    return True, ""


def packs(config) -> bool:
    """Packed rows may train this config's model: a family with a row that does not refuse packing."""
    row = family(getattr(config, "model_type", None))
    return row is not None and not row.packing


def base_config(recipe):
    """The base model's transformers config (no weights read); None when it cannot be read here (loading the
    model reports that properly)."""
    from transformers import AutoConfig

    from finetune.model.loader import resolve_model_path

    try:
        source = resolve_model_path(recipe.base_model, recipe.cache_dir)
        return AutoConfig.from_pretrained(source, trust_remote_code=recipe.trust_remote_code)
    except Exception:  # noqa: BLE001 advisory only: remote code may raise anything; loading reports it properly
        return None


def declared_config(recipe):
    """The base model's `model_type` as its config.json declares it, read as JSON (no transformers, no network):
    a local folder's, or a hub id's in the local HF cache; None when neither is here (a GGUF file, a model not yet
    downloaded): `finetune validate`'s look at the family, which stays instant."""
    import json
    import types
    from pathlib import Path

    path = Path(recipe.base_model) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(recipe.base_model, "config.json")
        except Exception:  # noqa: BLE001 not a hub id (a file path, a malformed name): nothing to read here
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    try:
        model_type = json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return types.SimpleNamespace(model_type=model_type) if isinstance(model_type, str) else None


GENERIC_PATHS = "sample packing (nor, with it, per-example attention on CPU and flex_attention)"


def generic_path(recipe, config=None):
    """The recipe this family trains with. A known family: the recipe as it is, except packing asked of a family
    that refuses it (ModelError, before anything loads). A family with no row: packing off, with one log line
    saying which fast paths it does not get and why. `finetune train` asks it, and so do validate (with
    declared_config), plan and preprocess, in the same words."""
    config = config if config is not None else base_config(recipe)
    if config is None:
        return recipe
    model_type = getattr(config, "model_type", None)
    row = family(model_type)
    packing = recipe.sample_packing or bool(recipe.eval_sample_packing)
    if row is not None:
        if row.packing and packing:
            raise ModelError(f"`sample_packing` cannot train {row.name} (`{model_type}`): {row.packing}. Set "
                             "`sample_packing: false` (and `eval_sample_packing: false`); docs/models.md lists "
                             "what each family supports.")
        return recipe
    say = log.warning if packing else log.info
    say(f"model_type `{model_type}` is not in finetune's family table (docs/models.md): it trains on the generic "
        f"path, padded rows, without {GENERIC_PATHS}: none is proven on this family"
        f"{' (`sample_packing: true` is not honoured)' if packing else ''}")
    if not packing:
        return recipe
    return recipe.model_copy(update={"sample_packing": False, "eval_sample_packing": False})
