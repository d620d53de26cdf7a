"""Mixture-of-experts: the layout found from structure, LoRA on fused experts (peft's target_parameters) with the
sizes `finetune targets` prints, routers frozen, the router's aux loss and expert load in the logs, active FLOPs,
merge. The family matrix's tiny models (tests/tiny.py: hidden 32, 4 experts, top-2, 2 layers): qwen3_moe and
gpt_oss trained; mixtral, olmoe, qwen2_moe, deepseek_v3 and a per-expert-Linear toy for structure only."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import yaml

from conftest import make_records, write_jsonl
from finetune.cli import main as cli_main
from finetune.errors import ModelError, RecipeError
from tiny import build_family_model, build_tokenizer, family_config

TRAINED = ("qwen3_moe", "gpt_oss")
_TOKENIZER = []


def moe_config(family: str, **changes):
    """The family matrix's tiny config of `family`, with `changes` set on it."""
    if not _TOKENIZER:
        _TOKENIZER.append(build_tokenizer())
    config = family_config(family, _TOKENIZER[0])
    for key, value in changes.items():
        setattr(config, key, value)
    return config
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def _meta(config):
    from finetune.model.targets import meta_model

    return meta_model(config)


class ToyExpert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)


class ToyBlock(torch.nn.Module):
    """The per-expert layout (transformers 4, models with their own code): a Linear router, a list of experts."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(32, 4, bias=False)
        self.experts = torch.nn.ModuleList([ToyExpert() for _ in range(4)])


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from types import SimpleNamespace

        self.config = SimpleNamespace(num_experts_per_tok=2, get_text_config=lambda: self.config)
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"attn": torch.nn.Linear(32, 32),
                                                                "moe": ToyBlock()}) for _ in range(2)])


@pytest.mark.parametrize("family, width, shared, routers", [  # width: one expert's intermediate size
    ("qwen3_moe", 32, 0, ["mlp.gate"]), ("gpt_oss", 64, 0, ["mlp.router"]), ("mixtral", 64, 0, ["mlp.gate"]),
    ("olmoe", 64, 0, ["mlp.gate"]), ("qwen2_moe", 32, 2 * 3 * 32 * 32, ["mlp.gate", "mlp.shared_expert_gate"]),
    ("deepseek_v3", 32, 3 * 32 * 32, ["mlp.gate"]),  # its first layer is dense: one MoE layer
])
def test_layout_is_found_from_structure(family, width, shared, routers):
    from finetune.model.moe import router_suffixes
    from finetune.plan.moe import moe_layout

    layout = moe_layout(_meta(moe_config(family)))
    assert (layout.num_experts, layout.top_k, layout.fused) == (4, 2, True)
    assert router_suffixes(layout) == routers
    assert [e.suffix for e in layout.experts] == EXPERTS
    layers = 1 if family == "deepseek_v3" else 2
    # gate_up (4 x 2I x H) + down (4 x H x I) with H = 32, I = width
    assert layout.expert_params == layers * 4 * 3 * 32 * width
    assert layout.active_expert_params == layout.expert_params // 2
    assert layout.parameters("shared expert") == shared
    assert layout.parameters("attention") > 0 and layout.parameters("router") > 0


def test_layout_of_per_expert_linear_modules_and_of_a_dense_model():
    from finetune.plan.moe import moe_layout

    layout = moe_layout(Toy())
    assert (layout.num_experts, layout.top_k, layout.fused) == (4, 2, False)
    assert sorted(e.suffix for e in layout.experts) == ["w1", "w2", "w3"]
    assert layout.kind_of("layers.0.moe.gate.weight") == "router"
    assert layout.kind_of("layers.1.moe.experts.3.w2.bias") == "expert"
    assert layout.expert_params == 2 * 4 * 3 * 32 * 16
    from transformers import LlamaConfig

    assert moe_layout(_meta(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, vocab_size=64))) is None


def test_per_expert_linear_adapters_count_as_peft_builds_them():
    from peft import LoraConfig, get_peft_model

    from finetune.model.moe import breakdown

    report = breakdown(Toy(), 4, ["w1", "w2", "w3"])
    peft_model = get_peft_model(Toy(), LoraConfig(r=4, target_modules=["w1", "w2", "w3"]))
    assert report.trainable == peft_model.get_nb_trainable_parameters()[0]
    assert report.row("expert").adapted == report.row("expert").parameters - 2 * 4 * (16 + 32 + 16)  # biases
    assert report.row("router").adapted == 0 and report.expert_share > 0.9


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "mixtral", "qwen2_moe"])
def test_plan_active_flops_per_token_equal_the_forward_count(family):
    """One token's forward, counted by torch's flop counter, = the plan's 2 x active weights + attention."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from finetune.plan.flops import forward_flops_per_token
    from finetune.plan.model_size import model_shape

    torch.manual_seed(0)
    # the eager experts loop multiplies only the experts a token is routed to; the grouped kernels' matmuls are
    # not counted by the flop counter on CPU
    model = AutoModelForCausalLM.from_config(moe_config(family), attn_implementation="eager",
                                             experts_implementation="eager").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.tensor([[5]]))
    shape = model_shape(model)
    assert forward_flops_per_token(shape, 1) == counter.get_total_flops()
    assert shape.active_expert_params == shape.expert_params // 2 > 0  # top-2 of 4


