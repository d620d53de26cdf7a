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


def tokenizer_with(tokens: list[str], placeholder: str):
    tokenizer = build_tokenizer()
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


FAMILIES = {"llava": llava}


def build_tiny_vlm(family: str, out_dir: str | Path, seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    model, processor = FAMILIES[family]()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


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
