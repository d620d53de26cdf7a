"""`method: reward` end to end on the tiny model: a LoRA reward model learns held-out pairs (packed, the prompt held
once), records how it scores, and reloads scoring exactly as it trained (and a copy without its score head, the
naive LoRA save, does not); a full fine-tune saves a sequence classifier; a resumed run matches the uninterrupted one;
the pad = EOS trap; the recipe's checks and the verdicts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from finetune.errors import DataError
from finetune.recipe import load_recipe
from finetune.train.run import run_training
from reward_helpers import reward_recipe


class KeepScores(TrainerCallback):
    """The trained model's scores of the eval pairs, taken in memory when training ends (before any save)."""

    def __init__(self, sequences, pad_id):
        self.sequences, self.pad_id, self.scores = sequences, pad_id, None

    def on_train_end(self, args, state, control, model=None, **kwargs):
        from finetune.model.score_head import sequence_scores
        from finetune.model.scorer import padded_batch

        was = model.training
        model.eval()
        with torch.no_grad():
            self.scores = sequence_scores(model, padded_batch(self.sequences, self.pad_id)).tolist()
        model.train(was)


def eval_sequences(recipe) -> tuple[list[list[int]], object]:
    """(every eval pair's chosen then rejected token ids, the tokenizer)."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    tokenizer = load_tokenizer(recipe)
    store = build_dataset(recipe, tokenizer).store
    return [store.prompts[i] + r for i in store.split_ids("eval") for r in store.responses[i]], tokenizer


def trained(folder, tiny_model_dir, **overrides):
    recipe = load_recipe(reward_recipe(folder, tiny_model_dir, **overrides))
    sequences, tokenizer = eval_sequences(recipe)
    keep = KeepScores(sequences, tokenizer.pad_token_id)
    return recipe, run_training(recipe, extra_callbacks=[keep]), keep


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rm_lora")
    recipe, summary, keep = trained(folder, tiny_model_dir, sample_packing=True, micro_batch_size=2)
    return folder, recipe, summary, keep


def test_a_lora_reward_model_learns_held_out_pairs_and_records_how_it_scores(lora_run):
    folder, recipe, summary, _ = lora_run
    evals = [e for e in summary["log_history"] if "eval_accuracy" in e]
    assert evals[-1]["eval_accuracy"] >= 0.75 and evals[-1]["eval_margin"] > evals[0]["eval_margin"] > 0
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] < summary["eval_loss_before"]
    trains = [e for e in summary["log_history"] if "accuracy" in e and "loss" in e]
    assert {"margin", "chosen_reward", "rejected_reward", "mean_reward", "min_reward", "max_reward"} <= set(trains[-1])
    record = json.loads((folder / "out" / "run.json").read_text())
    assert record["method"] == "reward" and record["reward"]["shared_prompt"] is True
    assert record["reward"]["scoring"]["conversational"] is False and record["reward"]["scoring"]["max_length"] == 48
    assert record["reward"]["settings"] == {"center_rewards_coefficient": 0.0}
    assert record["curves"]["verdict"] != "nothing learned" and "reward_model" in record["curves"]
    # the score head trained in full and is saved with the adapter, beside the LoRA matrices
    config = json.loads((folder / "out" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and "score" in config["modules_to_save"]
    weights = load_file(str(folder / "out" / "adapter_model.safetensors"))
    assert any(k.endswith("score.weight") for k in weights)
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in weights.items())  # B starts at zero: it trained


def test_the_reloaded_reward_model_scores_as_it_trained_and_the_naive_lora_save_does_not(lora_run, tmp_path):
    from finetune.model.scorer import RewardScorer, load_reward_model, read_scoring

    folder, recipe, _, keep = lora_run
    reloaded = RewardScorer.load(folder / "out").score_ids(keep.sequences)
    assert reloaded == pytest.approx(keep.scores, abs=1e-6)
    # the trap (TRL #1379): an adapter saved without the score head (no modules_to_save) reloads a new random head
    naive = tmp_path / "naive"
    shutil.copytree(folder / "out", naive)
    weights = {k: v for k, v in load_file(str(naive / "adapter_model.safetensors")).items() if "score" not in k}
    save_file(weights, str(naive / "adapter_model.safetensors"))
    config = json.loads((naive / "adapter_config.json").read_text())
    config.update(modules_to_save=None, task_type=None)  # a LoRA config that does not name the head
    (naive / "adapter_config.json").write_text(json.dumps(config))
    model, tokenizer = load_reward_model(naive)
    lost = RewardScorer(model.eval(), tokenizer, read_scoring(naive)).score_ids(keep.sequences)
    assert max(abs(a - b) for a, b in zip(lost, keep.scores)) > 0.05


def test_a_full_reward_model_saves_a_sequence_classifier_that_reloads_exactly(tmp_path, tiny_model_dir):
    from finetune.model.scorer import RewardScorer

    _, summary, keep = trained(tmp_path, tiny_model_dir, n=24, adapter="none", max_steps=2, val_set_size=4,
                               learning_rate=1e-4)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1
    assert summary["steps"] == 2
    assert RewardScorer.load(tmp_path / "out").score_ids(keep.sequences) == pytest.approx(keep.scores, abs=1e-6)


# 40 pairs packed (the prompt shared), a row a micro batch, accumulation 2, LoRA dropout drawing from the RNG: the pairs
# a step normalizes by differ from micro batch to micro batch, and the resume must restore the data order, the RNG
# and the optimizer. Resumed from the uninterrupted run's own interval checkpoint into another folder.
RESUME = dict(n=40, val_set_size=0, micro_batch_size=1, gradient_accumulation_steps=2, num_epochs=2, lora_r=4,
              lora_dropout=0.1, sample_packing=True, max_checkpoints=2)


def test_a_resumed_reward_run_matches_the_uninterrupted_one(tmp_path, tiny_model_dir):
    reference = run_training(load_recipe(reward_recipe(tmp_path, tiny_model_dir, output_dir="reference",
                                                       checkpoint_interval=6, **RESUME)))
    total = reference["steps"]
    assert total >= 9 and (tmp_path / "reference" / "checkpoints" / "step-6").is_dir()
    resumed = run_training(load_recipe(reward_recipe(tmp_path, tiny_model_dir, output_dir="resumed",
                                                     checkpoint_interval=6, resume="reference/checkpoints/step-6",
                                                     **RESUME)))
    assert resumed["resumed_from"].endswith("step-6") and resumed["steps"] == total

    def steps(summary):
        return {e["step"]: (e["loss"], e["grad_norm"]) for e in summary["log_history"] if "loss" in e}

    ref, res = steps(reference), steps(resumed)
    assert sorted(res) == list(range(1, total + 1))  # steps 1-6 from the checkpoint's history, 7 on trained again
    for step, (loss, norm) in res.items():
        assert loss == pytest.approx(ref[step][0], abs=1e-6) and norm == pytest.approx(ref[step][1], abs=1e-6), step
    a, b = (load_file(str(tmp_path / name / "adapter_model.safetensors")) for name in ("reference", "resumed"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_pad_equal_to_eos_is_read_where_it_trained_not_where_transformers_pools(tiny_model_dir):
    """The trap (transformers #35352): with pad = EOS, transformers' forward pools at the last token that is not the pad
    token, so a plain-text sequence ending in the EOS it was trained on is read one token early. The score head here
    reads each sequence's last token by position, padded or alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.compat import quiet_head_swap_report
    from finetune.model.score_head import sequence_scores
    from finetune.model.scorer import padded_batch

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    with quiet_head_swap_report():
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).eval()
    model.config.pad_token_id = eos  # pad = EOS, as a tokenizer without a pad token is set up
    sequences = [tokenizer("the cat sat on the mat")["input_ids"] + [eos], tokenizer("a dog")["input_ids"] + [eos]]
    with torch.no_grad():
        ours = sequence_scores(model, padded_batch(sequences, eos)).tolist()
        at_eos = [model.score(model.model(torch.tensor([s])).last_hidden_state)[0, -1, 0].item() for s in sequences]
        naive = model(**{k: v for k, v in padded_batch(sequences, eos).items()
                         if k in ("input_ids", "attention_mask")}).logits[:, 0].tolist()
    assert ours == pytest.approx(at_eos, abs=1e-5)
    assert all(abs(n - o) > 1e-3 for n, o in zip(naive, ours))  # the naive path reads the token before the EOS


