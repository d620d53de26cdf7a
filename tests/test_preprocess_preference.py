"""`finetune preprocess` on preference recipes: the counts training sees, and --show N with each response's
supervised span marked (issue 21, item 3)."""

from __future__ import annotations

import random
import re

import yaml
from conftest import sentence, write_jsonl
from test_preference_data import chat_pair

from finetune.cli import main
from finetune.data import build_dataset
from finetune.model.loader import load_tokenizer
from finetune.recipe import load_recipe


def _recipe(tmp_path, tiny_model_dir, records, **overrides):
    write_jsonl(tmp_path / "pairs.jsonl", records)
    recipe = {"base_model": str(tiny_model_dir), "method": "dpo", "sequence_len": 96, "val_set_size": 2,
              "datasets": [{"path": "pairs.jsonl"}], "output_dir": "out", "cache_dir": "cache",
              "excess_length_strategy": "truncate", **overrides}
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_preprocess_counts_and_shows_each_pair_with_its_supervised_responses(tmp_path, tiny_model_dir, capsys):
    rng = random.Random(5)
    pairs = [chat_pair(rng) for _ in range(10)]
    pairs[0]["prompt"][1]["content"] = " ".join(sentence(rng) for _ in range(40))  # far over sequence_len
    path = _recipe(tmp_path, tiny_model_dir, pairs)
    assert main(["preprocess", str(path), "--show", "3"]) == 0
    out = capsys.readouterr().out
    recipe = load_recipe(path)
    tokenizer = load_tokenizer(recipe)
    prepared = build_dataset(recipe, tokenizer)  # the cache preprocess built: what training reads
    stats = prepared.stats
    assert prepared.reused and stats["truncated"] >= 1
    assert f"train: {stats['train']['examples']} pairs, {stats['train']['tokens']:,} tokens" in out
    assert f"prompts truncated from their start: {stats['truncated']}" in out
    shown = out.split("--- pair ")[1:]
    assert len(shown) == 3
    store = prepared.store
    for item, block in enumerate(shown):
        prompt, (chosen, rejected) = store.prompts[item], store.responses[item]
        text = re.search(r"\[prompt\]\n(.*?)\n\[chosen\]\n", block, re.S).group(1)
        assert text == tokenizer.decode(prompt)
        if tokenizer.bos_token:
            assert text.count(tokenizer.bos_token) == (1 if prompt[0] == tokenizer.bos_token_id else 0)
        for name, response in (("chosen", chosen), ("rejected", rejected)):
            marked = re.search(rf"\[{name}\]\n\[\[(.*?)\]\]\n", block + "\n", re.S).group(1)
            assert marked == tokenizer.decode(response)  # the whole response, and only it, is supervised
    # the truncated prompt lost its start, kept its end: the assistant header the answer follows
    first_prompt = re.search(r"\[prompt\]\n(.*?)\n\[chosen\]", shown[0], re.S).group(1)
    header = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], add_generation_prompt=True,
                                           tokenize=False).split("Q", 1)[1]
    assert first_prompt.endswith(header) and pairs[0]["prompt"][0]["content"] not in first_prompt
    # the end-of-turn token is inside the supervised span
    eot = tokenizer.apply_chat_template([{"role": "assistant", "content": "A"}], tokenize=False).split("A", 1)[1]
    assert f"{eot.strip()}" in re.search(r"\[chosen\]\n\[\[(.*?)\]\]", shown[1], re.S).group(1)


def test_preprocess_shows_kto_examples_with_their_labels(tmp_path, tiny_model_dir, capsys):
    rng = random.Random(6)
    records = [{"prompt": [{"role": "user", "content": sentence(rng)}],
                "completion": [{"role": "assistant", "content": sentence(rng)}], "label": i % 3 != 0}
               for i in range(12)]
    path = _recipe(tmp_path, tiny_model_dir, records, method="kto", sample_packing=True)
    assert main(["preprocess", str(path), "--show", "2"]) == 0
    out = capsys.readouterr().out
    stats = build_dataset(load_recipe(path), load_tokenizer(load_recipe(path))).stats
    train = stats["train"]
    assert (f"train: {train['examples']} examples ({train['desirable']} desirable, {train['undesirable']} "
            "undesirable)") in out
    assert re.search(r"train: packed into \d+ rows of 96 tokens \(\d+% filled\)", out)
    assert out.count("--- example ") == 2
    assert re.search(r"\[completion, (un)?desirable \(label (true|false)\)\]\n\[\[", out)
