"""FSDP2 (`fsdp:`), the second distributed engine beside DeepSpeed ZeRO: the recipe section and its refusals, the
TrainingArguments it resolves to, the memory plan, and axolotl's FSDP recipes ported to it.

On CPU, transformers' Trainer cannot run FSDP: accelerate applies the FSDP plugin only to GPU process groups (a CPU
gloo group stays MULTI_CPU and trains as plain DDP with the plugin ignored; a gloo group without `cpu` is no
distributed run at all and the Trainer refuses with "Using fsdp only works in distributed training"). So here the
resolved configuration and the refusals are tested, and the 2-process run against one process is
tests/test_fsdp_gpu.py (marker `gpu`, needs 2 GPUs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from finetune.cli import main
from finetune.errors import ModelError, RecipeError
from finetune.recipe import load_recipe

# what a CPU refuses; with a GPU visible these runs would start (tests/test_fsdp_gpu.py runs them there)
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@pytest.fixture
def recipe_path(make_recipe):
    return make_recipe("chat", n=16, adapter="lora", lora_r=4, micro_batch_size=2, max_steps=2)


# --- the recipe ---------------------------------------------------------------------------------------------


def test_fsdp_true_is_the_defaults_and_a_resume_setting(recipe_path):
    from finetune.train.checkpoints import FINGERPRINT_FIELDS

    recipe = load_recipe(recipe_path, ["fsdp=true"])
    assert recipe.fsdp.model_dump() == {"reshard_after_forward": True, "offload_params": False,
                                        "state_dict_type": "FULL_STATE_DICT", "transformer_layer_cls_to_wrap": None}
    assert load_recipe(recipe_path, ["fsdp=false"]).fsdp is None
    assert load_recipe(recipe_path).fsdp is None
    assert "fsdp" in FINGERPRINT_FIELDS  # an FSDP checkpoint does not resume without FSDP (nor the reverse)


def test_fsdp_and_deepspeed_together_is_one_message_naming_both(recipe_path):
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe_path, ["fsdp=true", "deepspeed=zero3"], world_size=2)
    lines = [p for p in caught.value.problems if "fsdp" in p]
    assert len(lines) == 1 and "`deepspeed` and `fsdp` are both set" in lines[0]


@pytest.mark.parametrize("overrides, needle", [
    (["adapter=qlora"], "`fsdp` with a quantized base (`adapter: qlora` / `load_in_4bit` / `load_in_8bit`)"),
    (["load_in_8bit=true"], "accelerate leaves bitsandbytes' uint8-packed weights out of FSDP2's sharding"),
    (["compile=true"], "`compile: true` with `fsdp`"),
    (["peft_init_lora_weights=pissa"], "`peft_init_lora_weights: pissa` with `fsdp`"),
    (["peft_init_lora_weights=olora"], "`peft_init_lora_weights: olora` with `fsdp`"),
    (["fsdp.state_dict_type=SHARDED_STATE_DICT", "export_interval=1"],
     "`export_interval` keeps loadable models, but `fsdp.state_dict_type: SHARDED_STATE_DICT`"),
])
def test_conflicting_features_are_refused_with_the_reason(recipe_path, overrides, needle):
    with pytest.raises(RecipeError, match=None) as caught:
        load_recipe(recipe_path, ["fsdp={}", *overrides])
    assert any(needle in p for p in caught.value.problems), caught.value.problems
    without = [o for o in overrides if not o.startswith("fsdp.")]
    if not any(o.startswith(("adapter", "load_in")) for o in without):
        load_recipe(recipe_path, without)  # the same recipe without `fsdp` loads


def test_grpo_and_preference_methods_are_refused_under_fsdp(recipe_path):
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe_path, ["fsdp=true", "method=grpo"])
    assert any("FSDP2 would gather every decoder layer's weights at every generated token" in p
               for p in caught.value.problems)
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe_path, ["fsdp=true", "method=dpo"])
    assert any("`method: dpo` does not run under `fsdp` yet" in p for p in caught.value.problems)


def test_compile_auto_is_off_under_fsdp_with_the_reason(recipe_path):
    from finetune.model.device import Device
    from finetune.model.regional_compile import resolve_compile

    h100 = Device(type="cuda", name="NVIDIA H100", capability=(9, 0))
    assert resolve_compile(load_recipe(recipe_path), h100)[0] is True
    on, reason = resolve_compile(load_recipe(recipe_path, ["fsdp=true"]), h100)
    assert on is False and "off under `fsdp`" in reason


# --- what it resolves to ------------------------------------------------------------------------------------


def fsdp_settings(recipe):
    """The Resolved settings run_training builds for `recipe` on a GPU machine: resolved here without `fsdp` (a CPU
    refuses it) and given the recipe's FSDP2 config, as resolve() sets it."""
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.train.fsdp_config import trainer_fsdp_config
    from finetune.train.launch import start_process_group
    from finetune.train.settings import resolve

    state = start_process_group(recipe, cuda=False)
    plain = recipe.model_copy(update={"fsdp": None})
    settings = resolve(plain, build_dataset(plain, load_tokenizer(plain)), state.num_processes, cuda=False)
    return dataclasses.replace(settings, fsdp=trainer_fsdp_config(recipe))


