"""The family matrix: every row of the family table (finetune/model/families.py) through every method, on a tiny model
of that family built from its transformers config (tests/tiny.py: 2 layers, hidden 32, the tiny tokenizer).

One parametrized test per stage, a row per family; a family joins the matrix by joining the table. Each family's
model is built once, each stage's run once (FamilyRuns), every run in-process with one or two optimizer steps:
    SFT with LoRA, packed: the first step's loss equals the unpacked loss (or packing refused, with the row's reason)
    full fine-tune, one step; resume from its checkpoint: the same weights as the run that never stopped
    DPO: step 1's loss is ln 2 (the policy is its reference)
    GRPO: one step, and its completions scored as each alone would be
    `finetune merge`: the merged model's logits are the adapter's
    `finetune targets` and `finetune plan` on the family's model and recipe
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from conftest import make_records, write_jsonl
from finetune.cli import main as cli_main
from finetune.errors import ModelError
from finetune.model.families import FAMILIES
from finetune.recipe import load_recipe

ROWS = sorted(FAMILIES)
TOLERANCE = 1e-5


def _train(recipe_path: Path, **overrides) -> dict:
    from finetune.train import run_training

    return run_training(load_recipe(recipe_path).model_copy(update=overrides))


def _losses(summary: dict) -> list[float]:
    return [e["loss"] for e in summary["log_history"] if "loss" in e]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    name = "adapter_model.safetensors" if (folder / "adapter_model.safetensors").is_file() else "model.safetensors"
    return load_file(str(folder / name))


class FamilyRuns:
    """Each family's tiny model and each stage's run, made once and on first use (any test order works)."""

    def __init__(self, root: Path):
        from tiny import build_tokenizer

        self.root, self.tokenizer, self.cache = root, build_tokenizer(), {}
        write_jsonl(root / "chat.jsonl", make_records("chat", 6))
        rng_pairs = make_records("chat", 4, seed=1)
        write_jsonl(root / "pairs.jsonl", [{"prompt": r["messages"][:1], "chosen": r["messages"][1:2],
                                            "rejected": r["messages"][3:4]} for r in rng_pairs])
        write_jsonl(root / "prompts.jsonl", [{"prompt": r["messages"][0]["content"]} for r in rng_pairs])
        (root / "rewards.py").write_text("def even(completion_ids, **kwargs):\n"
                                         "    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) "
                                         "for ids in completion_ids]\n")

    def once(self, key, make):
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def model(self, model_type: str) -> Path:
        from tiny import build_family_model

        return self.once(("model", model_type), lambda: build_family_model(
            model_type, self.root / model_type / "base", self.tokenizer))

    def recipe(self, model_type: str, name: str, **keys) -> Path:
        """A recipe in the family's folder: 6 two-turn chats (~30 tokens each), fp32, no eval split, one optimizer step."""
        recipe = {"base_model": str(self.model(model_type)), "datasets": [{"path": str(self.root / "chat.jsonl"),
                  "type": "chat"}], "sequence_len": 512, "micro_batch_size": 6, "max_steps": 1,
                  "learning_rate": 1e-2, "logging_steps": 1, "output_dir": name, "cache_dir": str(self.root / "cache"),
                  "report_to": ["none"], "max_checkpoints": 1, "precision": "fp32", "compile": False,
                  "lora_r": 4, "lora_dropout": 0.0, "val_set_size": 0, **keys}
        path = self.root / model_type / f"{name}.yml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    def sft(self, model_type: str) -> tuple[Path, dict]:
        """LoRA, packed where the family packs: (recipe, summary)."""
        def make():
            packs = not FAMILIES[model_type].packing
            # the 6 chats in one packed row (one micro batch of one row), or one micro batch of 6
            # the loss compared with the unpacked one is the cross-entropy: a mixture-of-experts router's aux loss
            # depends on how tokens are grouped into micro batches (it is tested in tests/test_moe.py)
            path = self.recipe(model_type, "sft", adapter="lora", sample_packing=packs,
                               micro_batch_size=1 if packs else 6, router_aux_loss_coef=0)
            return path, _train(path)
        return self.once(("sft", model_type), make)

    def full(self, model_type: str) -> tuple[Path, dict]:
        """A full fine-tune of two steps, a checkpoint after each: (recipe, summary)."""
        def make():
            path = self.recipe(model_type, "full", adapter="none", max_steps=2, micro_batch_size=4,
                               checkpoint_interval=1, max_checkpoints=2, learning_rate=1e-3)
            return path, _train(path)
        return self.once(("full", model_type), make)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> FamilyRuns:
    """The runs skip drawing loss_curve.png (tests/test_curves.py covers it). What the process holds before them
    (modules, fixtures) is frozen out of the garbage collector's scans by tests/conftest.py: the Trainer collects at
    the end of every run (accelerate's free_memory)."""
    import finetune.train.curves as curves

    def no_plot(log_history, path, diagnosis=None):
        Path(path).touch()
        return Path(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(curves, "plot_curves", no_plot)
        yield FamilyRuns(tmp_path_factory.mktemp("families"))


def unpacked_loss(recipe_path: Path) -> float:
    """The token-mean loss of the base model over the recipe's examples, one padded batch (labels -100 on padding)."""
    from transformers import AutoModelForCausalLM

    from finetune.data import build_dataset
    from finetune.data.collate import Collator
    from finetune.model.loader import load_tokenizer

    recipe = load_recipe(recipe_path).model_copy(update={"sample_packing": False})
    tokenizer = load_tokenizer(recipe)
    rows = list(build_dataset(recipe, tokenizer).train)
    model = AutoModelForCausalLM.from_pretrained(recipe.base_model, dtype=torch.float32)
    batch = Collator(tokenizer.pad_token_id)(rows)
    with torch.no_grad():
        return model(**batch).loss.item()


@pytest.mark.parametrize("model_type", ROWS)
def test_sft_lora_packed_loss_equals_unpacked(runs, model_type):
    row = FAMILIES[model_type]
    if row.packing:  # refused before anything loads, with the row's reason; the run then trains unpacked
        with pytest.raises(ModelError, match="sample_packing` cannot train") as refused:
            _train(runs.recipe(model_type, "refused", adapter="lora", sample_packing=True))
        assert row.packing in str(refused.value)
        assert not (runs.root / model_type / "refused").exists()
    path, summary = runs.sft(model_type)
    assert bool(summary["data"].get("packing", {}).get("train")) is (not row.packing)
    # LoRA's B starts at zero: step 1's loss is the base model's, packed or not
    assert _losses(summary)[0] == pytest.approx(unpacked_loss(path), abs=TOLERANCE)


@pytest.mark.parametrize("model_type", ROWS)
def test_full_finetune_one_step_changes_every_layer(runs, model_type):
    path, summary = runs.full(model_type)
    base = _weights(runs.model(model_type))
    after = _weights(path.parent / "full" / "checkpoints" / "step-1")
    changed = {name for name, tensor in after.items() if not torch.equal(tensor, base[name])}
    for layer in range(2):  # its attention (softmax or linear) and its MLP or experts
        mine = [n.split(f"layers.{layer}.")[1] for n in changed if f"layers.{layer}." in n]
        assert any("attn" in n for n in mine) and any("attn" not in n and "norm" not in n for n in mine), mine
    assert all(math.isfinite(loss) for loss in _losses(summary))


@pytest.mark.parametrize("model_type", ROWS)
def test_resume_from_a_checkpoint_ends_with_the_same_weights(runs, model_type):
    path, whole = runs.full(model_type)
    halves = path.parent / "resumed"
    resumed = _train(path, output_dir=str(halves), resume=str(path.parent / "full" / "checkpoints" / "step-1"))
    assert resumed["resumed_from"].endswith("step-1")
    assert _losses(resumed) == pytest.approx(_losses(whole), abs=1e-6)  # step 1 read back, step 2 trained again
    final, expected = _weights(halves), _weights(path.parent / "full")
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=1e-6)