def _recipe(root, family, model_dir, **extra) -> dict:
    write_jsonl(root / "chat.jsonl", make_records("chat", 8))
    recipe = {"base_model": str(model_dir), "datasets": [{"path": "chat.jsonl", "type": "chat"}],
              "adapter": "lora", "lora_r": 4, "lora_dropout": 0, "lora_target_modules": ["q_proj", "v_proj"],
              "lora_target_parameters": EXPERTS, "max_steps": 2, "micro_batch_size": 4,
              "gradient_accumulation_steps": 2, "learning_rate": 2e-2, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "logging_steps": 1, "val_set_size": 0, **extra}
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe))
    return recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per family: the tiny model and a recipe of LoRA on its attention and experts (trained by `runs`)."""
    runs = {}
    for family in TRAINED:
        root = tmp_path_factory.mktemp(family)
        model_dir = build_family_model(family, root / "base", _TOKENIZER[0] if _TOKENIZER else None)
        # gpt_oss has no SDPA path in transformers 5.23 (its attention sinks): eager
        _recipe(root, family, model_dir, **({"attn_implementation": "eager"} if family == "gpt_oss" else {}))
        runs[family] = {"root": root, "base": model_dir}
    return runs


@pytest.fixture(scope="module")
def runs(trained):
    """Each recipe trained (2 steps of 2 micro-batches) and merged, once."""
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    for family, run in trained.items():
        recipe = run["root"] / "recipe.yml"
        run["result"] = run_training(load_recipe(recipe))
        assert cli_main(["merge", str(recipe)]) == 0
    return trained


@pytest.mark.parametrize("family", TRAINED)
def test_adapter_bytes_and_trainable_count_equal_what_targets_printed(runs, family, capsys):
    from safetensors import safe_open

    run = runs[family]
    capsys.readouterr()
    assert cli_main(["targets", str(run["root"] / "recipe.yml"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["recipe"]
    out = run["root"] / "out"
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert sum(t.numel() * t.element_size() for t in tensors.values()) == printed["adapter_bytes"]
    record = json.loads((out / "run.json").read_text())
    assert record["trainable_parameters"] == printed["trainable_parameters"] == sum(
        t.numel() for t in tensors.values())
    rows = {r["kind"]: r for r in printed["rows"]}
    # gpt_oss's expert biases: gate_up (4 x 128) and down (4 x 32) in each layer
    assert rows["expert"]["adapted"] == rows["expert"]["parameters"] - (2 * 4 * 160 if family == "gpt_oss" else 0)
    assert rows["router"]["adapted"] == 0
    # one rank-4 adapter per expert on each fused weight: 4 experts x 4 x (a + b), in both layers; qwen3_moe's
    # gate_up 64 x 32 and down 32 x 32, gpt_oss's (stored in x out) 32 x 128 and 64 x 32
    sides = {"qwen3_moe": (64 + 32) + (32 + 32), "gpt_oss": (32 + 128) + (64 + 32)}[family]
    assert rows["expert"]["lora"] == 2 * 4 * 4 * sides
    assert any("experts" in k and "lora_B" in k and t.abs().sum() > 0 for k, t in tensors.items())  # trained


@pytest.mark.parametrize("family", TRAINED)
def test_router_aux_loss_and_expert_load_are_logged(runs, family):
    logs = [e for e in runs[family]["result"]["log_history"] if "loss" in e]
    assert logs and all("router_aux_loss" in e and "expert_load_min" in e for e in logs)
    for entry in logs:
        # top-2 of 4: each expert takes between none and every token; the mean is 2 / 4
        assert 0 <= entry["expert_load_min"] <= 0.5 <= entry["expert_load_max"] <= 1
        assert entry["router_aux_loss"] > 0


@pytest.mark.parametrize("family", TRAINED)
def test_merge_equals_the_adapter_logits(runs, family):
    from transformers import AutoModelForCausalLM

    from finetune.model.trained import load_adapter_model, locate

    run = runs[family]
    ids = torch.tensor([[5, 9, 17, 33, 60, 101, 7, 12]])
    merged = AutoModelForCausalLM.from_pretrained(run["root"] / "out" / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    adapter, _ = load_adapter_model(locate(str(run["root"] / "recipe.yml")))
    base = AutoModelForCausalLM.from_pretrained(run["base"])
    with torch.no_grad():
        merged_logits, adapter_logits, base_logits = (m(ids).logits for m in (merged, adapter, base))
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=0, atol=1e-5)
    assert (merged_logits - base_logits).abs().max() > 1e-3  # the experts' adapters changed the model


def test_aux_loss_weight_per_micro_batch_and_none_in_evaluation(trained):
    """The step's objective holds coef x the token-weighted mean aux loss, whatever the accumulation: each micro
    batch's term is weighted by its share of the step's supervised tokens, like its cross-entropy."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from finetune.train.callbacks.experts import ExpertMonitor
    from finetune.plan.moe import moe_layout

    model = AutoModelForCausalLM.from_pretrained(trained["qwen3_moe"]["base"])
    ids = torch.randint(1, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :4] = -100
    n = int((labels[:, 1:] != -100).sum())
    model.train()
    with torch.no_grad():
        plain = model(input_ids=ids, labels=labels, num_items_in_batch=3 * n)
        logits = model(input_ids=ids, output_router_logits=True).router_logits
        aux = load_balancing_loss_func(logits, 4, 2)
        monitor = ExpertMonitor(model, moe_layout(model), coefficient=0.5)
        weighted = model(input_ids=ids, labels=labels, num_items_in_batch=3 * n)  # a third of the step's tokens
        torch.testing.assert_close(weighted.loss, plain.loss + 0.5 * aux / 3)
        # evaluation: the cross-entropy alone, also where the config asks for router logits
        model.eval()
        model.config.output_router_logits = True
        torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, model(input_ids=ids, labels=labels,
                                                                                   output_router_logits=False).loss)
    monitor.detach()