def fsdp_training_arguments(recipe):
    """TrainingArguments as run_training builds them for `recipe` on a GPU machine."""
    from finetune.train.arguments import training_arguments

    return training_arguments(recipe, fsdp_settings(recipe))


def test_under_fsdp_the_probes_wait_for_the_sharded_model(recipe_path):
    # like ZeRO-3: the model is not moved whole onto each GPU first; the Trainer shards it, then the probes run
    assert fsdp_settings(load_recipe(recipe_path, ["fsdp=true"])).weights_partitioned
    assert not fsdp_settings(load_recipe(recipe_path)).weights_partitioned


def test_fsdp_resolves_to_transformers_fsdp2_plugin(recipe_path):
    from accelerate.utils import FullyShardedDataParallelPlugin

    recipe = load_recipe(recipe_path, ["fsdp.reshard_after_forward=false", "fsdp.offload_params=true",
                                       "fsdp.state_dict_type=SHARDED_STATE_DICT", "gradient_checkpointing=full"])
    args = fsdp_training_arguments(recipe)
    assert args.fsdp is True
    assert args.fsdp_plugin_args == {
        "fsdp_version": 2, "cpu_offload": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "cpu_ram_efficient_loading": False, "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": True,  # `gradient_checkpointing: full`, done by FSDP...
        "reshard_after_forward": False,
    }
    assert args.activation_checkpointing is False  # ...and not a second time by the Trainer (it refuses both)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)  # what Trainer.create_accelerator builds
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.activation_checkpointing is True and plugin.transformer_cls_names_to_wrap is None  # from the model
    # the final save (train/record.py) switches the sharded checkpoints' plugin to a whole state dict, which is
    # what Trainer.save_model looks for before it gathers and writes the model
    assert "FULL_STATE_DICT" not in str(plugin.state_dict_type)
    plugin.set_state_dict_type("FULL_STATE_DICT")
    assert "FULL_STATE_DICT" in str(plugin.state_dict_type)


def test_defaults_resolve_to_full_state_dict_and_the_named_layer_class(recipe_path):
    recipe = load_recipe(recipe_path, ["fsdp.transformer_layer_cls_to_wrap=LlamaDecoderLayer"])
    args = fsdp_training_arguments(recipe)
    assert args.fsdp_plugin_args["state_dict_type"] == "FULL_STATE_DICT"
    assert args.fsdp_plugin_args["reshard_after_forward"] is True and "cpu_offload" not in args.fsdp_plugin_args
    assert args.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert "activation_checkpointing" in args.fsdp_plugin_args and not args.activation_checkpointing
    plain = fsdp_training_arguments(load_recipe(recipe_path))
    assert not plain.fsdp and plain.fsdp_plugin_args is None


@cpu_only
def test_fsdp_on_a_cpu_is_refused_before_any_model_is_loaded(recipe_path, tmp_path):
    from finetune.train import run_training

    with pytest.raises(ModelError, match="`fsdp` shards over GPU processes and this machine has no CUDA GPU"):
        run_training(load_recipe(recipe_path, ["fsdp=true"]))
    assert not (tmp_path / "out" / "run.json").exists()


