"""Preference tuning with images (issue 39 item 5): pairs sharing a prompt with images, for each tiny VLM family.

- The scored tokens are the responses exactly as the same pairs without their images give them (the text
  renderer), never an image token; the image tokens sit in the prompts.
- The log-probs read the pixels: they equal a plain forward of the processor's own batch, move when another image
  is shown, and agree unpacked, packed and with pairs sharing their prompt (LLaVA, Idefics3: the families that pack).
- TRL's DPOTrainer with its vision preference collator is the oracle: the same loss and gradients within 1e-5.
- The reference table's key holds the images: the processor's settings and each image's bytes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import write_jsonl
from finetune.contract import IGNORE_INDEX
from test_preference_loss import _assert_same, _backward
from tiny_vision import build_tiny_vlm, draw_images

FAMILIES = ["llava", "idefics3", "gemma3",
            pytest.param("qwen2_vl", marks=pytest.mark.skipif(
                importlib.util.find_spec("torchvision") is None,
                reason="Qwen2-VL's processor needs torchvision (its video processor), not installed here"))]
PACKING = ["llava", "idefics3"]  # the families whose rows may pack (finetune/model/families.py VISION_ROWS)


def user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def pairs(paths: dict) -> list[dict]:
    red, blue = ({"type": "image", "path": paths[c]} for c in ("red", "blue"))
    return [
        {"prompt": [user(red, "what colour")], "chosen": answer("red"), "rejected": answer("blue like the sea")},
        {"prompt": [user("and this", blue), {"role": "assistant", "content": "blue"}, user("now this one", red)],
         "chosen": answer("red again"), "rejected": answer("green")},
        {"prompt": [{"role": "user", "content": "say hi"}], "chosen": answer("hi there"), "rejected": answer("no")},
    ]


def without_images(record: dict) -> dict:
    text = lambda content: content if isinstance(content, str) else "".join(  # noqa: E731
        p["text"] for p in content if p["type"] == "text")
    return {**record, "prompt": [{**m, "content": text(m["content"])} for m in record["prompt"]]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision-pairs")
    # 60 x 40: Idefics3 splits it into 2 x 2 tiles (+ the global image), the others resize or crop it
    paths = draw_images(root / "images", {"red": (230, 20, 20), "blue": (30, 40, 220)}, (60, 40))
    records = pairs(paths)
    write_jsonl(root / "pairs.jsonl", records)
    write_jsonl(root / "text.jsonl", [without_images(r) for r in records])
    return root


@pytest.fixture(scope="module")
def family_dirs(root):
    """family -> (reference, policy): the same tiny VLM built from two seeds (the policy is not the reference)."""
    built = {}

    def get(family):
        if family not in built:
            built[family] = tuple(build_tiny_vlm(family, root / f"{family}-{seed}", seed=seed) for seed in (0, 1))
        return built[family]

    return get


def recipe_for(root: Path, model: Path, data: str = "pairs.jsonl", **keys):
    from finetune.recipe import recipe_from_dict

    return recipe_from_dict({"base_model": str(model), "method": "dpo", "datasets": [{"path": str(root / data),
                             "type": "preference"}], "val_set_size": 0, "sequence_len": 256, "micro_batch_size": 3,
                             "adapter": "none", "cache_dir": str(root / "cache"), "output_dir": str(root / "out"),
                             **keys}, root)


def prepare(root: Path, model: Path, **keys):
    """(recipe, prepared, processor) for the image pairs."""
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor

    recipe = recipe_for(root, model, **keys)
    tokenizer, processor = tokenizer_and_processor(recipe)
    return recipe, build_dataset(recipe, tokenizer, processor), processor


def collator(prepared, processor, share: bool = False):
    from finetune.data.preference.collate import PreferenceCollator
    from finetune.data.vision.collate import Pixels

    return PreferenceCollator(prepared.store, processor.tokenizer.pad_token_id, share_prompt=share,
                              pixels=Pixels(processor, 768 * 768))


def image_ids(processor) -> set[int]:
    """Every token the family adds for images (as tests/test_vision_labels.py counts them)."""
    from test_vision_labels import image_ids as family_ids

    return family_ids(processor)


def load(folder: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)


@pytest.mark.parametrize("family", FAMILIES)
def test_only_response_text_is_scored_exactly_as_without_the_images(family, root, family_dirs):
    from finetune.data.preference.pairs import tokenize_preferences
    from finetune.data.preference.rows import UNPACKED
    from finetune.model.sequence_logps import supervised_targets

    recipe, prepared, processor = prepare(root, family_dirs(family)[0])
    store = prepared.store
    assert [len(parts) for parts in store.images] == [1, 2, 0]  # the prompt's images ride with each pair
    text_items, _ = tokenize_preferences(recipe_for(root, family_dirs(family)[0], "text.jsonl"), processor.tokenizer,
                                         [("preference", str(root / "text.jsonl"))])
    assert store.responses == [item.responses() for item in text_items]  # the responses are text, token for token
    family_ids = image_ids(processor)
    assert all(family_ids & set(store.prompts[i]) for i in (0, 1)) and not family_ids & set(store.prompts[2])
    stats = prepared.stats["train"]
    assert stats["images"] == 3 and stats["image_tokens"] > 0 and prepared.stats["dropped_images"] == {}
    batch = collator(prepared, processor)([{UNPACKED: [i]} for i in range(3)])
    _, _, targets, owner = supervised_targets(batch)
    # every scored token, in order, is a response's: chosen 0..2 then rejected 0..2, none an image token
    assert targets.tolist() == [t for s in range(2) for i in range(3) for t in store.responses[i][s]]
    assert owner.tolist() == [n for n, i in enumerate([0, 1, 2, 0, 1, 2]) for _ in store.responses[i][n // 3]]
    assert not family_ids & set(batch["labels"][batch["labels"] != IGNORE_INDEX].tolist())
    assert "pixel_values" in batch["vision_inputs"]


def test_a_pair_the_processor_cannot_use_is_a_counted_reject(root, family_dirs):
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor

    paths = {c: str(root / "images" / f"{c}.png") for c in ("red", "blue")}
    good = pairs(paths)[0]
    records = [good, {**good, "chosen": answer("see <image> here")},  # LLaVA's placeholder in an answer
               {**good, "prompt": [user({"type": "image", "path": paths["blue"]}, "long " * 300)]}]
    write_jsonl(root / "rejects.jsonl", records)
    recipe = recipe_for(root, family_dirs("llava")[0], "rejects.jsonl", excess_length_strategy="truncate")
    prepared = build_dataset(recipe, *tokenizer_and_processor(recipe))
    # an image prompt is never cut, even under `truncate`: cut inside an image's tokens, features and tokens disagree
    assert prepared.stats["dropped_images"] == {"image_placeholder_mismatch": 1, "too_long_with_images": 1}
    assert prepared.stats["records"] == 3 and len(prepared.store) == 1 and prepared.stats["truncated"] == 0


def test_image_pairs_under_a_text_model_are_one_message(root, tiny_model_dir):
    from finetune.data import build_dataset
    from finetune.errors import DataError
    from finetune.model.loader import load_tokenizer

    recipe = recipe_for(root, tiny_model_dir)
    with pytest.raises(DataError, match=r"pairs.jsonl` holds preference records with images \(the first: record "
                                        r"1\), but the model reads text only"):
        build_dataset(recipe, load_tokenizer(recipe))


def logps_alone(model, processor, prompt: list[int], response: list[int], images: list) -> float:
    """A response's summed log-probs after its prompt, one full forward with the processor's pixels."""
    ids = torch.tensor([prompt + response])
    pixels = processor(images=[images], return_tensors="pt") if images else {}
    text = ("input_ids", "attention_mask", "token_type_ids")  # of the text Gemma 3's processor writes for the images
    inputs = {k: v for k, v in pixels.items() if k in processor.model_input_names and k not in text}
    if "token_type_ids" in processor.model_input_names:
        inputs["token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
    logits = model(input_ids=ids, **inputs).logits[0, :-1].float().log_softmax(-1)
    return logits.gather(-1, ids[0, 1:, None])[len(prompt) - 1:].sum().item()


@pytest.mark.parametrize("family", ["llava", "idefics3", "gemma3"])
def test_log_probs_read_the_pixels_in_every_layout(family, root, family_dirs):
    from finetune.data.preference.rows import PACKED, UNPACKED
    from finetune.data.vision.images import load_image
    from finetune.model.sequence_logps import response_logps
    from finetune.model.varlen_attention import use_varlen_attention

    _, prepared, processor = prepare(root, family_dirs(family)[1])
    store, model = prepared.store, load(family_dirs(family)[1]).eval()
    head = model.get_output_embeddings()
    unpacked = collator(prepared, processor)
    with torch.no_grad():
        logps = response_logps(model, head, unpacked([{UNPACKED: [i]} for i in range(3)]))
        images = [[load_image(p, max_pixels=768 * 768) for p in store.images[i]] for i in range(3)]
        alone = [logps_alone(model, processor, *store.sequences(i)[s], images[i]) for s in (0, 1) for i in range(3)]
        assert logps.tolist() == pytest.approx(alone, abs=1e-4)
        swapped = [list(reversed(parts)) for parts in store.images]  # pair 1 shown its two images the other way round
        store.images, original = swapped, store.images
        moved = response_logps(model, head, unpacked([{UNPACKED: [1]}]))
        store.images = original
        assert (moved - logps[[1, 4]]).abs().min() > 1e-3  # the pixels are read
        if family not in PACKING:
            return
        packed = response_logps(model, head, unpacked([{PACKED: [0, 1, 2]}]))
        assert use_varlen_attention(model)  # the per-example path: a rejected response as a branch of the prompt
        shared = collator(prepared, processor, share=True)([{PACKED: [0, 1, 2]}])
        assert "shared_prompt_tokens" in shared
        shared_logps = response_logps(model, head, shared)
    order = [0, 3, 1, 4, 2, 5]  # packed rows hold each pair's chosen then rejected: the sequences in pair order
    assert packed.tolist() == pytest.approx(logps[order].tolist(), abs=1e-4)
    assert shared_logps.tolist() == pytest.approx(logps[order].tolist(), abs=1e-4)


def trl_rows(records: list[dict]) -> list[dict]:
    """The pairs in TRL's vision preference layout: placeholders in the prompt, the images apart."""
    from PIL import Image

    def placeholders(message):
        content = message["content"]
        if isinstance(content, str):
            return {**message, "content": [{"type": "text", "text": content}]}
        return {**message, "content": [p if p["type"] == "text" else {"type": "image"} for p in content]}

    return [{"prompt": [placeholders(m) for m in r["prompt"]],
             **{side: [placeholders(m) for m in r[side]] for side in ("chosen", "rejected")},
             "images": [Image.open(p["path"]).convert("RGB") for m in r["prompt"] if isinstance(m["content"], list)
                        for p in m["content"] if p["type"] == "image"]} for r in records]


@pytest.mark.parametrize("family", ["llava", "idefics3", "gemma3"])
def test_our_dpo_loss_equals_trl_dpo_trainer_on_the_same_image_pairs(family, root, family_dirs, tmp_path):
    """Our collator, reference table and trainer's compute_loss against TRL's DPOTrainer with
    DataCollatorForVisionPreference and a reference model: loss and every gradient within 1e-5."""
    import json

    from datasets import Dataset
    from transformers import TrainingArguments
    from trl import DPOConfig, DPOTrainer

    from finetune.data.preference.rows import UNPACKED
    from finetune.train.preference.objective import Objective
    from finetune.train.preference.reference import compute_table
    from finetune.train.preference.trainer import PreferenceTrainer

    reference_dir, policy_dir = family_dirs(family)
    recipe, prepared, processor = prepare(root, policy_dir, rl_beta=0.3)
    pairs_collator = collator(prepared, processor)
    reference = load(reference_dir).eval()
    table = compute_table(reference, reference.get_output_embeddings(), pairs_collator, prepared.store, 4096,
                          lambda batch: batch, False, 0, 1)
    model = load(policy_dir).train()
    ours = PreferenceTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "ours"), report_to="none",
                                                                 use_cpu=True),
                             objective=Objective(recipe), store=prepared.store, head=model.get_output_embeddings(),
                             full_logits=False, reference=table, data_collator=pairs_collator,
                             train_dataset=prepared.train)
    batch = pairs_collator([{UNPACKED: [i]} for i in range(3)])
    mine = _backward(model, ours.compute_loss(model, batch))

    records = [json.loads(line) for line in (root / "pairs.jsonl").read_text().splitlines()]
    config = DPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, beta=0.3,
                       gradient_checkpointing=False, max_length=None, per_device_train_batch_size=3)
    trl_model = load(policy_dir).train()
    trainer = DPOTrainer(model=trl_model, ref_model=load(reference_dir), args=config, processing_class=processor,
                         train_dataset=Dataset.from_dict({"prompt": ["-"], "chosen": ["-"], "rejected": ["-"],
                                                          "images": [[]]}))  # not read: the batch is collated below
    trl_batch = trainer.data_collator(trl_rows(records))
    # the same scored tokens: TRL's completion mask, our labels
    assert sorted(trl_batch["input_ids"][trl_batch["completion_mask"].bool()].tolist()) == \
        sorted(batch["labels"][batch["labels"] != IGNORE_INDEX].tolist())
    theirs = _backward(trl_model, trainer.compute_loss(trl_model, trl_batch))
    _assert_same(mine, theirs)
    assert abs(mine[0].item() - 0.6931) > 1e-3  # the policy is not the reference: not the starting value


def test_the_reference_key_holds_the_processor_settings_and_the_image_bytes(root, family_dirs):
    from finetune.train.preference.setup import reference_for

    model = family_dirs("llava")[0]
    recipe, prepared, _ = prepare(root, model)
    _, path, _ = reference_for(recipe, prepared, "fp32", None)
    assert reference_for(recipe, prepare(root, model)[1], "fp32", None)[1] == path  # the same data: the same table
    smaller = prepare(root, model, image_max_pixels=16 * 16)
    assert reference_for(smaller[0], smaller[1], "fp32", None)[1] != path  # the processor's share of the key
    image = root / "images" / "red.png"
    saved = image.read_bytes()
    try:
        from PIL import Image

        Image.new("RGB", (60, 40), (10, 200, 10)).save(image)  # edited in place: the same path, other pixels
        recipe, prepared, _ = prepare(root, model)
        assert reference_for(recipe, prepared, "fp32", None)[1] != path
    finally:
        image.write_bytes(saved)
    from finetune.data.vision.images import images_digest

    # an image in the records cache's store is named by its bytes' sha256: its name is its hash, the file not read
    stored = {"type": "image", "path": str(root / "cache" / "ingested" / "images" / f"{'ab' * 32}.png")}
    assert images_digest([[stored]]) != images_digest([[{**stored, "path": stored["path"].replace("ab", "cd")}]])
    assert images_digest([[{**stored, "path": str(image)}]]) != images_digest([[stored]])


def test_kto_scores_each_mismatched_completion_after_its_own_prompt_and_images(root, family_dirs):
    """KTO's KL batch: each example's prompt, with that prompt's images, then its partner's completion."""
    from finetune.data.preference.rows import UNPACKED
    from finetune.data.vision.images import load_image
    from finetune.model.sequence_logps import response_logps

    model_dir = family_dirs("llava")[1]
    _, prepared, processor = prepare(root, model_dir, method="kto")
    store, model = prepared.store, load(model_dir).eval()
    items = range(len(store))  # every pair is two examples: chosen desirable, rejected undesirable
    batch = collator(prepared, processor)([{UNPACKED: [i]} for i in items])
    assert "pixel_values" in batch["kl"]["vision_inputs"]
    with torch.no_grad():
        kl = response_logps(model, model.get_output_embeddings(), batch["kl"])
        alone = [logps_alone(model, processor, *store.kl_sequences(i)[0],
                             [load_image(p, max_pixels=768 * 768) for p in store.images[i]]) for i in items]
    assert any(store.images[i] != store.images[store.kl_partner[i]] for i in items)  # the partner's images differ
    assert kl.tolist() == pytest.approx(alone, abs=1e-4)