@pytest.mark.parametrize("model_type", ROWS)
def test_dpo_first_step_loss_is_ln2(runs, model_type):
    packs = not FAMILIES[model_type].packing
    path = runs.recipe(model_type, "dpo", method="dpo", adapter="lora", sample_packing=packs, micro_batch_size=1 if packs else 4,
                       datasets=[{"path": str(runs.root / "pairs.jsonl"), "type": "preference"}])
    assert _losses(_train(path))[0] == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.parametrize("model_type", ROWS)
def test_grpo_one_step(runs, model_type):
    path = runs.recipe(model_type, "grpo", method="grpo", adapter="lora", micro_batch_size=2, num_generations=2,
                       max_completion_length=4, sequence_len=64, rewards=[{"function": str(runs.root / "rewards.py")
                                                                           + ":even"}],
                       datasets=[{"path": str(runs.root / "prompts.jsonl")}])
    summary = _train(path)
    logged = [e for e in summary["log_history"] if "reward" in e]
    assert len(logged) == 1 and math.isfinite(logged[0]["loss"])
    adapter = _weights(path.parent / "grpo")
    assert any(n.endswith("lora_B.weight") and t.abs().max() > 0 for n, t in adapter.items())  # the step trained
    # the rows GRPO scores this family's completions in (packed, or each alone where it does not pack) give the
    # log-probs of each completion after its own prompt, padded: no completion reads another
    from transformers import AutoModelForCausalLM

    from finetune.model.families import packs
    from finetune.train.grpo.scoring import completion_logps, pack_scoring_rows, padded_completion_logps
    from finetune.train.grpo.setup import scoring_capacity

    model = AutoModelForCausalLM.from_pretrained(runs.model(model_type), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    prompts, completions = ([torch.randint(1, 500, (n,), generator=gen).tolist() for n in sizes]
                            for sizes in ((5, 7), (4, 1, 6, 3)))
    rows = pack_scoring_rows(prompts, completions, scoring_capacity(64, packs(model.config)), share_prompt=False)
    with torch.no_grad():
        scored, padded = completion_logps(model, rows), padded_completion_logps(model, prompts, completions)
    assert (scored.logps - padded.logps)[padded.mask].abs().max() < TOLERANCE
    # its rollouts (each prompt prefilled once, its cache held G times; a recurrent cache: G prefills) sample
    # token for token what generate(num_return_sequences=G) samples from the same left-padded prompts
    from test_grpo_rollout import EOS_IDS, PAD, _generate_oracle

    from finetune.train.grpo.generation import generate_completions

    got = generate_completions(model, prompts, 3, 6, seed=1, eos_ids=EOS_IDS, pad_id=PAD)
    assert got.ids == _generate_oracle(model, prompts, 3, 6, seed=1)


@pytest.mark.parametrize("model_type", ROWS)
def test_merge_reproduces_the_adapter_logits(runs, model_type):
    from transformers import AutoModelForCausalLM

    from finetune.model.trained import load_adapter_model, locate

    path, _ = runs.sft(model_type)
    assert cli_main(["merge", str(path)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(path.parent / "sft" / "merged", dtype=torch.float32)
    adapter, _ = load_adapter_model(locate(str(path)), "fp32")
    base = AutoModelForCausalLM.from_pretrained(runs.model(model_type), dtype=torch.float32)
    ids = torch.tensor([runs.tokenizer("the cat sat on the mat and the dog runs")["input_ids"]])
    with torch.no_grad():
        want, got, before = (m.eval()(input_ids=ids).logits for m in (adapter, merged, base))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - before).abs().max() > 1e-4  # the adapter did move the model


def test_docs_models_md_is_current():
    from finetune.commands.models import models_markdown

    docs = Path(__file__).parent.parent / "docs" / "models.md"
    assert docs.read_text() == models_markdown(), "docs/models.md is stale: finetune models --markdown > docs/models.md"


def test_docs_models_md_lists_the_vision_families_too():
    """The refusals send the user to docs/models.md ("lists what each family supports"): a vision-language row is
    there too, with its packing and the reason it is refused."""
    from finetune.model.families import VISION_ROWS

    text = (Path(__file__).parent.parent / "docs" / "models.md").read_text()
    for row in VISION_ROWS:
        line = next((line for line in text.splitlines() if line.startswith(f"| `{row.model_type}` |")), "")
        assert line and (row.packing[:60] in line if row.packing else "| yes |" in line), row.model_type


def test_a_row_says_what_transformers_says_of_the_class():
    """sdpa and flex as transformers' class flags them; moe where the config counts experts."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    for model_type, row in FAMILIES.items():
        config = CONFIG_MAPPING[model_type]()
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        assert (row.sdpa, row.flex) == (cls._supports_sdpa, cls._supports_flex_attn), model_type
        experts = [getattr(config, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts")]
        assert row.moe == any(experts), model_type


def test_a_family_not_in_the_table_trains_unpacked_saying_so_once(runs, caplog):
    model_type = "starcoder2"  # a causal LM transformers ships that the table leaves out
    assert model_type not in FAMILIES
    path = runs.recipe(model_type, "generic", adapter="lora", sample_packing=True)
    summary = _train(path)
    said = [r for r in caplog.records if "not in finetune's family table" in r.getMessage()]
    assert len(said) == 1 and "sample packing" in said[0].getMessage() and said[0].levelname == "WARNING"
    assert not summary["data"].get("packing", {}).get("train") and summary["recipe"]["sample_packing"] is False
    assert _losses(summary)[0] == pytest.approx(unpacked_loss(path), abs=TOLERANCE)


def test_validate_plan_and_preprocess_refuse_what_train_refuses_in_its_words(runs, capsys):
    """Review 1, finding 11: a family that refuses packing (gpt_oss) with `sample_packing: true`: validate exited 0
    and plan planned packed rows while train refused. Each verb now says train's refusal (exit 2); a family with no
    row (starcoder2) is tokenized unpacked, as it trains."""
    refused = runs.recipe("gpt_oss", "packed", adapter="lora", sample_packing=True, attn_implementation="eager")
    with pytest.raises(ModelError) as train_said:
        _train(refused)
    assert FAMILIES["gpt_oss"].packing in str(train_said.value)
    for verb in ("validate", "plan", "preprocess"):
        capsys.readouterr()
        assert cli_main([verb, str(refused)]) == 2, verb
        assert capsys.readouterr().err.strip() == f"error: {train_said.value}", verb
    generic = runs.recipe("starcoder2", "generic_packed", adapter="lora", sample_packing=True)
    capsys.readouterr()
    assert cli_main(["preprocess", str(generic)]) == 0
    out = capsys.readouterr().out
    assert "train: 6 examples" in out and "packed into" not in out


@pytest.mark.parametrize("model_type", ROWS)
def test_targets_and_plan(runs, model_type, capsys):
    path, _ = runs.sft(model_type)
    capsys.readouterr()  # what training printed, when this test is the first to ask for the run
    assert cli_main(["targets", str(runs.model(model_type)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_type"] == model_type and report["presets"]
    assert cli_main(["plan", str(path)]) == 0
    assert "memory" in capsys.readouterr().out.lower()