@cpu_only
def test_finetune_train_with_fsdp_on_a_cpu_exits_2_with_one_message(recipe_path, capsys):
    assert main(["train", str(recipe_path), "--set", "fsdp=true", "--num-processes", "2"]) == 2
    err = capsys.readouterr().err
    assert "accelerate applies FSDP2 only to GPU processes" in err and "Traceback" not in err


# --- the memory plan ----------------------------------------------------------------------------------------


@pytest.fixture
def shape8b():
    from transformers import LlamaConfig

    from finetune.plan.model_size import count_model

    return count_model(LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256), lora_r=16)


def test_plan_shards_like_zero3_without_a_master_copy_and_counts_the_gathered_layers(shape8b):
    from finetune.plan.budget import PlanInputs, fsdp_gathered_bytes, plan_memory

    shape, full, lora = shape8b
    base = dict(adapter="none", precision="bf16", gradient_checkpointing="full", seq_len=2048)
    one = plan_memory(PlanInputs(shape, full, lora, **base)).components
    fsdp8 = plan_memory(PlanInputs(shape, full, lora, num_gpus=8, fsdp=True, **base)).components
    for name in ("weights", "gradients", "optimizer states"):  # fp32 shards: 1/8 of one GPU's
        assert fsdp8[name] == pytest.approx(one[name] / 8)
    assert fsdp8["master weights"] == 0  # FSDP2's fp32 weights are the master copy (ZeRO-3 adds one)
    zero3 = plan_memory(PlanInputs(shape, full, lora, num_gpus=8, zero_stage=3, **base)).components
    assert zero3["master weights"] > 0
    # two decoder layers (one computing, one prefetched) and the root unit (embeddings + lm_head) in bf16
    per_layer = shape.quantizable_params / shape.num_layers
    assert fsdp8["FSDP gathered weights"] == pytest.approx(2 * (shape.total_params - shape.quantizable_params
                                                                + 2 * per_layer))
    kept = PlanInputs(shape, full, lora, num_gpus=8, fsdp=True, fsdp_reshard_after_forward=False, **base)
    assert fsdp_gathered_bytes(kept) == pytest.approx(2 * shape.total_params)  # every layer held until backward
    offload = plan_memory(PlanInputs(shape, full, lora, num_gpus=8, fsdp=True, fsdp_offload_params=True, **base))
    assert offload.components["weights"] == offload.components["optimizer states"] == 0
    on_gpu = plan_memory(PlanInputs(shape, full, lora, num_gpus=8, fsdp=True, **base))
    assert offload.peak_allocated < on_gpu.peak_allocated


def test_the_run_plans_a_recipe_with_fsdp_as_fsdp(recipe_path, tiny_model_dir):
    from transformers import AutoConfig

    from finetune.plan.run_memory import planned_memory

    config = AutoConfig.from_pretrained(tiny_model_dir)
    plain = planned_memory(load_recipe(recipe_path, ["adapter=none"]), config, "bf16", "sdpa", "adamw_torch", 2)
    fsdp = planned_memory(load_recipe(recipe_path, ["adapter=none", "fsdp=true"]), config, "bf16", "sdpa",
                          "adamw_torch", 2)
    assert fsdp["peak_allocated_gib"] < plain["peak_allocated_gib"]


def test_finetune_plan_prints_fsdp_lines(recipe_path, capsys):
    assert main(["plan", str(recipe_path), "--set", "fsdp=true", "--num-gpus", "4", "--no-data"]) == 0
    assert "FSDP gathered weights" in capsys.readouterr().out
    assert main(["plan", str(recipe_path), "--fsdp", "--zero-stage", "3", "--no-data"]) == 2
    assert "a run uses one" in capsys.readouterr().err


def test_plan_fsdp_refuses_what_train_refuses_in_the_same_words(recipe_path, make_recipe, capsys):
    """Issue 43, item 9: `finetune plan --fsdp` said FITS for DPO (and GRPO, QLoRA...), which train refuses."""
    import random

    from test_preference_data import chat_pair
    from tests.conftest import write_jsonl

    pairs = write_jsonl(recipe_path.parent / "pairs.jsonl", [chat_pair(random.Random(0)) for _ in range(8)])
    cases = [(recipe_path, ["compile=true"]),
             (recipe_path, ["method=dpo", "datasets=[{path: pairs.jsonl, type: preference}]"])]
    for path, overrides in cases:
        with pytest.raises(RecipeError) as caught:  # train: the recipe with `fsdp` does not load
            load_recipe(path, [*overrides, "fsdp=true"])
        refused = [p for p in caught.value.problems if "fsdp" in p]
        assert refused and pairs.is_file()
        sets = [a for o in overrides for a in ("--set", o)]
        assert main(["plan", str(path), *sets, "--fsdp", "--no-data", "--gpu-memory-gib", "80"]) == 2
        out = capsys.readouterr()
        assert "FITS" not in out.out and all(p in out.err for p in refused) and "Traceback" not in out.err
    assert main(["plan", str(recipe_path), "--fsdp", "--no-data", "--gpu-memory-gib", "80"]) == 0  # SFT LoRA plans


# --- axolotl recipes ----------------------------------------------------------------------------------------

AXOLOTL_FSDP2 = """
base_model: Qwen/Qwen3-8B
datasets:
  - path: chat.jsonl
    type: chat_template
sequence_len: 2048
micro_batch_size: 1
gradient_accumulation_steps: 4
num_epochs: 1
learning_rate: 0.0002
optimizer: adamw_torch_fused
adapter: lora
lora_r: 16
lora_alpha: 32
lora_target_linear: true
bf16: auto
gradient_checkpointing: true
fsdp_version: 2
fsdp_config:
  offload_params: false
  cpu_ram_efficient_loading: true
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
  transformer_layer_cls_to_wrap: Qwen3DecoderLayer
  state_dict_type: FULL_STATE_DICT
  reshard_after_forward: true
  activation_checkpointing: true
output_dir: ./outputs/out
"""

AXOLOTL_FSDP1 = """
base_model: m
datasets:
  - path: chat.jsonl
    type: chat_template
adapter: lora
fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_offload_params: true
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_state_dict_type: LOCAL_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_use_orig_params: false
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_sync_module_states: true
"""


def _port(tmp_path, text: str, *overrides: str):
    from tests.conftest import make_records, write_jsonl

    write_jsonl(tmp_path / "chat.jsonl", make_records("chat", 16))
    (tmp_path / "axolotl.yml").write_text(text)
    out = tmp_path / "recipe.yml"
    code = main(["port", str(tmp_path / "axolotl.yml"), "-o", str(out), "--force",
                 *[a for o in overrides for a in ("--set", o)]])
    return code, out.read_text(), yaml.safe_load(out.read_text())


@cpu_only
def test_axolotl_fsdp2_recipe_ports_with_nothing_to_fix_and_resolves_to_fsdp2(tmp_path, tiny_model_dir, capsys):
    code, text, ported = _port(tmp_path, AXOLOTL_FSDP2, f"base_model={tiny_model_dir}")
    assert code == 0 and "is a valid finetune recipe" in capsys.readouterr().out
    assert ported["fsdp"] == {"transformer_layer_cls_to_wrap": "Qwen3DecoderLayer"}  # the rest are the defaults
    assert ported["gradient_checkpointing"] == "full"  # activation_checkpointing: done by FSDP under `fsdp`
    assert "fsdp_config.cpu_ram_efficient_loading: true: not in finetune" in text
    # the tiny Llama is not Qwen3: the one edit besides paths a user with a different model would make
    recipe = load_recipe(tmp_path / "recipe.yml", ["fsdp.transformer_layer_cls_to_wrap=LlamaDecoderLayer",
                                                   "report_to=[none]", "cache_dir=cache", "sequence_len=256"])
    args = fsdp_training_arguments(recipe)
    assert args.fsdp_plugin_args["fsdp_version"] == 2 and args.fsdp_plugin_args["activation_checkpointing"]
    assert args.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert args.gradient_accumulation_steps == 4 and args.per_device_train_batch_size == 1
    from finetune.train import run_training

    with pytest.raises(ModelError, match="no CUDA GPU"):  # on this CPU it stops at the device, before a model
        run_training(recipe)
    # everything but the sharding trains here: the same recipe without `fsdp`, cut to 2 steps for the tiny model
    summary = run_training(load_recipe(tmp_path / "recipe.yml", [
        "fsdp=false", "report_to=[none]", "cache_dir=cache", "sequence_len=256", "max_steps=2",
        "gradient_accumulation_steps=1", "optimizer=adamw_torch", "gradient_checkpointing=off", "output_dir=out"]))
    assert summary["steps"] == 2 and (tmp_path / "out" / "adapter_model.safetensors").is_file()


