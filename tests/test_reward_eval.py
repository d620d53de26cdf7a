"""`finetune eval` on a reward run, and the held-out proof: our LoRA reward model and TRL 1.16's RewardTrainer, trained
on the same pairs with the same LoRA and schedule, scored by one independent script (plain transformers, each
sequence alone, TRL's tokenization); ours beats its untrained head and is within noise of TRL's. The report has
both sides' accuracy, the interval, the histograms (scores.png) and the kept pairs; the runs page draws them."""

from __future__ import annotations

import json

import pytest
import torch

from finetune.recipe import load_recipe
from reward_helpers import length_pairs, reward_recipe

N, HELD = 96, 32


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """(folder, recipe, TRL's adapter folder): the same 64 training pairs, 32 held out. Ours trains as the train verb
    does: the recipe's `eval:` evaluates it when training ends."""
    from finetune.commands.train import _train

    folder = tmp_path_factory.mktemp("rm_eval")
    recipe = load_recipe(reward_recipe(folder, tiny_model_dir, n=N, val_set_size=HELD, sample_packing=True,
                                       eval={"generations": 0}))
    assert _train(recipe) == 0
    return folder, recipe, trl_reward_model(folder, recipe, tiny_model_dir)


def held_out(recipe) -> tuple[list[dict], list[dict]]:
    """(train records, held-out records): the recipe's own seeded split."""
    from finetune.data import split

    records = length_pairs(N)
    train, held = split(list(range(N)), recipe)
    return [records[i] for i in train], [records[i] for i in held]


def trl_reward_model(folder, recipe, tiny_model_dir):
    """TRL's RewardTrainer on the same training pairs: the same LoRA (r, alpha, targets, the head saved), learning
    rate, schedule, batch and epochs."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from finetune.compat import quiet_head_swap_report

    train, _ = held_out(recipe)
    args = RewardConfig(output_dir=str(folder / "trl"), report_to="none", use_cpu=True, bf16=False, seed=recipe.seed,
                        learning_rate=recipe.learning_rate, num_train_epochs=recipe.num_epochs,
                        per_device_train_batch_size=recipe.micro_batch_size * 2,  # our packed rows hold ~2 pairs
                        lr_scheduler_type=recipe.lr_scheduler, weight_decay=recipe.weight_decay,
                        max_grad_norm=recipe.max_grad_norm, save_strategy="no", logging_strategy="no")
    torch.manual_seed(recipe.seed)
    with quiet_head_swap_report():
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
    lora = LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=0.0, task_type="SEQ_CLS",
                      target_modules=recipe.lora_target_modules, modules_to_save=["score"])
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(train), peft_config=lora,
                            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    trainer.save_model(str(folder / "trl"))
    return folder / "trl"


def independent_accuracy(base_dir, adapter_dir, pairs) -> float:
    """Pair accuracy by plain transformers: prompt + answer + EOS tokenized whole (TRL's way), each sequence alone in a
    batch of one, the model's own pooled logit. `adapter_dir` None: the base with a new, untrained head."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.compat import quiet_head_swap_report

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    torch.manual_seed(1234)
    with quiet_head_swap_report():
        model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()

    def score(prompt, answer):
        ids = tokenizer(prompt + answer + tokenizer.eos_token, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return model(input_ids=ids).logits[0, 0].item()

    return sum(score(p["prompt"], p["chosen"]) > score(p["prompt"], p["rejected"]) for p in pairs) / len(pairs)


def test_held_out_accuracy_beats_the_untrained_head_and_matches_trl_within_noise(runs, tiny_model_dir):
    folder, recipe, trl_dir = runs
    _, held = held_out(recipe)
    ours = independent_accuracy(tiny_model_dir, folder / "out", held)
    theirs = independent_accuracy(tiny_model_dir, trl_dir, held)
    untrained = independent_accuracy(tiny_model_dir, None, held)
    assert ours >= 0.8 and ours >= untrained + 0.2, (ours, untrained)
    # two standard errors of an accuracy near 0.85 over 32 pairs: 2 x sqrt(0.85 x 0.15 / 32) = 0.13
    assert abs(ours - theirs) <= 0.13, (ours, theirs)


def test_finetune_eval_reports_base_and_tuned_pairs_with_histograms(runs, tiny_model_dir):
    folder, recipe, _ = runs
    report = json.loads((folder / "out" / "eval" / "report.json").read_text())  # the train verb's eval
    reward = report["reward"]
    _, held = held_out(recipe)
    assert reward["pair_count"] == HELD and reward["sides"]["tuned"]["accuracy"] == pytest.approx(
        independent_accuracy(tiny_model_dir, folder / "out", held))  # the scorer reads what plain transformers reads
    assert reward["sides"]["tuned"]["accuracy"] > reward["sides"]["base"]["accuracy"]
    out = folder / "out" / "eval"
    assert (out / "scores.png").is_file() and "scores.png" in (out / "report.md").read_text()
    assert "## Held-out pairs" in (out / "report.md").read_text()
    # run.json keeps the numbers, not the scores
    evaluation = json.loads((folder / "out" / "run.json").read_text())["evaluation"]
    assert set(evaluation["reward"]["sides"]) == {"base", "tuned"} and "scores" not in evaluation["reward"]
    assert reward["difference"]["items"] == HELD and "pair accuracy" in report["verdict"]
    for side in ("base", "tuned"):
        hist = reward["histograms"][side]
        assert sum(hist["chosen"]) == sum(hist["rejected"]) == HELD and len(hist["edges"]) == 21


def test_the_runs_page_shows_the_reward_evaluation_and_its_histograms(runs):
    from finetune.runs.read import read_run

    folder, *_ = runs
    page = read_run(folder / "out", "rm")
    rows = {row[0]: row[1] for row in page["evaluation"]["rows"]}
    assert set(rows["pair accuracy"]) == {"base", "tuned"}
    assert set(page["evaluation"]["histograms"]) == {"base", "tuned"}
    assert "accuracy" in page["curves"] and "eval_margin" in page["curves"]


def test_a_reward_run_refuses_lm_eval_tasks(runs):
    from finetune.errors import FinetuneError
    from finetune.evaluation.run import evaluate

    folder, *_ = runs
    with pytest.raises(FinetuneError, match="does not generate"):
        evaluate(str(folder / "out"), changes={"tasks": ["hellaswag"]})
