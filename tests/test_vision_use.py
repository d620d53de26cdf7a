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


# --- a preference run on image pairs ----------------------------------------------------------------------------


def pair_logp(model, processor, prompt: list, response: str, image: str) -> float:
    """log p(response | prompt and its image) under `model`, from the processor's own encoding of the two texts."""
    import torch
    from PIL import Image

    pixels = [Image.open(image).convert("RGB")]
    whole = processor.apply_chat_template(prompt + [{"role": "assistant", "content": response}])
    head = processor.apply_chat_template(prompt, add_generation_prompt=True)
    ids = processor(text=[whole], images=pixels, return_tensors="pt", add_special_tokens=False)
    start = processor(text=[head], images=pixels, return_tensors="pt", add_special_tokens=False)["input_ids"].shape[1]
    with torch.no_grad():
        logps = model(**ids).logits.float()[0, :-1].log_softmax(-1)
    targets = ids["input_ids"][0, 1:]
    token = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    end = targets.shape[0] - int((ids["input_ids"][0] == processor.tokenizer.pad_token_id).sum())
    return float(token[start - 1:end].sum())


def test_a_dpo_run_on_image_pairs_evaluates_its_held_out_pairs_with_their_images(tmp_path_factory):
    """The `eval:` section of DPO on image pairs: each held-out pair's log-probs are the base model's on the
    prompt's pixels (the report lists its image), not a text model's error or the image tokens read as text."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    root = tmp_path_factory.mktemp("vision-dpo-eval")
    images = draw_images(root / "images", COLOURS)
    names = list(COLOURS)
    pairs = [{"prompt": [{"role": "user", "content": [{"type": "image", "path": images[names[i % 3]]},
                                                      {"type": "text", "text": "what colour is it"}]}],
              "chosen": [{"role": "assistant", "content": names[i % 3]}],
              "rejected": [{"role": "assistant", "content": names[(i + 1) % 3]}]} for i in range(12)]
    write_jsonl(root / "pairs.jsonl", pairs)
    base = tiny_vlm("llava", tmp_path_factory.getbasetemp())
    recipe = {"base_model": str(base), "method": "dpo", "datasets": [{"path": "pairs.jsonl", "type": "preference"}],
              "adapter": "lora", "lora_r": 4, "sequence_len": 64, "micro_batch_size": 4, "max_steps": 2,
              "learning_rate": 1e-2, "val_set_size": 4, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "eval": {"generations": 0}}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["train", str(root / "recipe.yml")]) == 0
    report = json.loads((root / "out" / "eval" / "report.json").read_text())
    kept = report["preference"]["pairs"]
    assert report["preference"]["reward"]["pairs"] == 4 and len(kept) == 4
    model = AutoModelForImageTextToText.from_pretrained(base).eval()
    processor = AutoProcessor.from_pretrained(root / "out")
    for pair in kept:
        [image] = pair["images"]
        assert pair["prompt"] == "user: <image 1>what colour is it"
        prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour is it"}]}]
        for kind in ("chosen", "rejected"):
            expected = pair_logp(model, processor, prompt, pair[kind].split(": ", 1)[1], image)
            assert pair["base"][kind] == pytest.approx(expected, abs=1e-3), (kind, image)
    md = (root / "out" / "eval" / "report.md").read_text()
    assert f"- <image 1>: [{kept[0]['images'][0].rsplit('/', 1)[1]}](" in md


# --- the runs page ---------------------------------------------------------------------------------------------

HOSTILE = "<img src=x onerror=window.__pwned=1>.png"  # an image path that would run script if it became markup


@pytest.fixture(scope="module")
def page(run, tmp_path_factory):
    """The runs page of the run, with a third eval sample whose images are a hostile path and a file gone."""
    import shutil

    root, _ = run
    folder = tmp_path_factory.mktemp("vision-page")
    shutil.copytree(root / "out", folder / "out")  # the run's own report stays as eval wrote it
    report_path = folder / "out" / "eval" / "report.json"
    report = json.loads(report_path.read_text())
    extra = {**report["generation"]["prompts"][0], "images": [f"/nowhere/{HOSTILE}", str(root / "gone.png")]}
    report["generation"]["prompts"].append(extra)
    report_path.write_text(json.dumps(report))
    assert main(["runs", str(folder / "out"), "-o", str(folder / "runs.html")]) == 0
    return folder / "runs.html"


def test_the_runs_page_inlines_each_samples_image_as_a_thumbnail(run, page):
    import base64
    import io

    from PIL import Image
    from test_runs import embedded

    _, images = run
    [data] = embedded(page.read_text())["runs"]
    samples = [s for s in data["samples"] if s["source"] == "eval"]
    assert len(samples) == 3
    for sample in samples[:2]:
        [image] = sample["images"]
        assert image["thumbnail"].startswith("data:image/jpeg;base64,")
        thumb = Image.open(io.BytesIO(base64.b64decode(image["thumbnail"].split(",", 1)[1])))
        colour = next(name for name, path in images.items() if path.rsplit("/", 1)[1] == image["path"].rsplit("/", 1)[1])
        assert thumb.size == (20, 16)  # small enough already: kept as it is
        assert all(abs(a - b) < 12 for a, b in zip(thumb.getpixel((10, 8)), COLOURS[colour]))
        assert image["path"].endswith(f"{colour}.png") and sample["reference"] == colour
    assert [i["thumbnail"] for i in samples[2]["images"]] == [None, None]  # no file: the path alone
    assert samples[2]["images"][0]["path"] == f"/nowhere/{HOSTILE}"
    assert "<img" not in page.read_text().split('id="runs-data">', 1)[1].split("</script>", 1)[0]


def test_a_thumbnail_is_at_most_its_edge_and_keeps_the_aspect(tmp_path):
    from PIL import Image

    from finetune.runs.read import THUMBNAIL_EDGE, _images

    path = tmp_path / "wide.png"
    Image.new("RGB", (1200, 300), (10, 20, 30)).save(path)
    budget = [1]
    first, second = _images([str(path), str(path)], budget)
    import base64
    import io

    thumb = Image.open(io.BytesIO(base64.b64decode(first["thumbnail"].split(",", 1)[1])))
    assert thumb.size == (THUMBNAIL_EDGE, THUMBNAIL_EDGE // 4)
    assert second["thumbnail"] is None and budget == [0]  # past the page's budget: the path alone


@pytest.mark.browser
def test_the_page_shows_the_images_beside_their_answers_in_a_browser(page, driver):
    driver.get(page.as_uri())
    shown = driver.execute_script(
        "return Array.from(document.querySelectorAll('#sample-list .sample')).map(s => ({"
        "images: Array.from(s.querySelectorAll('figure img')).map(i => [i.naturalWidth, i.complete]),"
        "captions: Array.from(s.querySelectorAll('figcaption')).map(c => c.textContent),"
        "answers: s.querySelectorAll('pre.answer').length}))")
    eval_samples = shown[:3]
    for sample in eval_samples[:2]:
        assert sample["images"] == [[20, True]] and sample["answers"] == 2  # decoded, beside base and tuned
        assert sample["captions"][0].startswith("<image 1> /")
    assert eval_samples[2]["images"] == [] and eval_samples[2]["captions"][0] == f"<image 1> /nowhere/{HOSTILE}"
    assert driver.execute_script("return window.__pwned") is None
    assert driver.get_log("browser") == []  # no CSP violation: the thumbnails are data: images


from test_runs import driver  # noqa: E402,F401  (the headless Chromium fixture; skips without chromium)