@pytest.mark.parametrize("method, coefficient, said", [
    ("sft", 0.001, "router load-balancing loss: 0.001 x aux in the training loss"),
    ("dpo", 0.0, "router load-balancing loss: not in dpo's loss"),
    ("grpo", 0.0, "router load-balancing loss: not in grpo's loss"),
])
def test_the_aux_loss_line_says_what_the_objective_holds(method, coefficient, said, caplog):
    """Preference and GRPO losses are their own, from log-probabilities: the start of their run never says the router's
    aux loss is in them (it is not), and the monitor adds none."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from finetune.train.callbacks.experts import ExpertMonitor

    model = AutoModelForCausalLM.from_config(moe_config("qwen3_moe"))
    with caplog.at_level("INFO", logger="finetune"):
        monitor = ExpertMonitor.attach(model, SimpleNamespace(method=method, router_aux_loss_coef=None))
    assert monitor.coefficient == coefficient and said in caplog.text
    monitor.detach()


def test_all_linear_reaching_no_expert_is_warned_in_targets_and_at_training_start(trained, tmp_path, capsys,
                                                                                  caplog):
    """gpt_oss: its fused experts are out of `all-linear`'s reach (peft maps transformers 4's expert names onto fused
    weights only for the families transformers 5 converts, gpt_oss not among them)."""
    from finetune.model import build_model
    from finetune.recipe import load_recipe

    eager = {"attn_implementation": "eager"}
    _recipe(tmp_path, "gpt_oss", trained["gpt_oss"]["base"], lora_target_modules="all-linear",
            lora_target_parameters=None, lora_dropout=0.05, **eager)
    assert cli_main(["targets", str(tmp_path / "recipe.yml")]) == 0
    out = capsys.readouterr().out
    assert "warning: mixture-of-experts: `lora_target_modules: all-linear` adapts 0.00% of the expert weights" in out
    assert "lora_target_parameters: [mlp.experts.gate_up_proj, mlp.experts.down_proj]" in out
    with caplog.at_level("WARNING", logger="finetune"):
        build_model(load_recipe(tmp_path / "recipe.yml"))
    assert "adapts 0.00% of the expert weights" in caplog.text
    # attention alone is a choice, not a mistake: no warning
    caplog.clear()
    _recipe(tmp_path, "gpt_oss", trained["gpt_oss"]["base"], lora_target_parameters=None, lora_dropout=0.05, **eager)
    with caplog.at_level("WARNING", logger="finetune"):
        build_model(load_recipe(tmp_path / "recipe.yml"))
    assert "expert weights" not in caplog.text


def test_all_linear_on_a_family_peft_converts_reaches_the_experts_and_leaves_the_router(trained, tmp_path, capsys):
    """qwen3_moe: peft 0.21.2 maps `all-linear` onto the fused experts (gate_up_proj at rank 2r) and the router;
    finetune counts what peft builds, keeps the router frozen, and says why dropout cannot stay."""
    from finetune.model import build_model, count_parameters
    from finetune.recipe import load_recipe

    _recipe(tmp_path, "qwen3_moe", trained["qwen3_moe"]["base"], lora_target_modules="all-linear",
            lora_target_parameters=None, lora_dropout=0.05)
    with pytest.raises(ModelError, match="Set `lora_dropout: 0`") as err:
        build_model(load_recipe(tmp_path / "recipe.yml"))
    assert "maps the recipe's module targets onto this model's fused expert weights" in str(err.value)
    _recipe(tmp_path, "qwen3_moe", trained["qwen3_moe"]["base"], lora_target_modules="all-linear",
            lora_target_parameters=None)
    assert cli_main(["targets", str(tmp_path / "recipe.yml"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = build_model(load_recipe(tmp_path / "recipe.yml"))
    # peft's "rank_pattern keys ... ignored" for gate_up_proj's 2r, which it applied (finetune/compat.py)
    assert not [w for w in caught if "did not match any targeted module" in str(w.message)]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert count_parameters(model)[0] == printed["recipe"]["trainable_parameters"]
    assert any("experts" in n for n in names) and not any("mlp.gate" in n for n in names)
    rows = {r["kind"]: r for r in printed["recipe"]["rows"]}
    # rank 2 x 4 on gate_up_proj (transformers 4's gate and up adapters, fused), 4 on down_proj
    assert rows["expert"]["lora"] == 2 * 4 * (8 * (64 + 32) + 4 * (32 + 32)) and rows["router"]["adapted"] == 0
    assert printed["warning"] is None


def test_mlp_names_reaching_only_a_shared_expert_are_warned():
    """axolotl #3514: gate/up/down_proj on a fused-experts model with a shared expert adapt that expert alone."""
    from finetune.model.moe import breakdown, expert_warning

    model = _meta(moe_config("qwen2_moe", num_experts=32))
    report = breakdown(model, 8, ["q_proj", "gate_proj", "up_proj", "down_proj"])
    assert 0 < report.expert_share < 0.05
    assert report.row("shared expert").adapted == report.row("shared expert").parameters
    assert report.row("router").adapted == 0  # shared_expert_gate: a gate, frozen
    assert "of the expert weights" in expert_warning(report, ["q_proj", "gate_proj"], None)
    full = breakdown(model, 8, ["q_proj", "gate_proj", "up_proj", "down_proj"], EXPERTS)
    assert full.expert_share > 0.9 and expert_warning(full, ["q_proj"], EXPERTS) is None


