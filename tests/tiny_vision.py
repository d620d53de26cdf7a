"""Tiny vision-language models built from config, with a processor built in-process: what the vision tests train.

Each family's model is its transformers class at toy size (a 1-layer vision tower on 16-32 px images, patch 8;
the language model of tests/tiny.py) with the processor the family ships, its image processor's PIL backend, the
tiny tokenizer plus the family's image tokens, and a ChatML template that renders image parts the way the family's
own template does. Never touches the network.

    python tests/tiny_vision.py llava DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from tiny import build_tokenizer

# ChatML whose image parts render as IMAGE (the family's placeholder); string content is accepted as well
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ 'IMAGE' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def text_config(cls, tokenizer, **extra):
    return cls(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
               tie_word_embeddings=False, **extra)


def tokenizer_with(tokens: list[str], placeholder: str, named: dict[str, str] | None = None):
    """The tiny tokenizer plus the family's image tokens; `named`: tokens the processor reads by name
    (Gemma 3's tokenizer.boi_token...)."""
    tokenizer = build_tokenizer()
    if named:
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|endoftext|>",
                                            pad_token="<pad>", model_specific_special_tokens=named)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.chat_template = TEMPLATE.replace("IMAGE", placeholder)
    return tokenizer


def llava():
    """LLaVA 1.5's layout: a CLIP tower (its CLS feature dropped), a 2-layer MLP projector, a Llama."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    tokenizer = tokenizer_with(["<image>"], "<image>")
    images = LlavaImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=tokenizer.chat_template)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       image_size=16, patch_size=8),
        text_config=text_config(LlamaConfig, tokenizer), image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default", vision_feature_layer=-1)
    return LlavaForConditionalGeneration(config), processor


def idefics3():
    """Idefics3 / SmolVLM: a SigLIP-like tower, a pixel-shuffle connector, a Llama; large images split into tiles
    (<row_i_col_j> before each tile, then the global image), every image framed by <fake_token_around_image>."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, Idefics3VisionConfig
    from transformers import LlamaConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    grid = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tokenizer = tokenizer_with(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *grid],
                               "<image>")
    # tiles of 32 px, an image at most 64 px on its longest edge: up to 2 x 2 tiles + the global image
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    # (32 / 8)^2 patches, shuffled by 2 in each direction: 4 image tokens a tile
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4,
                                  chat_template=tokenizer.chat_template)
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=text_config(LlamaConfig, tokenizer), scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=tokenizer.pad_token_id)
    return Idefics3ForConditionalGeneration(config), processor


def smolvlm():
    """SmolVLM2: Idefics3's model classes (SmolVLMModel subclasses Idefics3Model: vision_model, connector, text_model)
    at the same toy size. Idefics3's processor: SmolVLMProcessor expands an image into the same tokens but needs the
    num2words package (its video prompts), which the venv does not have."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMVisionConfig

    idefics, processor = idefics3()
    vision = idefics.config.vision_config.to_dict()
    config = SmolVLMConfig(vision_config=SmolVLMVisionConfig(**{k: vision[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size", "patch_size")}),
        text_config=idefics.config.text_config, scale_factor=2, image_token_id=idefics.config.image_token_id,
        pad_token_id=idefics.config.pad_token_id)
    return SmolVLMForConditionalGeneration(config), processor


def gemma3():
    """Gemma 3: a SigLIP tower pooled to a square of soft tokens, <start_of_image> in the text expanded to
    "\\n\\n<start_of_image>" + soft tokens + "<end_of_image>\\n\\n"; image tokens attend both ways (token_type_ids)."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor, Gemma3TextConfig
    from transformers import SiglipVisionConfig
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = tokenizer_with(["<start_of_image>", "<end_of_image>", "<image_soft_token>"], "<start_of_image>", {
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4,
                                chat_template=tokenizer.chat_template)
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=32, patch_size=8),
        text_config=text_config(Gemma3TextConfig, tokenizer, head_dim=16, query_pre_attn_scalar=16),
        mm_tokens_per_image=4, boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"), tie_word_embeddings=False)
    model = Gemma3ForConditionalGeneration(config)
    # transformers starts the projector's input projection at zero, so an untrained tiny model's image features are
    # all zero and no image changes its outputs: random values, so a test can tell images apart
    model.model.multi_modal_projector.mm_input_projection_weight.data.normal_(0, 0.2)
    return model, processor


