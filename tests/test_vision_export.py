"""A vision-language run for use elsewhere (issue 39 item 7): `finetune merge` writes the whole model with its
processor, which transformers loads (AutoModelForImageTextToText + AutoProcessor) and which gives the adapter's logits
on an image prompt; `finetune export --gguf` writes the language model and llama.cpp's mmproj file (the tower and the
projector) for the families llama.cpp's converter maps, each read back; other families are one message."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml

from conftest import write_jsonl
from tiny_vision import draw_images, tiny_vlm

NEEDS_TORCHVISION = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="Qwen2-VL's processor needs torchvision (its video processor)")
FAMILIES = ["llava", "idefics3", "gemma3", pytest.param("qwen2_vl", marks=NEEDS_TORCHVISION)]
COLOURS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return draw_images(tmp_path_factory.mktemp("export-images"), COLOURS, (40, 30))


def train_run(root, folder, family: str, images: dict, **keys):
    """A 2-step LoRA run of the family's tiny model (built in `root`) on colour records; returns its recipe."""
    from finetune.cli import main

    records = [{"messages": [{"role": "user", "content": [{"type": "image", "path": images[name]},
                                                          {"type": "text", "text": "what colour"}]},
                             {"role": "assistant", "content": name}]} for name in COLOURS] * 2
    data = write_jsonl(folder / "data.jsonl", records)
    recipe = {"base_model": str(tiny_vlm(family, root)), "datasets": [{"path": str(data), "type": "chat"}],
              "adapter": "lora", "lora_r": 4, "sequence_len": 128, "micro_batch_size": 3, "max_steps": 2,
              "learning_rate": 5e-2, "output_dir": str(folder / "out"), "cache_dir": str(folder / "cache"),
              "report_to": ["none"], **keys}
    path = folder / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, images):
    """family -> (recipe, merged folder): one LoRA run per family, merged once with `finetune merge`."""
    from finetune.cli import main

    root = tmp_path_factory.getbasetemp()  # tiny_vlm builds each family once per session here
    built = {}

    def get(family):
        if family not in built:
            recipe = train_run(root, tmp_path_factory.mktemp(f"run-{family}"), family, images)
            assert main(["merge", str(recipe)]) == 0
            built[family] = recipe, recipe.parent / "out" / "merged"
        return built[family]
    return get


def image_prompt(processor, image_path: str) -> dict:
    """The processor's inputs for one image question, rendered by the chat template the folder carries."""
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], images=[[Image.open(image_path).convert("RGB")]], return_tensors="pt")


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits.float()


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_vlm_loads_whole_and_gives_the_adapters_logits(runs, images, family):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from finetune.model.trained import load_adapter_model, locate

    recipe, merged_dir = runs(family)
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    processor = AutoProcessor.from_pretrained(merged_dir)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base_dir = yaml.safe_load(recipe.read_text())["base_model"]
    assert type(processor) is type(AutoProcessor.from_pretrained(base_dir))
    assert processor.chat_template and processor.tokenizer.chat_template  # the run's template, for chat tools
    inputs = image_prompt(processor, images["green"])
    assert "pixel_values" in inputs and (inputs["input_ids"] == merged.config.image_token_id).sum() > 0

    trained = locate(str(recipe))
    assert trained.vision  # the run finder knows a vision-language run from its base
    adapter_model, _ = load_adapter_model(trained)
    merged_logits, adapter_logits = logits(merged, inputs), logits(adapter_model.eval(), inputs)
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-5, atol=1e-5)
    # the adapter changed the model (a vacuous match would pass the line above too), and the image is read
    base = AutoModelForImageTextToText.from_pretrained(base_dir).eval()
    assert (merged_logits - logits(base, inputs)).abs().max() > 1e-3
    other = image_prompt(processor, images["red"])
    assert (logits(merged, other) - merged_logits).abs().max() > 0


# --- GGUF: the language model + llama.cpp's mmproj ---------------------------------------------------------------

# llama.cpp's own tensor names (tools/mtmd/clip-impl.h: TN_PATCH_EMBD, TN_ATTN_Q, TN_LN_POST, TN_MM_PROJECTOR ...),
# written out here rather than taken from gguf-py's map the exporter uses, each with the weight it must hold
BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2", "ffn_up": "mlp.fc1",
         "ffn_down": "mlp.fc2"}


def llama_cpp_names(tower: str, projector: dict[str, str], blocks: int) -> dict[str, str]:
    """{llama.cpp tensor name: the HF weight it holds} for a SigLIP tower at `tower` and the family's projector."""
    names = {"v.patch_embd.weight": "embeddings.patch_embedding.weight", "v.patch_embd.bias":
             "embeddings.patch_embedding.bias", "v.position_embd.weight": "embeddings.position_embedding.weight",
             "v.post_ln.weight": "post_layernorm.weight", "v.post_ln.bias": "post_layernorm.bias"}
    names.update({f"v.blk.{i}.{ours}.{kind}": f"encoder.layers.{i}.{theirs}.{kind}" for i in range(blocks)
                  for ours, theirs in BLOCK.items() for kind in ("weight", "bias")})
    return {**{k: f"{tower}.{v}" for k, v in names.items()}, **projector}


def read_gguf(path):
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: t for t in reader.tensors}


