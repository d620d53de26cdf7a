"""TRL's SFTTrainer, with its vision collator, as the loss oracle (issue 39): the same image chats, batched by TRL
(prompt-completion, loss on the completion only) and by finetune (the processor encoder and the pixel collator, the
loss on supervised positions only), give the same loss on the same model, within 1e-5, for each family."""

from __future__ import annotations

import pytest
import torch

from conftest import write_jsonl
from tiny_vision import draw_images, tiny_vlm


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    paths = draw_images(root / "oracle-images", {"red": (230, 20, 20), "blue": (30, 40, 220)}, (60, 40))
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "path": paths[c]},
                                                          {"type": "text", "text": question}]},
                             {"role": "assistant", "content": answer}]}
               for c, question, answer in (("red", "what colour", "red"), ("blue", "and this", "blue like the sea"))]
    records.append({"messages": [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi there"}]})
    return root, records, write_jsonl(root / "oracle.jsonl", records)


def trl_examples(records: list[dict]) -> list[dict]:
    """The records in TRL's prompt-completion layout: the prompt's image parts as placeholders, the images apart."""
    from PIL import Image

    out = []
    for record in records:
        user, assistant = record["messages"]
        parts = user["content"] if isinstance(user["content"], list) else [{"type": "text", "text": user["content"]}]
        out.append({"prompt": [{"role": "user", "content": [{"type": p["type"], **({"text": p["text"]} if p["type"] == "text" else {})} for p in parts]}],
                    "completion": [{"role": "assistant", "content": [{"type": "text", "text": assistant["content"]}]}],
                    "images": [Image.open(p["path"]).convert("RGB") for p in parts if p["type"] == "image"]})
    return out


@pytest.mark.parametrize("family", ["llava", "idefics3", "gemma3"])
def test_our_loss_equals_trl_sfttrainer_on_the_same_batch(chats, tmp_path, family):
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from finetune.data import build_dataset
    from finetune.data.collate import Collator
    from finetune.data.vision.collate import VisionCollator
    from finetune.model import build_model
    from finetune.model.supervised_logits import attach
    from finetune.model.vision import tokenizer_and_processor
    from finetune.recipe import recipe_from_dict

    root, records, path = chats
    recipe = recipe_from_dict({"base_model": str(tiny_vlm(family, root)), "cache_dir": str(tmp_path),
                               "datasets": [{"path": str(path), "type": "chat"}], "adapter": "none"}, tmp_path)
    tokenizer, processor = tokenizer_and_processor(recipe)
    rows = build_dataset(recipe, tokenizer, processor).train
    model, _ = build_model(recipe, tokenizer)
    model.train()

    config = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], completion_only_loss=True, max_length=None,
                       dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False, use_cpu=True)
    from datasets import Dataset

    # the dataset is not read: the batch below goes through TRL's collator directly
    trainer = SFTTrainer(model=model, args=config, processing_class=processor,
                         data_collator=DataCollatorForVisionLanguageModeling(processor, completion_only_loss=True),
                         train_dataset=Dataset.from_dict({"prompt": ["unused"], "completion": ["unused"]}))
    trl_batch = trainer.data_collator(trl_examples(records))
    with torch.no_grad():
        trl_loss = trainer.compute_loss(model, trl_batch).item()

    ours = VisionCollator(Collator(tokenizer.pad_token_id), processor, recipe.image_max_pixels)(
        [rows[i] for i in range(len(rows))])
    assert attach(model) is not None  # the training path: the head on supervised positions only
    with torch.no_grad():
        our_loss = model(**ours).loss.item()
    # the same supervised tokens: TRL masks the prompt (images included), finetune everything but the answers
    assert sorted(ours["labels"][ours["labels"] != -100].tolist()) == \
        sorted(trl_batch["labels"][trl_batch["labels"] != -100].tolist())
    assert our_loss == pytest.approx(trl_loss, abs=1e-5)
