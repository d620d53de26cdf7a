"""Preference data and the run around it: one render split at the generation prompt (token-prefix checked, one
BOS, the end-of-turn supervised), truncation that cuts only the prompt's start, the wrong record shape refused,
a short DPO run that learns held-out pairs, and the reference being the model the run starts from: an SFT
adapter the DPO run continues, not the base with the adapter switched off."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from conftest import sentence, write_jsonl
from finetune.contract import CHATML_TEMPLATE
from finetune.data.preference.pairs import Renderer, fit
from finetune.errors import DataError
from finetune.recipe import load_recipe


def chat_pair(rng, prefix_chosen="yes", prefix_rejected="no") -> dict:
    return {"prompt": [{"role": "system", "content": sentence(rng)}, {"role": "user", "content": sentence(rng)}],
            "chosen": [{"role": "assistant", "content": f"{prefix_chosen} {sentence(rng)}"}],
            "rejected": [{"role": "assistant", "content": f"{prefix_rejected} {sentence(rng)}"}]}


def test_chat_pair_is_one_render_split_at_the_generation_prompt(tiny_tokenizer):
    rng = random.Random(0)
    pair = chat_pair(rng)
    prompt_ids, (chosen, rejected) = Renderer(tiny_tokenizer).encode(pair["prompt"], [pair["chosen"], pair["rejected"]])
    for response, answer in ((chosen, pair["chosen"]), (rejected, pair["rejected"])):
        whole = tiny_tokenizer.apply_chat_template(pair["prompt"] + answer, tokenize=False)
        assert prompt_ids + response == tiny_tokenizer(whole, add_special_tokens=False)["input_ids"]
        # the response is the answer and the end of its turn, supervised
        assert tiny_tokenizer.decode(response).startswith(answer[0]["content"][:3])
        assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") in response
    assert tiny_tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")


def test_exactly_one_bos_when_the_template_writes_it(tiny_tokenizer):
    tokenizer = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    tokenizer.chat_template = "{{ bos_token }}" + CHATML_TEMPLATE
    pair = chat_pair(random.Random(1))
    prompt_ids, responses = Renderer(tokenizer).encode(pair["prompt"], [pair["chosen"], pair["rejected"]])
    for response in responses:
        assert (prompt_ids + response).count(tokenizer.bos_token_id) == 1 and prompt_ids[0] == tokenizer.bos_token_id


def test_a_template_that_renders_the_prompt_differently_is_refused(tiny_tokenizer):
    tokenizer = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    # the generation prompt says "assistant", the rendered turn "bot": no split point exists
    tokenizer.chat_template = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>bot\n'")
    assert "bot" in tokenizer.chat_template
    pair = chat_pair(random.Random(2))
    with pytest.raises(DataError, match="renders the prompt differently"):
        Renderer(tokenizer).encode(pair["prompt"], [pair["chosen"]])


class _Recipe:
    def __init__(self, sequence_len, strategy):
        self.sequence_len, self.excess_length_strategy = sequence_len, strategy


def test_truncation_cuts_the_prompt_start_keeps_bos_and_header():
    prompt, responses = [1] + list(range(10, 30)), [[5] * 6, [6] * 8]  # BOS=1, 21-token prompt, longest answer 8
    kept, what = fit(prompt, responses, _Recipe(20, "truncate"), header=3, bos=1)
    assert what == "truncated" and len(kept) + 8 == 20 and kept[0] == 1 and kept[1:] == prompt[-11:]
    assert fit(prompt, responses, _Recipe(20, "drop"), 3, 1) == (None, "too_long")
    assert fit(prompt, [[5] * 18], _Recipe(20, "truncate"), header=3, bos=1) == (None, "response_too_long")
    with pytest.raises(DataError, match="sequence_len 20"):
        fit(prompt, responses, _Recipe(20, "error"), 3, 1)
    assert fit(prompt[:5], responses, _Recipe(20, "error"), 3, 1) == (prompt[:5], None)


def dpo_recipe(tmp_path, base_model, n=48, **overrides):
    rng = random.Random(0)
    write_jsonl(tmp_path / "pairs.jsonl", [chat_pair(rng) for _ in range(n)])
    recipe = {"base_model": str(base_model), "method": "dpo", "datasets": [{"path": "pairs.jsonl", "type": "preference"}],
              "sequence_len": 128, "micro_batch_size": 4, "num_epochs": 2, "learning_rate": 2e-3, "logging_steps": 1,
              "output_dir": "out", "cache_dir": "cache", "report_to": ["none"], "val_set_size": 12,
              "adapter": "lora", "lora_dropout": 0.0, "max_checkpoints": 1, "precision": "fp32"}
    recipe.update(overrides)
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(path)


def test_sft_records_under_a_preference_method_are_refused(tmp_path, tiny_model_dir):
    rng = random.Random(3)
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": sentence(rng)},
                                                        {"role": "assistant", "content": sentence(rng)}]}])
    recipe = dpo_recipe(tmp_path, tiny_model_dir, datasets=[{"path": "chat.jsonl"}])
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    with pytest.raises(DataError, match="is a chat record; `method: dpo` trains on preference"):
        build_dataset(recipe, load_tokenizer(recipe))


def test_dpo_learns_held_out_pairs(tmp_path, tiny_model_dir):
    from finetune.train.run import run_training

    summary = run_training(dpo_recipe(tmp_path, tiny_model_dir))
    history = summary["log_history"]
    last = [e for e in history if "eval_rewards/accuracies" in e][-1]
    # policy == reference before the first step: every pair's loss is log 2
    assert summary["eval_loss_before"] == pytest.approx(0.693147, abs=1e-5)
    assert last["eval_rewards/accuracies"] > 0.75 and last["eval_loss"] < summary["eval_loss_before"]
    assert last["eval_rewards/margins"] > 0
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["method"] == "dpo" and record["preference"]["settings"]["rl_beta"] == 0.1
    assert record["preference"]["eval_metrics"]["eval_rewards/accuracies"] == last["eval_rewards/accuracies"]


def _sequence_logps(model, tokens):
    """Summed response log-probs of (prompt, response) token lists, one plain forward each."""
    out = []
    with torch.no_grad():
        for prompt, response in tokens:
            ids = torch.tensor([prompt + response])
            logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            targets = ids[0, 1:]
            out.append(logps.gather(-1, targets[:, None])[len(prompt) - 1:].sum().item())
    return out


def test_the_reference_is_the_sft_model_the_run_continues(tmp_path, tiny_model_dir, make_recipe):
    """DPO on top of an SFT LoRA output: the reference is base + SFT adapter (LLaMA-Factory #8974 used the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from finetune.train.preference.reference import reference_path
    from finetune.train.run import run_training

    sft = load_recipe(make_recipe("chat", n=16, adapter="lora", learning_rate=5e-3, num_epochs=3))
    run_training(sft)
    sft_out = tmp_path / "out"
    dpo_dir = tmp_path / "dpo"
    dpo_dir.mkdir()
    recipe = dpo_recipe(dpo_dir, sft_out, n=8, val_set_size=0, num_epochs=1, output_dir=str(tmp_path / "dpo-out"))
    summary = run_training(recipe)
    assert summary["preference"]["reference_pass_s"] is not None
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    prepared = build_dataset(recipe, load_tokenizer(recipe))
    table = torch.load(reference_path(recipe, prepared.key, "fp32"))
    tokens = [seq for item in range(len(prepared.store)) for seq in prepared.store.sequences(item)]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    base_logps = _sequence_logps(base, tokens)
    sft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                          str(sft_out)).eval()
    sft_logps = _sequence_logps(sft_model, tokens)
    assert table.flatten().tolist() == pytest.approx(sft_logps, rel=1e-4, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(sft_logps, base_logps)) > 1e-2  # the adapter matters: not the base
    # the DPO run kept training the SFT adapter: its saved adapter differs from the SFT one, same shapes
    from safetensors.torch import load_file

    before, after = load_file(sft_out / "adapter_model.safetensors"), load_file(tmp_path / "dpo-out" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("method", ["dpo", "kto"])
def test_dataset_exact_deduplication_trains_each_pair_once(tmp_path, tiny_model_dir, method):
    """Issue 33 item 6: axolotl's lora-1b-deduplicate-dpo example lists one dataset twice with
    `dataset_exact_deduplication: true`; every pair must train once (it trained twice), also a pair repeated inside
    one file, and a pair written in another layout (sharegpt turns) that reads as the same canonical pair."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    rng = random.Random(5)
    pairs = [chat_pair(rng) for _ in range(10)]
    write_jsonl(tmp_path / "a.jsonl", pairs + [pairs[0]])
    turns = lambda messages: [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
                               "value": m["content"]} for m in messages]
    write_jsonl(tmp_path / "b.jsonl", [{"conversations": turns(p["prompt"]), "chosen": turns(p["chosen"])[0],
                                        "rejected": turns(p["rejected"])[0]} for p in pairs[:4]])
    datasets = [{"path": "a.jsonl", "type": "preference"}, {"path": "a.jsonl", "type": "preference"},
                {"path": "b.jsonl", "type": "preference"}]
    per_pair = 2 if method == "kto" else 1
    for dedup, records in ((True, 10), (False, 26)):
        (tmp_path / "cache").exists() and __import__("shutil").rmtree(tmp_path / "cache")
        recipe = dpo_recipe(tmp_path, tiny_model_dir, method=method, datasets=datasets, val_set_size=0,
                            dataset_exact_deduplication=dedup)
        stats = build_dataset(recipe, load_tokenizer(recipe)).stats
        assert stats["records"] == records and stats["train"]["examples"] == records * per_pair
        assert stats["dropped_duplicates"] == (16 if dedup else 0)


def test_dataset_exact_deduplication_for_sft_records(make_recipe, tmp_path):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    path = make_recipe("instruction", n=6, dataset_exact_deduplication=True,
                       datasets=[{"path": "instruction.jsonl", "type": "instruction"}] * 2)
    recipe = load_recipe(path)
    stats = build_dataset(recipe, load_tokenizer(recipe)).stats
    assert stats["records"] == 6 and stats["dropped_duplicates"] == 6
    assert [s["records"] for s in stats["sources"]] == [6, 0]