def test_reward_recipe_checks(tmp_path, tiny_model_dir):
    from finetune.errors import RecipeError

    with pytest.raises(RecipeError, match="`center_rewards_coefficient` is a setting of method `reward`"):
        load_recipe(reward_recipe(tmp_path, tiny_model_dir, method="dpo", center_rewards_coefficient=0.01))
    with pytest.raises(RecipeError, match="`rl_beta` is a setting of method"):
        load_recipe(reward_recipe(tmp_path, tiny_model_dir, rl_beta=0.1))
    with pytest.raises(RecipeError, match="`rewards` score completions"):
        load_recipe(reward_recipe(tmp_path, tiny_model_dir, rewards=[{"function": "x.py:f"}]))


def test_margins_are_read_per_pair_and_a_bad_margin_names_the_record(tmp_path, tiny_model_dir):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer

    from conftest import write_jsonl
    from reward_helpers import length_pairs

    recipe = load_recipe(reward_recipe(tmp_path, tiny_model_dir, n=8, val_set_size=0))
    pairs = length_pairs(8)
    write_jsonl(tmp_path / "pairs.jsonl", [{**p, "margin": i / 2} if i % 2 else p for i, p in enumerate(pairs)])
    store = build_dataset(recipe, load_tokenizer(recipe)).store
    assert store.margins == [0.0, 0.5, 0.0, 1.5, 0.0, 2.5, 0.0, 3.5]  # a record without one: 0
    write_jsonl(tmp_path / "pairs.jsonl", [{**pairs[0], "margin": "big"}])
    with pytest.raises(DataError, match='"margin" must be a finite number'):
        build_dataset(recipe, load_tokenizer(recipe))


