"""LoRA variants through peft (issue 35): DoRA, rsLoRA, PiSSA / OLoRA, LoRA+ each train (the weights move), merge
to a model whose logits are the trained model's (1e-4) and export to GGUF; their recipe keys are checked; the
trainable counts, the memory plan and the LR helper know them; an axolotl DoRA recipe ports and trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import TrainerCallback

from finetune.cli import main as cli_main
from finetune.errors import ModelError, RecipeError
from finetune.recipe import load_recipe
from finetune.train import run_training

PROMPT = "the cat sat on the mat and the dog runs"
LR, RATIO = 2e-2, 16.0
VARIANTS = {
    "dora": {"peft_use_dora": True},
    "rslora": {"peft_use_rslora": True},
    "pissa": {"peft_init_lora_weights": "pissa"},
    "olora": {"peft_init_lora_weights": "olora", "peft_use_rslora": True},
    "loraplus": {"loraplus_lr_ratio": RATIO},
    "eva": {"peft_init_lora_weights": "eva"},
}


class Capture(TrainerCallback):
    """The trained model's logits on PROMPT at the end of training (eval mode: no dropout), the optimizer's groups
    at the start, and the LoRA scale of one layer as the model trains with it."""

    def __init__(self, ids):
        self.ids, self.logits, self.groups, self.names, self.scaling = ids, None, None, {}, None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.groups = [(g.get("initial_lr", g["lr"]), [self.names[id(p)] for p in g["params"]])
                       for g in optimizer.param_groups]
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        self.scaling = layer.scaling["default"]

    def on_train_end(self, args, state, control, model=None, **kwargs):
        was = model.training
        model.eval()
        with torch.no_grad():
            self.logits = model(input_ids=torch.tensor([self.ids])).logits.float().cpu()
        model.train(was)


def _recipe(root: Path, model_dir, **extra) -> Path:
    from conftest import make_records, write_jsonl

    write_jsonl(root / "chat.jsonl", make_records("chat", 8))
    recipe = {"base_model": str(model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 4, "lora_alpha": 8, "max_steps": 3, "micro_batch_size": 4,
              "learning_rate": LR, "precision": "fp32", "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "logging_steps": 1, **extra}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe))
    return root / "recipe.yml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """Each variant trained once: {name: (recipe path, Capture)}."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT)["input_ids"]
    out = {}
    for name, extra in VARIANTS.items():
        recipe = _recipe(tmp_path_factory.mktemp(name), tiny_model_dir, **extra)
        capture = Capture(ids)
        run_training(load_recipe(recipe), extra_callbacks=[capture])
        out[name] = (recipe, capture)
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_trains_and_merges_into_the_model_it_trained(runs, tiny_model_dir, name):
    from transformers import AutoModelForCausalLM

    recipe, capture = runs[name]
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), capture.ids)
    assert (capture.logits - base).abs().max() > 1e-2  # the adapter moved the model
    assert cli_main(["merge", str(recipe)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(recipe.parent / "out" / "merged", dtype=torch.float32)
    # the merged weights (from the ORIGINAL base, as merge always loads it) reproduce the model as it trained
    torch.testing.assert_close(_logits(merged, capture.ids), capture.logits, rtol=1e-4, atol=1e-4)
    assert not any("lora" in n for n, _ in merged.named_parameters())


@pytest.mark.parametrize("name", ["dora", "pissa", "loraplus"])
def test_each_variant_exports_to_gguf_with_the_trained_logits(runs, name, capsys):
    from transformers import AutoModelForCausalLM

    recipe, capture = runs[name]
    capsys.readouterr()
    assert cli_main(["export", str(recipe), "--gguf", "--quant", "f32"]) == 0
    out = Path(capsys.readouterr().out.strip())
    loaded = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, dtype=torch.float32)
    torch.testing.assert_close(_logits(loaded, capture.ids), capture.logits, rtol=1e-4, atol=1e-4)


def test_dora_trains_magnitudes_and_saves_them(runs, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    recipe, _ = runs["dora"]
    folder = recipe.parent / "out"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["use_dora"] is True
    saved = load_file(str(folder / "adapter_model.safetensors"))
    magnitudes = {k: v for k, v in saved.items() if "lora_magnitude_vector" in k}
    assert len(magnitudes) == 14  # 7 Linears x 2 layers, one vector each
    # at init the magnitude is the base weight's row norm; training moved it
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    q = base.model.layers[0].self_attn.q_proj.weight
    key = next(k for k in magnitudes if "layers.0.self_attn.q_proj" in k)
    assert magnitudes[key].shape == (q.shape[0],)
    assert not torch.allclose(magnitudes[key], q.norm(dim=1), atol=1e-4)
    run = json.loads((folder / "run.json").read_text())
    assert run["trainable_parameters"] == 8192 + 1024  # LoRA's A and B at r=4, + 1,024 magnitudes (out features)
    PeftModel.from_pretrained(base, str(folder))  # loads as an ordinary peft adapter


def test_rslora_scales_by_alpha_over_sqrt_r(runs):
    recipe, capture = runs["rslora"]
    assert capture.scaling == pytest.approx(8 / math.sqrt(4))  # 4.0, where plain LoRA's alpha / r is 2.0
    assert runs["dora"][1].scaling == pytest.approx(8 / 4)
    assert json.loads((recipe.parent / "out" / "adapter_config.json").read_text())["use_rslora"] is True


@pytest.mark.parametrize("name", ["pissa", "olora"])
def test_pissa_and_olora_save_a_plain_lora_adapter_for_the_original_base(runs, tiny_model_dir, name):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    recipe, capture = runs[name]
    folder = recipe.parent / "out"
    config = json.loads((folder / "adapter_config.json").read_text())
    # [A | A0], [B | -B0]: rank 2r, alpha doubled (x sqrt 2 under rsLoRA), loaded without touching the base
    assert config["r"] == 8 and config["init_lora_weights"] is True
    assert config["lora_alpha"] == pytest.approx(16 if name == "pissa" else 8 * math.sqrt(2))
    saved = load_file(str(folder / "adapter_model.safetensors"))
    assert all(v.shape[0 if "lora_A" in k else 1] == 8 for k, v in saved.items())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = base.model.layers[0].mlp.down_proj.weight.clone()
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    assert torch.equal(model.base_model.model.model.layers[0].mlp.down_proj.base_layer.weight, before)
    torch.testing.assert_close(_logits(model, capture.ids), capture.logits, rtol=1e-4, atol=1e-4)
    # the checkpoint keeps the adapter as it trained (rank r on the residual base, the init named in its config)
    checkpoint = json.loads(next((folder / "checkpoints").glob("step-*/adapter_config.json")).read_text())
    assert checkpoint["r"] == 4 and checkpoint["init_lora_weights"] == name


def test_eva_starts_from_the_data_and_moves_ranks_between_layers(runs, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    recipe, capture = runs["eva"]
    folder = recipe.parent / "out"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["init_lora_weights"] == "eva" and config["rank_pattern"]  # redistributed from r=4
    assert set(config["rank_pattern"].values()) != {4}
    saved = load_file(str(folder / "adapter_model.safetensors"))
    layer = next(iter(config["rank_pattern"]))
    assert saved[f"base_model.model.{layer}.lora_A.weight"].shape[0] == config["rank_pattern"][layer]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(folder)).eval()
    torch.testing.assert_close(_logits(model, capture.ids), capture.logits, rtol=1e-4, atol=1e-4)


def test_loraplus_gives_the_b_matrices_the_ratio(runs):
    _, capture = runs["loraplus"]
    rates = {}
    for lr, names in capture.groups:
        for n in names:
            rates[n] = lr
    a = [lr for n, lr in rates.items() if "lora_A" in n]
    b = [lr for n, lr in rates.items() if "lora_B" in n]
    assert len(a) == len(b) == 14
    assert set(a) == {LR} and set(b) == {LR * RATIO}
    # without LoRA+ one rate for all
    plain = {lr for lr, names in runs["rslora"][1].groups if names}
    assert plain == {LR}


# --- exact resume -------------------------------------------------------------------------------------------

RESUME = dict(n=14, micro_batch_size=2, gradient_accumulation_steps=2, num_epochs=2, adapter="lora", lora_r=4,
              lora_dropout=0.1, max_checkpoints=1, logging_steps=1, precision="fp32", compile=False)


@pytest.mark.parametrize("variant", [
    {"peft_use_dora": True, "peft_init_lora_weights": "eva", "peft_use_rslora": True, "loraplus_lr_ratio": 4.0},
    {"peft_init_lora_weights": "pissa", "peft_use_rslora": True, "loraplus_lr_ratio": 4.0},
], ids=["dora+eva+rslora+loraplus", "pissa+rslora+loraplus"])
def test_a_killed_run_resumes_exactly(make_recipe, tmp_path, variant):
    """The bar of tests/test_resume.py: SIGKILL mid-step, resume, the same per-step losses, gradient norms and
    final adapter as a run never interrupted (LoRA+'s groups reload in order; PiSSA rebuilds the same residual, EVA
    the same start from the same data)."""
    import signal
    import subprocess
    import sys

    from test_resume import KILLER, adapter, per_step

    settings = {**RESUME, **variant}
    reference = run_training(load_recipe(make_recipe("chat", output_dir="reference", **settings)))
    total = reference["steps"]
    recipe = make_recipe("chat", output_dir="out", **{**settings, "checkpoint_interval": total - 3})
    proc = subprocess.run([sys.executable, str(KILLER), str(recipe), str(total - 1)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    resumed = run_training(load_recipe(recipe))
    assert resumed["resumed_from"] and resumed["steps"] == total
    for (step, loss_a, norm_a), (_, loss_b, norm_b) in zip(per_step(reference), per_step(resumed)):
        assert loss_b == pytest.approx(loss_a, abs=1e-6), step
        assert norm_b == pytest.approx(norm_a, abs=1e-6), step
    final_ref, final_res = adapter(tmp_path / "reference"), adapter(tmp_path / "out")
    assert final_ref.keys() == final_res.keys()
    assert max((final_ref[k] - final_res[k]).abs().max().item() for k in final_ref) <= 1e-6


# --- the recipe's checks --------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings,message", [
    ({"adapter": "none", "peft_use_dora": True}, "`peft_use_dora` is a LoRA setting, but `adapter: none`"),
    ({"peft_init_lora_weights": "eva", "method": "dpo"}, "finetune runs that data pass for `method: sft` only"),
    ({"peft_init_lora_weights": "eva", "deepspeed": "zero3"}, "ZeRO-3 holds weights in shards"),
    ({"peft_init_lora_weights": "loftq"}, "use true, gaussian, pissa, pissa_niter_N or olora"),
    ({"peft_init_lora_weights": False}, "starts B random"),
    ({"peft_init_lora_weights": "pissa_niter_x"}, "e.g. `pissa_niter_4`"),
    ({"adapter": "qlora", "peft_init_lora_weights": "pissa"}, "a 4/8-bit base rounds that residual"),
    ({"peft_init_lora_weights": "olora", "peft_use_dora": True}, "no place for DoRA's magnitudes"),
    ({"peft_init_lora_weights": "pissa", "lora_modules_to_save": ["lm_head"]}, "would drop the modules trained"),
    ({"loraplus_lr_embedding": 1e-5}, "set `loraplus_lr_ratio` too"),
    ({"loraplus_lr_ratio": 16, "deepspeed": "zero2_offload"}, "brings its own optimizer"),
    ({"peft_init_lora_weights": "pissa", "deepspeed": "zero3"}, "ZeRO-3 holds weights in shards"),
])
def test_variant_settings_that_cannot_work_are_refused_with_the_reason(make_recipe, settings, message):
    with pytest.raises(RecipeError) as caught:
        load_recipe(make_recipe(**{"adapter": "lora", **settings}))
    assert message in str(caught.value)


def test_pissa_with_grpos_kl_reference_is_refused(tmp_path, tiny_model_dir):
    from grpo_helpers import grpo_recipe

    path = grpo_recipe(tmp_path, tiny_model_dir, adapter="lora", peft_init_lora_weights="pissa", rl_beta=0.04)
    with pytest.raises(RecipeError, match="under PiSSA is the residual base"):
        load_recipe(path)
    load_recipe(grpo_recipe(tmp_path, tiny_model_dir, adapter="lora", peft_init_lora_weights="pissa", rl_beta=0.0))


def test_the_variants_validate_and_a_refusal_is_one_message(make_recipe, capsys):
    ok = make_recipe(adapter="lora", peft_use_dora=True, peft_use_rslora=True, peft_init_lora_weights="pissa_niter_4",
                     loraplus_lr_ratio=16, loraplus_lr_embedding=1e-6)
    with pytest.raises(RecipeError):  # pissa with dora: one of the refusals
        load_recipe(ok)
    ok = make_recipe(adapter="lora", peft_use_dora=True, peft_use_rslora=True, loraplus_lr_ratio=16,
                     loraplus_lr_embedding=1e-6)
    assert cli_main(["validate", str(ok)]) == 0
    bad = make_recipe(adapter="none", loraplus_lr_ratio=16)
    assert cli_main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "`loraplus_lr_ratio` is a LoRA setting" in err and "Traceback" not in err


# --- counts, plan, LR ---------------------------------------------------------------------------------------

def test_targets_count_doras_magnitudes_as_peft_does(tiny_model_dir, make_recipe, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    peft_count = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    recipe = make_recipe(adapter="lora", lora_r=4, peft_use_dora=True)
    capsys.readouterr()
    assert cli_main(["targets", str(recipe), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    counts = {p["name"]: p["trainable_parameters"] for p in report["presets"]}
    assert report["dora"] is True and counts["recipe"] == counts["all-linear"] == peft_count
    plain = make_recipe(adapter="lora", lora_r=4)
    assert cli_main(["targets", str(plain), "--json"]) == 0
    lora_count = {p["name"]: p["trainable_parameters"] for p in json.loads(capsys.readouterr().out)["presets"]}
    assert counts["recipe"] - lora_count["recipe"] == 1024  # one magnitude per output feature


def test_the_memory_plan_adds_doras_parameters_and_activations(tiny_model_dir):
    from finetune.plan.budget import PlanInputs, plan_memory
    from finetune.plan.model_size import count_model, load_config

    config = load_config(str(tiny_model_dir))
    shape, full, lora = count_model(config, 8, "all-linear")
    _, _, dora = count_model(config, 8, "all-linear", dora=True)
    assert dora.trainable_params - lora.trainable_params == 1024 and dora.trainable_tensors == 3 * 14
    plain = plan_memory(PlanInputs(shape, full, lora, adapter="lora", seq_len=512, micro_batch_size=4))
    with_dora = plan_memory(PlanInputs(shape, full, dora, adapter="lora", seq_len=512, micro_batch_size=4))
    # two (tokens x out_features) tensors per adapted layer in bf16 (+ one layer's rebuilt weights)
    saved = 2 * 1024 * 2 * 512 * 4
    assert with_dora.components["activations"] - plain.components["activations"] >= saved
    assert with_dora.components["optimizer states"] > plain.components["optimizer states"]


def test_lr_helper_names_rsloras_scale_and_loraplus_b_rate(make_recipe):
    from finetune.plan.lr_lora import lora_variant_lines

    recipe = load_recipe(make_recipe(adapter="lora", lora_r=16, lora_alpha=32, peft_use_rslora=True,
                                     loraplus_lr_ratio=16))
    text = "\n".join(lora_variant_lines(recipe, 2e-4))
    assert "alpha/sqrt(r) = 8 instead of alpha/r = 2" in text and "4.00x plain LoRA's" in text
    assert "learning_rate 5.00e-5 would move the weights as plain LoRA at 2.00e-4" in text
    assert "B matrices (and 1-D tensors) at 3.20e-3" in text
    assert lora_variant_lines(load_recipe(make_recipe(adapter="lora")), 2e-4) == []


@pytest.mark.parametrize("keys, line", [
    ({"peft_use_dora": True}, "DoRA: keeps the plain-LoRA learning rate (the DoRA paper's comparison)"),
    ({"peft_init_lora_weights": "pissa"}, "pissa: the adapters start from the weight's decomposition, not at zero; "
                                          "keeps the plain-LoRA learning rate"),
    ({"peft_init_lora_weights": "eva"}, "eva: A starts at the principal directions"),
])
def test_the_variants_log_line_reads_as_a_sentence(make_recipe, keys, line):
    """Issue 43, item 14: the run's log squeezed the table's column away: "DoRA the plain-LoRA learning rate"."""
    from finetune.plan.lr_lora import as_sentence, lora_variant_lines

    lines = lora_variant_lines(load_recipe(make_recipe(adapter="lora", **keys)), 2e-4)
    assert len(lines) == 1 and as_sentence(lines[0]).startswith(line)


# --- port ---------------------------------------------------------------------------------------------------

AXOLOTL_DORA = """
base_model: NousResearch/Meta-Llama-3.1-8B
datasets:
  - path: chat.jsonl
    type: chat_template
val_set_size: 0
output_dir: ./outputs/dora
adapter: lora
lora_r: 8
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
peft_use_dora: true
peft_use_rslora: true
loraplus_lr_ratio: 16
loraplus_lr_embedding: 1e-6
sequence_len: 256
micro_batch_size: 2
gradient_accumulation_steps: 1
num_epochs: 1
optimizer: adamw_torch
learning_rate: 0.0002
bf16: auto
logging_steps: 1
"""


def test_an_axolotl_dora_recipe_ports_with_only_paths_to_fix_and_trains(tmp_path, tiny_model_dir, capsys):
    from conftest import make_records, write_jsonl

    write_jsonl(tmp_path / "chat.jsonl", make_records("chat", 8))
    (tmp_path / "axolotl.yml").write_text(AXOLOTL_DORA)
    out = tmp_path / "recipe.yml"
    code = cli_main(["port", str(tmp_path / "axolotl.yml"), "-o", str(out), "--set", f"base_model={tiny_model_dir}",
                     "--set", "max_steps=2", "--set", "report_to=[none]", "--set", "cache_dir=cache"])
    printed = capsys.readouterr().out
    assert code == 0 and "is a valid finetune recipe" in printed, printed
    ported = yaml.safe_load(out.read_text())
    assert ported["peft_use_dora"] is True and ported["peft_use_rslora"] is True
    assert ported["loraplus_lr_ratio"] == 16 and float(ported["loraplus_lr_embedding"]) == 1e-6
    assert "dropped" not in out.read_text().split("peft_use_dora")[0].splitlines()[-1]
    summary = run_training(load_recipe(out))
    assert summary["steps"] == 2 and summary["recipe"]["peft_use_dora"] is True
    saved = load_file(str(tmp_path / "outputs" / "dora" / "adapter_model.safetensors"))
    assert any("lora_magnitude_vector" in k for k in saved)


# --- LoRA+ under the other trainers, DoRA on a 4-bit base ----------------------------------------------------

class Groups(TrainerCallback):
    """The optimizer's (rate, parameter names) groups as the Trainer built them, and that a B matrix moved."""

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        names = {id(p): n for n, p in model.named_parameters()}
        self.rates = {names[id(p)]: g.get("initial_lr", g["lr"]) for g in optimizer.param_groups for p in g["params"]}
        self.model = model
        self.b_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}

    def b_moved(self) -> bool:
        return any(not torch.equal(p.detach(), self.b_before[n]) for n, p in self.model.named_parameters()
                   if n in self.b_before)


def _ratio_applied(rates: dict, lr: float, ratio: float) -> bool:
    return ({r for n, r in rates.items() if "lora_A" in n} == {lr}
            and {r for n, r in rates.items() if "lora_B" in n} == {lr * ratio})


def test_loraplus_builds_the_same_groups_for_preference_and_grpo_trainers(tmp_path, tiny_model_dir):
    from grpo_helpers import grpo_recipe
    from test_preference_data import dpo_recipe

    dpo = Groups()
    (tmp_path / "dpo").mkdir()
    summary = run_training(dpo_recipe(tmp_path / "dpo", tiny_model_dir, n=16, val_set_size=0, num_epochs=1,
                                      max_steps=2, loraplus_lr_ratio=8.0), extra_callbacks=[dpo])
    assert summary["steps"] == 2 and _ratio_applied(dpo.rates, 2e-3, 8.0) and dpo.b_moved()
    grpo = Groups()
    (tmp_path / "grpo").mkdir()
    summary = run_training(load_recipe(grpo_recipe(tmp_path / "grpo", tiny_model_dir, loraplus_lr_ratio=8.0)),
                           extra_callbacks=[grpo])
    assert summary["steps"] == 2 and _ratio_applied(grpo.rates, 5e-3, 8.0)


def test_dora_on_a_4bit_base_trains_and_merges(tmp_path, tiny_model_dir):
    pytest.importorskip("bitsandbytes")
    from finetune.model.trained import load_adapter_model, locate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = _recipe(tmp_path, tiny_model_dir, adapter="qlora", peft_use_dora=True)
    summary = run_training(load_recipe(recipe))
    assert summary["trainable_parameters"] == 8192 + 1024
    assert cli_main(["merge", str(recipe)]) == 0
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT)["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "merged", dtype=torch.float32)
    adapter_model, _ = load_adapter_model(locate(str(recipe)))  # the adapter on the full-precision base
    want = _logits(adapter_model.eval(), ids)
    torch.testing.assert_close(_logits(merged, ids), want, rtol=1e-4, atol=1e-4)
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), ids)
    assert (want - base).abs().max() > 1e-2


def test_changing_a_variant_refuses_to_resume_the_run(make_recipe):
    from finetune.train.checkpoints import CheckpointError

    recipe = make_recipe("completion", n=8, adapter="lora", lora_r=2, max_steps=2, checkpoint_interval=1)
    run_training(load_recipe(recipe))
    for override, change in (("peft_use_dora=true", "peft_use_dora: False -> True"),
                             ("loraplus_lr_ratio=16", "loraplus_lr_ratio: None -> 16"),
                             ("max_steps=3", None)):
        if change is None:  # the same variants: it resumes
            assert run_training(load_recipe(recipe, [override]))["resumed_from"]
            continue
        with pytest.raises(CheckpointError, match=change.replace("(", r"\(")):
            run_training(load_recipe(recipe, [override, "max_steps=3"]))


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora"])
def test_an_unconverted_pissa_or_olora_adapter_is_refused_where_it_would_give_wrong_numbers(tmp_path, init, capsys):
    """A checkpoint keeps the adapter as it trained (only the final save is converted for the original base):
    `finetune eval` / merge on it would re-decompose the original base, so "base" and "tuned" were both wrong."""
    from finetune.model.trained import locate

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"init_lora_weights": init, "peft_type": "LORA",
                                                                "base_model_name_or_path": str(tmp_path)}))
    with pytest.raises(ModelError, match="Only the run's final adapter is converted"):
        locate(str(folder))
    assert cli_main(["eval", str(folder)]) == 2
    assert "finish the run" in capsys.readouterr().err
    (folder / "adapter_config.json").write_text(json.dumps({"init_lora_weights": True, "peft_type": "LORA",
                                                                "base_model_name_or_path": str(tmp_path)}))
    assert locate(str(folder)).is_adapter  # a converted (final) adapter is found as before


def test_the_final_pissa_adapter_is_not_refused(runs):
    from finetune.model.trained import locate

    recipe, _ = runs["pissa"]
    assert locate(str(recipe.parent / "out")).is_adapter
