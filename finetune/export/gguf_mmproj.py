"""A vision-language run as llama.cpp runs it: the language model's GGUF (written by export/gguf.py, as for a text
run) plus an `mmproj` GGUF beside it holding the vision tower and the projector (gguf-py's `clip` architecture,
general.type `mmproj`), what `llama-mtmd-cli -m MODEL.gguf --mmproj mmproj-MODEL.gguf` and Ollama (a second FROM
line) read.

What the mmproj holds follows llama.cpp's own converter (convert_hf_to_gguf.py --mmproj, its MmprojModel and the
family's subclass): the tower's hyperparameters (image and patch size, width, depth, heads, layer-norm epsilon),
the image processor's mean and std, the language model's width as the projection size, the projector type that
selects llama.cpp's graph, and each tensor named through gguf-py's TensorNameMap for the `clip` architecture from the
name the family's published checkpoints give it. A family is a row of VISION_FAMILIES; any other is refused before
a weight is loaded, naming what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.errors import ModelError
from finetune.log import get_logger


@dataclass(frozen=True)
class VisionFamily:
    projector_type: str  # clip.projector_type: llama.cpp's graph for the projector (tools/mtmd/clip-impl.h)
    tower_prefix: str  # the tower's weights as the family's checkpoints name them (what gguf-py's map knows)
    projector_prefix: str  # the projector's weights, the same way
    skip: tuple[str, ...] = ()  # tower weights llama.cpp does not run (names relative to the tower)


# transformers model_type -> how llama.cpp holds its tower and projector
VISION_FAMILIES = {
    # SigLIP tower, pixel shuffle by config.scale_factor, one linear layer (connector.modality_projection.proj);
    # images split into tiles of vision_config.image_size after a resize to the processor's longest edge
    "idefics3": VisionFamily("idefics3", "model.vision_model.", "model.connector."),
    "smolvlm": VisionFamily("idefics3", "model.vision_model.", "model.connector."),
    # SigLIP tower (its attention-pooling head unused), average pooling to mm_tokens_per_image, an RMS norm and
    # one projection matrix
    "gemma3": VisionFamily("gemma3", "vision_tower.vision_model.", "multi_modal_projector.", skip=("head.",)),
}


def mmproj_path(out: Path) -> Path:
    """model.f16.gguf -> mmproj-model.f16.gguf beside it (llama.cpp's converter names its files the same way)."""
    return out.with_name(f"mmproj-{out.name}")


def vision_family(config) -> VisionFamily:
    """The family's row, or a ModelError naming the family and what to use instead."""
    model_type = getattr(config, "model_type", None)
    if model_type not in VISION_FAMILIES:
        raise ModelError(
            f"cannot export a `{model_type}` vision-language model to GGUF: finetune writes llama.cpp's mmproj file "
            f"for {', '.join(sorted(VISION_FAMILIES))} (SmolVLM is an idefics3). Use `finetune merge` (the whole "
            "model with its processor, for transformers, vLLM or TGI), then llama.cpp's convert_hf_to_gguf.py on the "
            "merged folder, once for the language model and once with --mmproj, where llama.cpp supports the family "
            "(LLaVA-1.5 checkpoints go through its tools/mtmd/legacy-models scripts)")
    return VISION_FAMILIES[model_type]


def check_vision_export(config, out: Path) -> None:
    """Before any weight is loaded: the family, the language model's family, an mmproj file that would be
    overwritten."""
    from finetune.export.gguf_families import family_of

    vision_family(config)
    text = config.get_text_config()
    try:
        family_of(text)
    except ModelError as exc:
        raise ModelError(f"the language model of this `{config.model_type}` model: {exc}") from None
    if mmproj_path(out).exists():
        raise ModelError(f"`{mmproj_path(out)}` already exists; remove it or pass another file with -o/--output "
                         "(an export never overwrites)")


def text_model(model):
    """The language model of a vision-language model as a causal LM of its text config (a LlamaForCausalLM for
    Idefics3, Gemma3ForCausalLM for Gemma 3) sharing its weights: what a text GGUF holds."""
    import copy

    from transformers import AutoModelForCausalLM

    decoder, output = model.get_decoder(), model.get_output_embeddings()
    config = copy.deepcopy(model.config.get_text_config())
    config.tie_word_embeddings = output.weight is decoder.get_input_embeddings().weight
    causal = AutoModelForCausalLM.from_config(config, dtype=output.weight.dtype)
    causal.model, causal.lm_head = decoder, output
    return causal.eval()


def hub_named_weights(model, family: VisionFamily):
    """(name as the family's checkpoints have it, tensor) for the tower's and the projector's weights."""
    from finetune.model.vision import vision_parts

    parts = vision_parts(model)
    for prefixes, hub in ((parts.vision_tower, family.tower_prefix), (parts.multi_modal_projector,
                                                                       family.projector_prefix)):
        for prefix in prefixes:
            for name, tensor in model.get_submodule(prefix).state_dict().items():
                if prefixes is parts.vision_tower and name.startswith(family.skip):
                    continue
                # Gemma 3 keeps its projection matrix as a bare parameter, `mm_input_projection_weight`
                yield hub + name.replace("_weight", ".weight"), tensor


def mmproj_tensors(model, family: VisionFamily):
    """Yield (gguf name, float32 ndarray) for every tower and projector weight; ModelError on one llama.cpp has no
    place for (nothing is written then)."""
    import gguf
    import numpy as np

    blocks = model.config.vision_config.num_hidden_layers
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.MMPROJ, blocks)
    for hub_name, tensor in hub_named_weights(model, family):
        name = names.get_name(hub_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelError(f"the vision weight `{hub_name}` has no place in llama.cpp's `{family.projector_type}` "
                             "mmproj file; nothing was written")
        data = tensor.detach().float().cpu().numpy()
        if name == "mm.soft_emb_norm.weight":
            data = data + 1.0  # Gemma 3's RMS norm scales by (1 + weight); llama.cpp's by the weight itself
        yield name, np.ascontiguousarray(data)


def encode(name: str, data, quant: str):
    """The tower in f16 (f32 for --quant f32), as llama.cpp's converter writes mmproj files: a k-bit tower costs
    image quality for a few MB. Norms, biases and the patch and position embeddings stay f32 (llama.cpp forces
    them there too)."""
    import numpy as np

    if quant == "f32" or data.ndim == 1 or name.startswith(("v.patch_embd", "v.position_embd")):
        return data.astype(np.float32)
    return data.astype(np.float16)


def add_hyperparameters(writer, config, processor, family: VisionFamily, quant: str) -> None:
    """What clip.cpp reads (llama.cpp's MmprojModel.set_gguf_parameters and the family's additions)."""
    import gguf

    vision, text = config.vision_config, config.get_text_config()
    images = processor.image_processor
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(0 if quant == "f32" else 1)  # all f32, or mostly f16
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(family.projector_type)
    writer.add_vision_projection_dim(text.hidden_size)
    writer.add_vision_image_size(vision.image_size)
    writer.add_vision_patch_size(vision.patch_size)
    writer.add_vision_embedding_length(vision.hidden_size)
    writer.add_vision_feed_forward_length(vision.intermediate_size)
    writer.add_vision_block_count(vision.num_hidden_layers)
    writer.add_vision_head_count(vision.num_attention_heads)
    writer.add_vision_attention_layernorm_eps(vision.layer_norm_eps)
    writer.add_vision_image_mean(list(images.image_mean))
    writer.add_vision_image_std(list(images.image_std))
    writer.add_vision_use_gelu(True)  # SigLIP's gelu (tanh approximation)
    if family.projector_type == "idefics3":
        writer.add_vision_projector_scale_factor(config.scale_factor)  # the pixel shuffle
        writer.add_vision_preproc_image_size(images.size["longest_edge"])  # resized to this, then tiled
    elif family.projector_type == "gemma3":
        # patches per side pooled down to sqrt(mm_tokens_per_image) per side; llama.cpp assumes 4 unless told
        per_side = int(config.mm_tokens_per_image ** 0.5)
        writer.add_vision_projector_scale_factor((vision.image_size // vision.patch_size) // per_side)


def encoded_tensors(model, quant: str) -> list:
    """Every tower and projector weight named and encoded: a refusal happens here, before anything is written."""
    family = vision_family(model.config)
    return [(name, encode(name, data, quant)) for name, data in mmproj_tensors(model, family)]


def write_mmproj(model, processor, tensors: list, out: Path, quant: str, name: str) -> None:
    """The mmproj GGUF at `out` (encoded_tensors' tensors, the model's hyperparameters), atomically."""
    import gguf

    from finetune.export.gguf import gguf_file

    with gguf_file(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]) as writer:
        writer.add_name(name)
        add_hyperparameters(writer, model.config, processor, vision_family(model.config), quant)
        for tensor_name, array in tensors:
            writer.add_tensor(tensor_name, array)


def add_projector_to_modelfile(modelfile: Path, projector: Path) -> None:
    """Ollama takes a projector as a second FROM line after the model's."""
    from finetune.atomic import write_text_atomic

    lines = modelfile.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FROM ")) + 1
    lines.insert(at, f"FROM ./{projector.name}")
    write_text_atomic(modelfile, "\n".join(lines) + "\n")


def export_vision(trained, out: Path, quant: str):
    """A located vision-language run -> the language model's GGUF + Modelfile at `out` (export/gguf.py, as for a
    text run) and the mmproj beside it. Everything is checked before the merge; either both files are written or
    neither."""
    from dataclasses import replace

    from transformers import AutoConfig

    from finetune.export.gguf import check_output, check_quant, load_model, write_gguf
    from finetune.export.gguf_vocab import check_tokenizer
    from finetune.model.prompt_format import served_format
    from finetune.model.trained import saved_processor, saved_tokenizer

    check_output(out)
    check_quant(quant)
    check_vision_export(AutoConfig.from_pretrained(trained.base_source if trained.is_adapter else trained.folder), out)
    tokenizer = saved_tokenizer(trained.folder)
    check_tokenizer(tokenizer)
    processor = saved_processor(trained)
    model = load_model(trained, tokenizer)
    tensors = encoded_tensors(model, quant)
    projector = mmproj_path(out)
    exported = write_gguf(text_model(model), tokenizer, out, quant, name=out.stem,
                          prompt_format=served_format(trained.folder)[0])
    try:
        write_mmproj(model, processor, tensors, projector, quant, name=f"mmproj-{out.stem}")
        add_projector_to_modelfile(exported.modelfile_path, projector)
    except BaseException:
        out.unlink(missing_ok=True)
        exported.modelfile_path.unlink(missing_ok=True)
        raise
    get_logger(__name__).info(f"wrote the vision tower and projector: {projector} ({len(tensors)} tensors, "
                              f"{'f32' if quant == 'f32' else 'f16'}, projector type "
                              f"{vision_family(model.config).projector_type})")
    return replace(exported, mmproj_path=projector)