def test_plan_and_lr_know_the_method(tmp_path, tiny_model_dir, capsys):
    """`finetune plan`: a reward model counts its score head (trained in full beside LoRA), no LM head and no logits
    over the vocabulary; `finetune lr`: the method's published defaults."""
    from finetune.cli import main
    from finetune.plan.budget import PlanInputs, plan_memory
    from finetune.plan.model_size import count_model, load_config

    config = load_config(str(tiny_model_dir))
    dpo_shape, _, dpo_lora = count_model(config, 8, "all-linear")
    shape, full, lora = count_model(config, 8, "all-linear", reward=True)
    assert lora.trainable_params == dpo_lora.trainable_params + config.hidden_size  # + the score head (64 -> 1)
    # the whole model: the LM head's vocab x hidden gone, the score head's hidden x 1 in its place
    assert full.trainable_params == dpo_shape.total_params - config.vocab_size * config.hidden_size + config.hidden_size
    assert shape.head_width == 1
    acts = {name: plan_memory(PlanInputs(s, f, lo, adapter="lora", seq_len=512, sequences_per_item=2)
                              ).components["activations"]
            for name, (s, f, lo) in {"dpo": count_model(config), "reward": (shape, full, lora)}.items()}
    assert acts["reward"] < acts["dpo"]  # no 4 x vocab bytes of logits per token
    path = reward_recipe(tmp_path, tiny_model_dir, learning_rate="auto")
    assert main(["plan", str(path), "--no-data"]) == 0
    assert "the score head (hidden -> 1) in place of the LM head" in capsys.readouterr().out
    assert main(["lr", str(path)]) == 0
    out = capsys.readouterr().out
    assert "reward default, LoRA       1.00e-4" in out and "training uses 1.00e-4, the LoRA default" in out