def test_routers_frozen_by_default_and_trained_with_train_router(trained, tmp_path):
    from finetune.model import build_model, count_parameters
    from finetune.model.moe import breakdown
    from finetune.recipe import load_recipe

    base = trained["qwen3_moe"]["base"]
    _recipe(tmp_path, "qwen3_moe", base, adapter="none", lora_target_parameters=None)
    full, _ = build_model(load_recipe(tmp_path / "recipe.yml"))
    grads = {n: p.requires_grad for n, p in full.named_parameters()}
    assert not grads["model.layers.0.mlp.gate.weight"] and grads["model.layers.0.mlp.experts.gate_up_proj"]
    _recipe(tmp_path, "qwen3_moe", base, adapter="none", lora_target_parameters=None, train_router=True)
    full, _ = build_model(load_recipe(tmp_path / "recipe.yml"))
    assert dict(full.named_parameters())["model.layers.0.mlp.gate.weight"].requires_grad
    # with an adapter: each router a trained full copy, counted as targets counts it
    _recipe(tmp_path, "qwen3_moe", base, train_router=True)
    lora, _ = build_model(load_recipe(tmp_path / "recipe.yml"))
    trained_names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert any("mlp.gate.modules_to_save" in n for n in trained_names)
    report = breakdown(_meta(lora.config), 4, ["q_proj", "v_proj"], EXPERTS, train_router=True)
    assert count_parameters(lora)[0] == report.trainable and report.row("router").saved == 2 * 4 * 32