def test_axolotl_fsdp1_recipe_maps_its_settings_and_notes_the_fsdp1_only_ones(tmp_path, capsys):
    code, text, ported = _port(tmp_path, AXOLOTL_FSDP1)
    assert code == 0, capsys.readouterr()
    # fsdp_sharding_strategy SHARD_GRAD_OP (the config) wins over the list's full_shard: keep weights until backward
    assert ported["fsdp"] == {"reshard_after_forward": False, "offload_params": True,
                              "state_dict_type": "SHARDED_STATE_DICT",
                              "transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}
    assert "axolotl's FSDP1 (deprecated in axolotl and transformers) runs as FSDP2 here" in text
    for key in ("use_orig_params", "backward_prefetch_policy", "sync_module_states"):
        assert f"fsdp_config.{key}" in text and "FSDP1-only" in text.split(f"fsdp_config.{key}")[1][:80]
    assert "fsdp_config.state_dict_type: LOCAL_STATE_DICT: FSDP1-only" in text


def test_every_fsdp_setting_is_said_and_the_dropped_count_counts_them(tmp_path, capsys):
    """Issue 43, item 13: `auto_wrap_policy` and `activation_checkpointing` vanished without a comment (the latter
    when `gradient_checkpointing: true` had already set `full`), and the count left out fsdp_config's drops."""
    code, text, ported = _port(tmp_path, AXOLOTL_FSDP1.replace("adapter: lora", "adapter: lora\ngradient_checkpointing: "
                                                                "true\nbogus_key: 1") + "  fsdp_auto_wrap_policy: "
                               "TRANSFORMER_BASED_WRAP\n  fsdp_activation_checkpointing: true\n")
    assert code == 0
    assert "fsdp_config.auto_wrap_policy: TRANSFORMER_BASED_WRAP: finetune's behaviour already" in text
    comments = text.split("gradient_checkpointing: full")[0].rsplit("\nadapter: lora", 1)[1]
    assert "axolotl `gradient_checkpointing: true` is written `full`" in comments
    assert "from axolotl `fsdp_config.activation_checkpointing: true`" in comments
    assert ported["gradient_checkpointing"] == "full"
    # dropped: bogus_key (top level), use_orig_params, backward_prefetch_policy, sync_module_states (fsdp_config)
    assert text.count("dropped") - text.count("was dropped") == 4
    assert "4 axolotl settings dropped" in capsys.readouterr().out


def test_axolotl_no_shard_is_plain_data_parallelism(tmp_path):
    code, text, ported = _port(tmp_path, "base_model: m\ndatasets:\n  - path: chat.jsonl\n    type: chat_template\n"
                                         "fsdp: [no_shard]\nfsdp_config:\n  fsdp_offload_params: false\n")
    assert code == 0 and "fsdp" not in ported and "plain data parallelism" in text


def test_axolotl_qlora_with_fsdp_ports_without_fsdp_and_says_why(tmp_path):
    code, text, ported = _port(tmp_path, AXOLOTL_FSDP2.replace("adapter: lora", "adapter: qlora\nload_in_4bit: true"))
    assert code == 0 and "fsdp" not in ported and ported["adapter"] == "qlora"
    assert "QLoRA under FSDP2 is not in finetune" in text


def test_a_checkpoint_resumes_across_offload_and_resharding_but_not_across_its_layout(recipe_path):
    from finetune.train.checkpoints import run_fingerprint

    def fingerprint(*overrides):
        return run_fingerprint(load_recipe(recipe_path, list(overrides)), "data", 2)["fsdp"]

    assert fingerprint() is None
    assert fingerprint("fsdp=true") == {"state_dict_type": "FULL_STATE_DICT"}
    assert fingerprint("fsdp.offload_params=true", "fsdp.reshard_after_forward=false") == fingerprint("fsdp=true")
    assert fingerprint("fsdp.state_dict_type=SHARDED_STATE_DICT") != fingerprint("fsdp=true")


@pytest.fixture(scope="module")
def fsdp_on_cpu(tiny_model_dir, tmp_path_factory) -> dict:
    """tests/fsdp_cpu_driver.py on 2 gloo processes: FSDP2's `fully_shard` as accelerate applies it, outside the
    Trainer (which runs no FSDP on CPU). {rank: its results, "dir": where the adapters were saved}."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from finetune.train.launch import free_port

    tests, results = Path(__file__).parent, tmp_path_factory.mktemp("fsdp_cpu")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                           "127.0.0.1", "--master_port", str(free_port()), str(tests / "fsdp_cpu_driver.py"),
                           str(tiny_model_dir), str(results)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": results, **{rank: json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}}


@pytest.mark.multiproc
def test_lora_under_fsdp2_on_two_processes_matches_one_and_saves_the_whole_adapter(fsdp_on_cpu, tiny_model_dir):
    """What the GPU test checks through the Trainer (tests/test_fsdp_gpu.py), checked here on FSDP2 itself: 4 LoRA
    steps sharded over 2 processes give one process's losses, and the adapter saved from the full state dict (as
    the Trainer's final save under FSDP2 makes it) is whole, loads with peft and equals the unsharded one."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    for rank in (0, 1):
        lora = fsdp_on_cpu[rank]["lora"]
        assert lora["fsdp"] == pytest.approx(lora["single"], rel=1e-5)
        assert lora["single"][-1] < lora["single"][0]  # it trained
    saved = load_file(str(fsdp_on_cpu["dir"] / "fsdp" / "adapter_model.safetensors"))
    single = load_file(str(fsdp_on_cpu["dir"] / "single" / "adapter_model.safetensors"))
    assert saved.keys() == single.keys() and len(saved) == 4 * 7  # A and B of 7 linears in each of 2 layers
    for name, tensor in saved.items():  # whole tensors, not a process's shard
        assert tensor.shape == single[name].shape, name
        assert torch.allclose(tensor, single[name], atol=1e-5), name
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(fsdp_on_cpu["dir"] / "fsdp"))


