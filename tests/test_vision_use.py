"""A vision-language run in use (issue 39 item 6): the recipe's `eval:` section evaluates base and tuned on the
held-out image records when training ends (the same tokens and pixels as the Trainer's eval loss), report.md lists
each generation's images, `finetune generate` / `chat` take `--image PATH` and answer what the model answers to
those pixels, and a wrong input is one message."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import write_jsonl
from finetune.cli import main
from tiny_vision import draw_images, tiny_vlm

COLOURS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 220)}
EVAL = {"generations": 2, "max_new_tokens": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A LoRA run of the tiny LLaVA on 18 colour records with an `eval:` section: 6 held out, evaluated by the
    Trainer in one batch of 6, so its eval loss is the mean over all their supervised tokens, as eval's is."""
    root = tmp_path_factory.mktemp("vision-use")
    images = draw_images(root / "images", COLOURS)
    names = list(COLOURS)
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "path": images[names[i % 3]]},
                                                          {"type": "text", "text": "what colour is it"}]},
                             {"role": "assistant", "content": names[i % 3]}]} for i in range(18)]
    write_jsonl(root / "data.jsonl", records)
    recipe = {"base_model": str(tiny_vlm("llava", tmp_path_factory.getbasetemp())),
              "datasets": [{"path": "data.jsonl", "type": "chat"}], "adapter": "lora", "lora_r": 4,
              "sequence_len": 64, "micro_batch_size": 6, "max_steps": 3, "learning_rate": 2e-2, "val_set_size": 6,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "eval": EVAL}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["train", str(root / "recipe.yml")]) == 0
    return root, images


def test_the_eval_section_of_a_vision_run_is_the_trainers_eval_loss_with_the_pixels(run):
    root, _ = run
    trained = json.loads((root / "out" / "run.json").read_text())
    sides = trained["evaluation"]["heldout"]["sides"]
    # the Trainer's eval batches carry the pixels: the same numbers only if eval's do too
    assert sides["base"]["examples"] == 6
    assert sides["base"]["loss"] == pytest.approx(trained["eval_loss_before"], abs=1e-4)
    assert sides["tuned"]["loss"] == pytest.approx(trained["final_eval_loss"], abs=1e-4)
    assert trained["evaluation"]["generation"]["tuned"]["answers"] == EVAL["generations"]


def test_the_report_lists_each_generations_images(run):
    root, images = run
    report = json.loads((root / "out" / "eval" / "report.json").read_text())
    prompts = report["generation"]["prompts"]
    assert len(prompts) == 2
    for row in prompts:
        assert row["prompt"] == "user: <image 1>what colour is it"
        [path] = row["images"]
        assert path in images.values() or "/cache/" in path  # the records cache may hold the image
        assert row["reference"] in COLOURS
    md = (root / "out" / "eval" / "report.md").read_text()
    for row in prompts:
        name = row["images"][0].rsplit("/", 1)[1]
        assert f"- <image 1>: [{name}](" in md and f"(`{row['images'][0]}`)" in md
    link = md.split(f"[{prompts[0]['images'][0].rsplit('/', 1)[1]}](", 1)[1].split(")", 1)[0]
    assert (root / "out" / "eval" / link).resolve() == __import__("pathlib").Path(prompts[0]["images"][0])


def expected_answer(run, image: str, prompt: str, max_new_tokens: int) -> str:
    """What the adapter answers to `image` + `prompt`, computed here with transformers and peft alone."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    root, _ = run
    out = root / "out"
    processor = AutoProcessor.from_pretrained(out)
    base = json.loads((out / "run.json").read_text())["base_model_path"]
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), str(out)).eval()
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[text], images=[Image.open(image).convert("RGB")], return_tensors="pt",
                       add_special_tokens=False)
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=processor.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def test_generate_with_an_image_answers_what_the_model_answers_to_its_pixels(run, capsys):
    root, images = run
    answers = {}
    for colour in ("red", "blue"):
        capsys.readouterr()
        assert main(["generate", str(root / "recipe.yml"), "--image", images[colour], "--prompt",
                     "what colour is it", "--max-new-tokens", "6"]) == 0
        answers[colour] = capsys.readouterr().out.strip()
        assert answers[colour] == expected_answer(run, images[colour], "what colour is it", 6)
    assert answers["red"] != answers["blue"]  # the image decides the answer


def test_chat_shows_the_images_with_the_first_message(run, capsys, monkeypatch):
    import io

    root, images = run
    monkeypatch.setattr("sys.stdin", io.StringIO("what colour is it\nand now\n/reset\nwhat colour is it\n"))
    assert main(["chat", str(root / "out"), "--image", images["green"], "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    expected = expected_answer(run, images["green"], "what colour is it", 6)
    # after /reset the image goes with the first message again
    assert out.startswith(expected + "\n") and out.endswith("\n" + expected + "\n") and out.count("\n") > 2


def test_image_mistakes_are_one_message_before_any_model_loads(run, tiny_model_dir, tmp_path, capsys):
    root, images = run
    cases = [
        (["generate", str(tiny_model_dir), "--image", images["red"], "--prompt", "hi"], "holds a text model's run"),
        (["generate", str(root / "out"), "--image", str(tmp_path / "nope.png"), "--prompt", "hi"],
         "missing image (no image file at"),
        (["generate", str(root / "out"), "--image", images["red"], "--prompt", "hi", "--raw"], "--image with --raw"),
        (["eval", str(root / "out"), "--gguf", str(tmp_path / "model.gguf")], "transformers loads only the language"),
    ]
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    for argv, message in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