@pytest.mark.parametrize("extra, needle", [
    ({"lora_target_parameters": ["mlp.gate.weight"]}, "name this model's routers (mlp.gate)"),
    ({"lora_target_parameters": ["mlp.experts.up_proj"]}, "mlp.experts.gate_up_proj, mlp.experts.down_proj"),
])
def test_targets_that_name_a_router_or_nothing_are_refused(trained, tmp_path, extra, needle):
    from finetune.model import build_model
    from finetune.recipe import load_recipe

    _recipe(tmp_path, "qwen3_moe", trained["qwen3_moe"]["base"], **extra)
    with pytest.raises(ModelError, match="lora_target_parameters|routers") as err:
        build_model(load_recipe(tmp_path / "recipe.yml"))
    assert needle in str(err.value)


@pytest.mark.parametrize("extra, needle", [
    ({"lora_dropout": 0.05}, "set `lora_dropout: 0`"),
    ({"peft_use_dora": True}, "no DoRA for adapters on parameters"),
    ({"adapter": "none"}, "`lora_target_parameters` is a LoRA setting"),
])
def test_parameter_targets_peft_cannot_build_are_recipe_errors(make_recipe, extra, needle):
    from finetune.recipe import load_recipe

    recipe = make_recipe(**{"adapter": "lora", "lora_dropout": 0, "lora_target_parameters": EXPERTS, **extra})
    with pytest.raises(RecipeError, match="lora_target_parameters") as err:
        load_recipe(recipe)
    assert needle in str(err.value)