def qwen2_vl():
    """Qwen2-VL: dynamic resolution (one token per 2 x 2 patches of 8 px here), <|vision_start|><|image_pad|>...
    <|vision_end|>, 3-D rotary positions (mrope) from the image grid. Its processor's video side needs torchvision."""
    from transformers import Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = qwen2_vl_tokenizer()
    pixels = {"shortest_edge": 16 * 16, "longest_edge": 64 * 64}
    images = Qwen2VLImageProcessorPil(size=pixels, patch_size=8, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer,
                                 chat_template=tokenizer.chat_template)
    return Qwen2VLForConditionalGeneration(qwen2_vl_config(tokenizer)), processor


def qwen2_vl_tokenizer():
    return tokenizer_with(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
                          "<|vision_start|><|image_pad|><|vision_end|>")


def qwen2_vl_config(tokenizer=None):
    """The tiny Qwen2-VL's config alone (no processor: it needs torchvision)."""
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig

    tokenizer = tokenizer or qwen2_vl_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    return Qwen2VLConfig(
        vision_config=Qwen2VLVisionConfig(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=8,
                                          spatial_merge_size=2, temporal_patch_size=2),
        text_config=text_config(Qwen2VLTextConfig, tokenizer, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


FAMILIES = {"llava": llava, "idefics3": idefics3, "smolvlm": smolvlm, "gemma3": gemma3, "qwen2_vl": qwen2_vl}


def smollm2_vision(text_dir: str | Path, out_dir: str | Path, edge: int = 32, seed: int = 0) -> Path:
    """SmolVLM's layout on a real language model: Idefics3 with the causal LM in `text_dir` (SmolLM2-135M-Instruct,
    the quickstart's GGUF converted) loaded unchanged, behind a 1-layer random vision tower on `edge`-px images in
    8-px patches (shuffled 2 x 2: (edge / 16)^2 image tokens an image, no tiles). What benchmarks/bench_vlm_vs_trl.py
    trains; examples/notebooks/cpu_vision.ipynb builds the same model in its own cell."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration
    from transformers import Idefics3Processor, Idefics3VisionConfig, LlamaConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    torch.manual_seed(seed)
    language_model = AutoModelForCausalLM.from_pretrained(str(text_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(text_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]})
    tokenizer.chat_template = TEMPLATE.replace("IMAGE", "<image>")
    images = Idefics3ImageProcessorPil(size={"longest_edge": edge}, max_image_size={"longest_edge": edge},
                                       do_image_splitting=False)
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=(edge // 16) ** 2,
                                  chat_template=tokenizer.chat_template)
    text = {k: v for k, v in language_model.config.to_dict().items()
            if k not in ("architectures", "_name_or_path", "transformers_version", "dtype")}
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=edge, patch_size=8),
        text_config=LlamaConfig(**{**text, "vocab_size": len(tokenizer)}), scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True)
    model = Idefics3ForConditionalGeneration(config)
    language_model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.model.text_model.load_state_dict(language_model.model.state_dict())
    model.tie_weights()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def build_tiny_vlm(family: str, out_dir: str | Path, seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    model, processor = FAMILIES[family]()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def tiny_vlm(family: str, root: str | Path) -> Path:
    """The family's tiny model in root/family, built on first use (test modules share one build per session)."""
    folder = Path(root) / family
    return folder if (folder / "config.json").is_file() else build_tiny_vlm(family, folder)


def draw_images(folder: str | Path, colours: dict[str, tuple[int, int, int]], size=(20, 16)) -> dict[str, str]:
    """One PNG of a flat colour per name: {name: absolute path}."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, rgb in colours.items():
        path = folder / f"{name}.png"
        Image.new("RGB", size, rgb).save(path)
        out[name] = str(path.resolve())
    return out


if __name__ == "__main__":
    print(build_tiny_vlm(sys.argv[1], sys.argv[2]))