@pytest.mark.multiproc
def test_under_fsdp2_the_lm_head_runs_once_not_chunk_by_chunk(fsdp_on_cpu):
    """Supervised-only logits run a large batch's head chunk by chunk, a call count that differs between processes;
    under FSDP2 each call of the sharded head may be a collective, so there it runs once on all supervised rows, as
    under ZeRO-3. Same loss."""
    for rank in (0, 1):
        plain, fsdp = fsdp_on_cpu[rank]["head"]["plain"], fsdp_on_cpu[rank]["head"]["fsdp"]
        assert plain["head_rows"][0] == 0 and len(plain["head_rows"]) > 2  # chunked when unsharded
        assert fsdp["head_rows"] == [14]  # one call: the 2 x 7 supervised rows
        assert fsdp["loss"] == pytest.approx(plain["loss"], rel=1e-6)


@pytest.mark.multiproc
def test_plan_per_gpu_states_are_what_fsdp2_leaves_each_process(fsdp_on_cpu, tiny_model_dir):
    """The plan's FSDP2 weights, gradients and AdamW states for 2 GPUs are what each of 2 real fully_shard processes
    holds (the tiny model's dims split evenly; fp32 full fine-tune)."""
    from transformers import AutoConfig

    from finetune.plan.budget import PlanInputs, plan_memory
    from finetune.plan.model_size import count_model

    shape, full, lora = count_model(AutoConfig.from_pretrained(tiny_model_dir))
    planned = plan_memory(PlanInputs(shape, full, lora, adapter="none", precision="fp32", num_gpus=2, fsdp=True))
    for rank in (0, 1):
        held = fsdp_on_cpu[rank]["bytes"]
        assert held["weights"] == planned.components["weights"]
        assert held["gradients"] == planned.components["gradients"]
        # the plan counts torch's fp32 `step` per tensor (4 bytes) into the states and shards them too
        assert held["optimizer states"] == pytest.approx(planned.components["optimizer states"]
                                                         - 4 * held["tensors"] / 2)