def check_mmproj(path, model, processor, expected: dict[str, str], projector_type: str, atol: float) -> dict:
    """The mmproj's keys say what clip.cpp needs, and every tensor holds its HF weight (nothing more, nothing less)."""
    import numpy as np

    fields, tensors = read_gguf(path)
    vision = model.config.vision_config
    assert fields["general.architecture"] == "clip" and fields["general.type"] == "mmproj"
    assert fields["clip.projector_type"] == projector_type and fields["clip.has_vision_encoder"] is True
    assert fields["clip.vision.projection_dim"] == model.config.get_text_config().hidden_size
    assert (fields["clip.vision.image_size"], fields["clip.vision.patch_size"], fields["clip.vision.block_count"],
            fields["clip.vision.embedding_length"], fields["clip.vision.feed_forward_length"],
            fields["clip.vision.attention.head_count"]) == (
        vision.image_size, vision.patch_size, vision.num_hidden_layers, vision.hidden_size, vision.intermediate_size,
        vision.num_attention_heads)
    assert fields["clip.vision.image_mean"] == pytest.approx(list(processor.image_processor.image_mean))
    assert fields["clip.vision.image_std"] == pytest.approx(list(processor.image_processor.image_std))
    assert fields["clip.vision.attention.layer_norm_epsilon"] == pytest.approx(vision.layer_norm_eps)
    assert set(tensors) == set(expected)
    state = model.state_dict()
    for name, hf_name in expected.items():
        want = state[hf_name].float().numpy()
        if name == "mm.soft_emb_norm.weight":
            want = want + 1.0  # Gemma 3's norm scales by (1 + w), llama.cpp's by its weight
        got = np.asarray(tensors[name].data, dtype=np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=name)
    return fields


def test_idefics3_exports_its_language_model_and_mmproj_each_read_back(runs, tmp_path):
    """A LoRA run through its recipe (f32), and the merged folder as a full model (f16): llama.cpp's two files."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from finetune.cli import main

    recipe, merged_dir = runs("idefics3")
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    processor = AutoProcessor.from_pretrained(merged_dir)
    expected = llama_cpp_names("model.vision_model", {
        "mm.model.fc.weight": "model.connector.modality_projection.proj.weight"},
        merged.config.vision_config.num_hidden_layers)
    for source, quant, atol in ((recipe, "f32", 0), (merged_dir, "f16", 2e-3)):
        out = tmp_path / f"run.{quant}.gguf"
        assert main(["export", str(source), "--gguf", "--quant", quant, "-o", str(out)]) == 0
        mmproj = tmp_path / f"mmproj-run.{quant}.gguf"
        fields = check_mmproj(mmproj, merged, processor, expected, "idefics3", atol)
        assert fields["clip.vision.projector.scale_factor"] == merged.config.scale_factor
        assert fields["clip.vision.preproc_image_size"] == processor.image_processor.size["longest_edge"]
        _, tensors = read_gguf(mmproj)
        assert tensors["v.blk.0.attn_q.weight"].tensor_type.name == ("F32" if quant == "f32" else "F16")
        assert tensors["v.position_embd.weight"].tensor_type.name == "F32"
        modelfile = out.with_suffix(".Modelfile").read_text().splitlines()
        assert modelfile[1:3] == [f"FROM ./{out.name}", f"FROM ./{mmproj.name}"]  # Ollama: model, then projector
    # the language model's GGUF (f32) gives the merged model's logits on text, read by transformers' GGUF loader
    text = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="run.f32.gguf").eval()
    ids = processor.tokenizer("what colour is the sky", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(logits(text, {"input_ids": ids}), logits(merged, {"input_ids": ids}),
                               rtol=1e-4, atol=1e-4)


def test_gemma3_exports_its_language_model_and_mmproj_each_read_back(runs, tmp_path):
    """The LoRA run through its recipe (f32): the mmproj holds the tower and projector, the language model's GGUF (a
    `gemma3_text`, export/gguf_families.py) gives the merged model's logits on text."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from finetune.cli import main

    recipe, merged_dir = runs("gemma3")
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    processor = AutoProcessor.from_pretrained(merged_dir)
    assert main(["export", str(recipe), "--gguf", "--quant", "f32", "-o", str(tmp_path / "run.gguf")]) == 0
    expected = llama_cpp_names("model.vision_tower", {  # the SigLIP pooling head is not there: llama.cpp skips it
        "mm.input_projection.weight": "model.multi_modal_projector.mm_input_projection_weight",
        "mm.soft_emb_norm.weight": "model.multi_modal_projector.mm_soft_emb_norm.weight"},
        merged.config.vision_config.num_hidden_layers)
    fields = check_mmproj(tmp_path / "mmproj-run.gguf", merged, processor, expected, "gemma3", atol=0)
    # 4 x 4 patches pooled to 2 x 2 soft tokens: llama.cpp assumes 4 unless the file says
    assert fields["clip.vision.projector.scale_factor"] == 2
    # transformers' GGUF loader guesses some of Gemma 3's hyperparameters: given the text config, as llama.cpp reads it
    text = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="run.gguf",
                                                config=merged.config.get_text_config()).eval()
    ids = processor.tokenizer("what colour is the sky", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(logits(text, {"input_ids": ids}), logits(merged, {"input_ids": ids}),
                               rtol=1e-4, atol=1e-4)


def test_a_family_llama_cpp_has_no_mmproj_for_is_one_message_and_nothing_written(runs, tmp_path, capsys):
    from finetune.cli import main

    recipe, _ = runs("llava")
    out = tmp_path / "llava.gguf"
    capsys.readouterr()
    assert main(["export", str(recipe), "--gguf", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "`llava` vision-language model" in err and "finetune merge" in err and "--mmproj" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []
