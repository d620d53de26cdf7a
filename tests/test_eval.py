"""`finetune eval`: base and tuned side by side on a tiny LoRA run: held-out loss on the training's own tokens,
generation checks that catch a model that never ends, an lm-eval task on the adapter offline, the report, the
`eval:` section run when training ends, a GGUF export beside the tuned model, and one message per bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from conftest import make_records, write_jsonl
from finetune.cli import main as cli_main
from finetune.errors import RecipeError
from finetune.recipe import load_recipe

EVAL = {"generations": 2, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    """A LoRA chat run of the tiny model, trained through `finetune train` with an `eval:` section: 16 held-out
    examples evaluated in one batch of 16, so the Trainer's eval loss is the mean over all their tokens too."""
    root = tmp_path_factory.mktemp("evalrun")
    write_jsonl(root / "chat.jsonl", make_records("chat", 48))
    recipe = {"base_model": str(tiny_model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 8, "max_steps": 12, "micro_batch_size": 16, "learning_rate": 3e-2,
              "val_set_size": 16, "output_dir": "out", "cache_dir": "cache", "report_to": ["none"],
              "logging_steps": 4, "eval": EVAL}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli_main(["train", str(root / "recipe.yml")]) == 0
    return root


def _report(folder) -> dict:
    return json.loads((folder / "eval" / "report.json").read_text())


def test_training_with_an_eval_section_evaluates_and_records_it_in_run_json(run):
    record = json.loads((run / "out" / "run.json").read_text())["evaluation"]
    sides = record["heldout"]["sides"]
    assert sides["tuned"]["loss"] < sides["base"]["loss"]
    assert record["generation"]["tuned"]["answers"] == EVAL["generations"]
    assert (run / "out" / "eval" / "report.md").is_file() and (run / "out" / "eval" / "report.png").is_file()


def test_heldout_loss_is_the_trainings_eval_loss_on_the_same_tokens(run):
    """Same tokenization, masking and split as training: the base's loss is the Trainer's eval loss before
    training, the tuned one's its final eval loss (one eval batch, so both are means over the same tokens)."""
    trained = json.loads((run / "out" / "run.json").read_text())
    sides = _report(run / "out")["heldout"]["sides"]
    assert sides["base"]["examples"] == 16
    assert sides["base"]["loss"] == pytest.approx(trained["eval_loss_before"], abs=1e-4)
    assert sides["tuned"]["loss"] == pytest.approx(trained["final_eval_loss"], abs=1e-4)
    assert sides["tuned"]["perplexity"] == pytest.approx(torch.tensor(sides["tuned"]["loss"]).exp().item(), rel=1e-6)


def test_eval_command_prints_the_verdict_and_writes_the_report(run, capsys, tmp_path):
    out = tmp_path / "report"
    assert cli_main(["eval", str(run / "out"), "--generations", "1", "--max-new-tokens", "4", "--out", str(out),
                     "--compare", str(run / "out")]) == 0
    verdict = capsys.readouterr().out.splitlines()[0]
    assert verdict.startswith("tuned is better on held-out loss (")
    assert "; tuned - base -" in verdict and "over 16 examples, 95% interval" in verdict
    report = json.loads((out / "report.json").read_text())
    sides, difference = report["heldout"]["sides"], report["heldout"]["difference"]
    assert difference["mean"] == pytest.approx(sides["tuned"]["loss"] - sides["base"]["loss"])  # per token
    assert difference["high"] < 0 and "per_example" not in sides["base"]
    assert report["verdict"] == verdict and len(report["generation"]["prompts"]) == 1
    md = (out / "report.md").read_text()
    assert "other run:" in md and "| held-out loss |" in md and "**tuned**" in md
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"


def _stop_logit(model, ids: list[int], value: float):
    """Force the logits of `ids` to `value` in every forward pass (a deliberately broken model)."""
    def hook(module, args, output):
        output[..., ids] = value
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def test_generation_check_catches_a_model_that_never_ends(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from finetune.evaluation.generation import generate_checked, summary
    from finetune.model.inference import stop_token_ids

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    stops = stop_token_ids(model, tiny_tokenizer)
    ids = tiny_tokenizer("the cat sat on")["input_ids"]
    handle = _stop_logit(model, stops, float("-inf"))
    never = [generate_checked(model, tiny_tokenizer, ids, 12, seed=0) for _ in range(2)]
    handle.remove()
    assert summary(never)["never_ended"] == 2 and all(c["tokens"] == 12 for c in never)
    handle = _stop_logit(model, stops, float("inf"))  # the control: a model that ends at once, with nothing said
    at_once = generate_checked(model, tiny_tokenizer, ids, 12, seed=0)
    handle.remove()
    assert at_once["ended"] and at_once["empty"] and at_once["tokens"] == 0


def test_loop_detection():
    from finetune.evaluation.generation import loops

    assert loops([5, 6, 7, 8] * 3)
    assert not loops(list(range(40)))
    assert not loops([5, 6, 7, 8] * 2 + [9])


def test_lm_eval_task_runs_on_the_adapter_offline(run, tmp_path, monkeypatch):
    """The shipped tiny_facts task, copied into a task folder of the user's own, run from another folder: its
    relative data file is read beside its YAML; the PeftModel is evaluated as it is, base with the adapter off."""
    from finetune.evaluation.harness import SHIPPED_TASKS

    tasks = tmp_path / "my_tasks"
    shutil.copytree(SHIPPED_TASKS / "tiny_facts", tasks / "facts")
    text = (tasks / "facts" / "tiny_facts.yaml").read_text().replace("task: tiny_facts", "task: my_facts")
    (tasks / "facts" / "tiny_facts.yaml").write_text(text)
    from lm_eval.models.huggingface import HFLM

    given = []
    init = HFLM.__init__

    def spy(self, pretrained, *args, **kwargs):
        given.append(type(pretrained).__name__)
        init(self, pretrained, *args, **kwargs)

    monkeypatch.setattr(HFLM, "__init__", spy)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["eval", str(run / "out"), "--tasks-dir", str(tasks), "--tasks", "my_facts,tiny_facts",
                     "--generations", "0", "--no-heldout-loss", "--task-limit", "4", "--out", "r"]) == 0
    assert given == ["PeftModelForCausalLM"] * 2  # the adapter, unmerged, for base (disabled) and tuned
    bench = json.loads((tmp_path / "r" / "report.json").read_text())["benchmarks"]
    assert set(bench["tasks"]) == {"my_facts", "tiny_facts"}
    for sides in bench["tasks"].values():
        assert set(sides) == {"base", "tuned"} and all(0.0 <= v["acc"] <= 1.0 for v in sides.values())
        assert all(set(v) == {"acc"} for v in sides.values())  # the scores, not lm-eval's bookkeeping
    assert bench["chat_template"] is False
    assert "chat template off" in (tmp_path / "r" / "report.md").read_text()


def test_a_gguf_export_is_evaluated_beside_the_tuned_model(run, capsys, tmp_path):
    assert cli_main(["export", str(run / "out"), "--gguf", "--quant", "f32"]) == 0
    capsys.readouterr()
    try:
        assert cli_main(["eval", str(run / "out"), "--generations", "1", "--max-new-tokens", "4",
                         "--out", str(tmp_path)]) == 0
        report = json.loads((tmp_path / "report.json").read_text())
        sides = report["heldout"]["sides"]
        assert report["gguf"].endswith("out.f32.gguf")
        assert abs(sides["gguf"]["loss"] - sides["tuned"]["loss"]) < 1e-3  # f32: no export drift
        assert report["generation"]["prompts"][0]["gguf"]["answer"] == report["generation"]["prompts"][0]["tuned"]["answer"]
        assert "in held-out loss, 1 of 1 answers the same as the tuned model's" in capsys.readouterr().out
    finally:
        shutil.rmtree(run / "out" / "gguf")


def _refused(argv: list[str], capsys) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_data_of_another_record_shape_is_refused(run, tmp_path, capsys):
    data = write_jsonl(tmp_path / "instr.jsonl", make_records("instruction", 3))
    err = _refused(["eval", str(run / "out"), "--data", str(data)], capsys)
    assert "holds instruction records" in err and "trained on chat records" in err and "--data" in err


def test_a_folder_without_a_trained_model_is_refused(tmp_path, capsys):
    err = _refused(["eval", str(tmp_path)], capsys)
    assert "no trained adapter or model" in err and "finetune train" in err


def test_a_task_folder_without_a_task_is_refused(run, tmp_path, capsys):
    (tmp_path / "notes.yaml").write_text("just: notes\n")
    err = _refused(["eval", str(run / "out"), "--tasks-dir", str(tmp_path)], capsys)
    assert f"no lm-eval task in `{tmp_path}`" in err and "task:" in err


def test_lm_eval_missing_is_one_message_at_validation_and_at_the_command(run, monkeypatch, capsys):
    import finetune.recipe.checks as checks

    monkeypatch.setattr(checks, "lm_eval_missing", lambda: True)
    recipe = yaml.safe_load((run / "recipe.yml").read_text())
    recipe["eval"] = {"tasks": ["tiny_facts"]}
    path = run / "recipe_tasks.yml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "`eval.tasks`" in str(err.value) and "pip install" in str(err.value)
    err = _refused(["eval", str(run / "out"), "--tasks", "tiny_facts"], capsys)
    assert "lm-evaluation-harness is not installed" in err and "pip install" in err


def test_the_eval_section_is_strict(run):
    recipe = yaml.safe_load((run / "recipe.yml").read_text())
    recipe["eval"] = {"generation": 3}
    path = run / "recipe_typo.yml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "`eval.generation`" in str(err.value) and "did you mean `generations`" in str(err.value)
    assert load_recipe(run / "recipe.yml").eval.generations == EVAL["generations"]
    recipe.pop("eval")
    path.write_text(yaml.safe_dump(recipe))
    assert load_recipe(path).eval is None  # nothing runs unless asked


def test_a_dpo_run_reports_reward_accuracy_on_its_held_out_pairs(tmp_path, tiny_model_dir, capsys):
    """Chosen answers all start "yes good", rejected ones "no bad": after a few DPO steps the tuned model,
    against the base as reference, rewards the chosen answer of every held-out pair."""
    import random

    from conftest import sentence

    rng = random.Random(3)
    pairs = [{"prompt": sentence(rng), "chosen": " yes good " + sentence(rng), "rejected": " no bad " + sentence(rng)}
             for _ in range(40)]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    recipe = {"base_model": str(tiny_model_dir), "method": "dpo", "rl_beta": 0.5, "adapter": "lora", "lora_r": 8,
              "datasets": [{"path": "pairs.jsonl", "type": "preference"}], "val_set_size": 8, "max_steps": 8,
              "micro_batch_size": 8, "learning_rate": 2e-2, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "logging_steps": 4}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    assert cli_main(["train", str(tmp_path / "recipe.yml")]) == 0
    assert not (tmp_path / "out" / "eval").exists()  # no `eval:` section: nothing ran
    capsys.readouterr()
    assert cli_main(["eval", str(tmp_path / "recipe.yml"), "--generations", "1", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("reward accuracy 1.000 [1.000, 1.000] on 8 held-out pairs (95% interval; too few")
    pref = _report(tmp_path / "out")["preference"]
    assert pref["reward"]["pairs"] == 8 and pref["reward"]["beta"] == 0.5
    md = (tmp_path / "out" / "eval" / "report.md").read_text()
    assert "| | chosen | rejected | chosen - rejected | chosen preferred |" in md
    tuned = pref["log_prob"]["tuned"]
    assert f"| tuned log-prob (mean) | {tuned['chosen_logp']:.4g} | {tuned['rejected_logp']:.4g} |" in md
    assert f"{tuned['chosen_preferred']:.3f} |" in md  # three digits: 0.625, never 0.62
    assert "### Pair 8" in md and "**chosen** (log-prob base " in md and " yes good " in md  # the pairs, kept
    assert "chosen preferred, tuned - base: " in md
    assert pref["reward"]["reward_accuracy"] == 1.0 and pref["reward"]["reward_margin"] > 0
    assert pref["log_prob"]["tuned"]["logp_margin"] > pref["log_prob"]["base"]["logp_margin"]


def test_reward_metrics_of_the_reference_itself_are_zero():
    from finetune.evaluation.preference import reward_metrics

    logps = [(-3.0, -4.0), (-5.0, -2.0)]
    same = reward_metrics(logps, logps, beta=0.1)
    assert same["reward_accuracy"] == 0.0 and same["reward_margin"] == 0.0
    # pair 1: chosen up by 1 nat (reward +0.1), pair 2: chosen down by 1 nat (-0.1); rejected unchanged
    moved = reward_metrics([(-2.0, -4.0), (-6.0, -2.0)], logps, beta=0.1)
    assert moved["reward_accuracy"] == 0.5 and moved["reward_margin"] == pytest.approx(0.0)
    assert moved["chosen_reward"] == pytest.approx(0.0) and moved["rejected_reward"] == 0.0


def test_a_full_fine_tune_is_compared_with_the_base_it_started_from(tmp_path, make_recipe, capsys):
    """No adapter: the base is loaded from where the run started; an instruction run is prompted with the
    alpaca prompt it trained with."""
    from finetune.train import run_training

    path = make_recipe("instruction", n=24, val_set_size=8, max_steps=6, micro_batch_size=8, learning_rate=3e-3)
    run_training(load_recipe(path))
    capsys.readouterr()
    assert cli_main(["eval", str(path.parent / "out"), "--generations", "1", "--max-new-tokens", "4"]) == 0
    report = _report(path.parent / "out")
    sides = report["heldout"]["sides"]
    assert not report["adapter"] and sides["tuned"]["loss"] < sides["base"]["loss"]
    assert report["prompt_format"].startswith("alpaca")
    assert report["generation"]["prompts"][0]["prompt"].startswith("Below is an instruction")


def test_compare_with_a_run_never_evaluated_is_refused(run, tmp_path, capsys):
    err = _refused(["eval", str(run / "out"), "--compare", str(tmp_path)], capsys)
    assert "no evaluation report" in err and f"finetune eval {tmp_path}" in err


def test_the_verdict_says_when_the_tuned_answers_never_end(run, tmp_path, capsys, monkeypatch):
    """End to end: the run's model with its stop tokens' logits forced to -inf never ends an answer."""
    from finetune.evaluation import subject
    from finetune.model.inference import stop_token_ids

    loaded = subject.Models.__init__

    def broken(self, *args, **kwargs):
        loaded(self, *args, **kwargs)
        _stop_logit(self.tuned, stop_token_ids(self.tuned, self.tokenizer), float("-inf"))

    monkeypatch.setattr(subject.Models, "__init__", broken)
    assert cli_main(["eval", str(run / "out"), "--no-heldout-loss", "--generations", "2", "--max-new-tokens", "5",
                     "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("2 of 2 tuned answers never ended")
    assert (tmp_path / "report.md").read_text().count("never ended") >= 2