def test_planner_counts_the_adapters_peft_builds_and_their_active_share(trained):
    from finetune.model.moe import breakdown
    from finetune.plan.model_size import count_model

    config = moe_config("gpt_oss")
    shape, _, lora = count_model(config, 4, ["q_proj", "v_proj"], None, target_parameters=EXPERTS)
    assert lora.trainable_params == breakdown(_meta(config), 4, ["q_proj", "v_proj"], EXPERTS).trainable
    expert_lora = 2 * 4 * 4 * ((32 + 128) + (64 + 32))
    assert lora.inactive_adapter_params == expert_lora // 2  # top-2 of 4
    assert lora.rebuilt_weight_elements == shape.expert_params


def test_throughput_counts_the_active_adapters_and_weights_and_zero3_gathers_each_moe_block(trained, tmp_path):
    from types import SimpleNamespace

    from deepspeed.utils import get_z3_leaf_modules

    from finetune.model import build_model
    from finetune.model.moe import set_zero3_leaves
    from finetune.plan.model_size import count_model
    from finetune.recipe import load_recipe
    from finetune.train.callbacks.throughput import ThroughputCallback

    _recipe(tmp_path, "qwen3_moe", trained["qwen3_moe"]["base"])
    model, _ = build_model(load_recipe(tmp_path / "recipe.yml"))
    callback = ThroughputCallback()
    callback.on_train_begin(SimpleNamespace(world_size=1, device=torch.device("cpu")), SimpleNamespace(max_steps=2),
                            None, model=model)
    shape, _, lora = count_model(model.config, 4, ["q_proj", "v_proj"], None, target_parameters=EXPERTS)
    # MFU's FLOPs: the token's top-2 experts' adapters and weights, as the planner counts them from the config
    assert callback._lora_params == lora.active_adapter_params < lora.trainable_params
    assert callback._shape.active_matmul_params == shape.active_matmul_params < shape.matmul_params
    blocks = set_zero3_leaves(model)
    assert blocks == [f"base_model.model.model.layers.{i}.mlp" for i in range(2)]
    assert {id(m) for m in get_z3_leaf_modules(model)} == {id(model.get_submodule(b)) for b in blocks}


def test_plan_prints_active_flops_and_counts_the_rebuilt_expert_weights(trained, tmp_path, capsys):
    from finetune.plan.budget import PlanInputs, plan_memory
    from finetune.plan.model_size import count_model

    _recipe(tmp_path, "qwen3_moe", trained["qwen3_moe"]["base"])
    assert cli_main(["plan", str(tmp_path / "recipe.yml"), "--no-data"]) == 0
    assert "of the experts' 24,576 weights the token's top-k use 12,288" in capsys.readouterr().out
    shape, full, lora = count_model(moe_config("qwen3_moe"), 4, ["q_proj"], None, target_parameters=EXPERTS)
    _, _, attention_only = count_model(moe_config("qwen3_moe"), 4, ["q_proj"], None)

    def peak(trainable):
        return plan_memory(PlanInputs(shape, full, trainable, adapter="lora", precision="fp32", optimizer="adamw_torch",
                                      seq_len=64, micro_batch_size=1, gradient_checkpointing="off",
                                      attn="sdpa")).peak_allocated

    # the expert adapters' own states, and every adapted expert weight rebuilt (W + s*B@A) in fp32
    states = (lora.trainable_params - attention_only.trainable_params) * 16
    assert peak(lora) - peak(attention_only) >= states + 4 * shape.expert_params
