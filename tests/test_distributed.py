"""Scale out on CPU: 2-process DDP (gloo) and DeepSpeed ZeRO 1/2/3 train the tiny model to the same losses
as one process with the same global batch; ZeRO-3 writes a complete adapter / model; a DeepSpeed checkpoint
resumes; only the main process tokenizes. Plus the refusals that must come before anything starts.

Same global batch: one process runs micro batch 2 x accumulation 2; two processes run micro batch 2 x
accumulation 1 each (the recipe says `global_batch_size: 4` and derives the accumulation). The Trainer's
seeded sampler hands out the same examples per optimizer step either way, LoRA dropout is 0 and the run is
fp32, so the losses agree to float rounding: TOLERANCE below (relative) is what the reduction order across
processes may change, measured differences are ~1e-7.

Process start dominates (~10-20 s of imports per process on a small shared CPU; the tiny model trains in
under a second), so every multi-process configuration runs inside ONE launch (tests/multiproc_driver.py),
and one more launch runs `finetune train --num-processes 2` exactly as a user types it. DeepSpeed builds
its CPU communication op once into the torch extensions cache (~1 min the first time on a machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import make_records, write_jsonl
from finetune.errors import RecipeError
from finetune.train.launch import LaunchError, free_port, launch_command
from finetune.train.output_lock import hold_output_dir
from finetune.recipe import load_recipe

TOLERANCE = 1e-5  # relative, on each logged loss; fp32 differs only in the order of the gradient all-reduce
ADAPTER_ATOL = 1e-5  # absolute, on each LoRA weight after 4 steps at lr 1e-3
DRIVER = Path(__file__).with_name("multiproc_driver.py")
pytest.importorskip("deepspeed", reason="pip install 'finetune[deepspeed]' (it is in the test extra)")
# These prove 2 CPU processes (gloo, DeepSpeed on CPU) equal 1; with a GPU visible the in-process reference
# would train on it in bf16 and a second rank would ask for a second GPU. They run the same with it hidden.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU multi-process checks: run them with "
                                "CUDA_VISIBLE_DEVICES= python -m pytest tests/test_distributed.py")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("dist")
    write_jsonl(root / "chat.jsonl", make_records("chat", 32))
    recipe = {
        "base_model": str(tiny_model_dir),
        "datasets": [{"path": "chat.jsonl", "type": "chat"}],
        "sequence_len": 512,
        "micro_batch_size": 2,
        "global_batch_size": 4,  # 2 x 2 accumulation on one process, 2 x 1 x 2 processes
        "max_steps": 4,
        "learning_rate": 1e-3,
        "lr_scheduler": "constant",
        "logging_steps": 1,
        "adapter": "lora",
        "lora_r": 4,
        "lora_dropout": 0.0,  # dropout draws differ between 1 and 2 processes
        "output_dir": "single",
        "cache_dir": "cache",
        "report_to": ["none"],
    }
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def losses(summary_or_run) -> list[tuple[int, float]]:
    if "log_history" in summary_or_run:
        return [(e["step"], e["loss"]) for e in summary_or_run["log_history"] if "loss" in e]
    return [tuple(item) for item in summary_or_run["losses"]]


def assert_same_losses(got, expected) -> None:
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (step, a), (_, b) in zip(got, expected):
        assert a == pytest.approx(b, rel=TOLERANCE), f"step {step}: {a} vs single-process {b}"


@pytest.fixture(scope="module")
def single(workdir) -> dict:
    """One process, in this process: LoRA 4 steps and a full fine-tune 2 steps."""
    from finetune.train import run_training

    recipe = workdir / "recipe.yml"
    lora = run_training(load_recipe(recipe, world_size=1))
    full = run_training(load_recipe(recipe, ["adapter=none", "max_steps=2", "output_dir=single_full"], world_size=1))
    packed = run_training(load_recipe(recipe, ["sample_packing=true", "sequence_len=256", "output_dir=single_packed"],
                                      world_size=1))
    assert lora["plan"]["world_size"] == 1 and lora["plan"]["examples_per_step"] == 4
    return {"lora": lora, "full": full, "packed": packed}


RUNS = {  # run name -> --set overrides, in order (ZeRO-3 last: transformers keeps it process-wide)
    "busy": "output_dir=mp_busy",  # a folder this test process holds while the launch runs: refused
    "ddp": "output_dir=mp_ddp,cache_dir=mp_cache",  # a cold cache: rank 0 tokenizes, rank 1 must not
    "zero1": "output_dir=mp_zero1,deepspeed=zero1",
    "zero2_first_half": "output_dir=mp_zero2,deepspeed=zero2,max_steps=2",
    "zero2": "output_dir=mp_zero2,deepspeed=zero2",  # resumes from the step-2 DeepSpeed checkpoint
    "zero2_offload": "output_dir=mp_zero2_offload,deepspeed=zero2_offload",
    "zero3_offload": "output_dir=mp_zero3_offload,deepspeed=zero3_offload",
    "zero3_full": "output_dir=mp_zero3_full,deepspeed=zero3,adapter=none,max_steps=2",
    # the packing guard and the supervised-logits probe need a forward pass: under ZeRO-3 they wait for
    # the engine (each rank holds a shard of the weights until then)
    "zero3_packed": "output_dir=mp_zero3_packed,deepspeed=zero3,sample_packing=true,sequence_len=256",
}


def cpu_adam_built() -> bool:
    """Offload trains with DeepSpeedCPUAdam, a C++ op DeepSpeed builds on first use: 2-4 minutes on a small
    CPU, too long for the default suite. The offload runs join the launch once it is built (any offload run
    builds it) or when FINETUNE_TEST_OFFLOAD=1 asks for the build."""
    from torch.utils.cpp_extension import _get_build_directory

    built = (Path(_get_build_directory("cpu_adam", False)) / "cpu_adam.so").is_file()
    return built or os.environ.get("FINETUNE_TEST_OFFLOAD") == "1"


@pytest.fixture(scope="module")
def multiproc(workdir, single) -> dict:
    """Every run of RUNS in one 2-process launch; returns {rank: {run: result}}."""
    results = workdir / "results"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(DRIVER), str(workdir / "recipe.yml"),
               str(results), *(f"{name}={overrides}" for name, overrides in RUNS.items()
                               if "offload" not in name or cpu_adam_built())]
    # LM-head chunks of 8 rows (a 152k vocabulary's 2**26-logit chunks hold 441): processes whose batches hold
    # different numbers of supervised tokens make different numbers of chunks, which hung ZeRO-3 (one collective
    # per call of its partitioned head; the tiny 512-token vocabulary fits any batch in one chunk otherwise)
    with hold_output_dir(workdir / "mp_busy"):  # another run holds it
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=workdir,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "FINETUNE_TEST_CHUNK_LOGITS": str(8 * 512)})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return {rank: json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.multiproc
@pytest.mark.parametrize("run", ["ddp", "zero1", "zero2"])
def test_two_processes_match_one_process(multiproc, single, run):
    for rank in (0, 1):
        result = multiproc[rank][run]
        assert result["world_size"] == 2 and result["steps"] == 4
        assert_same_losses(losses(result), losses(single["lora"]))


@pytest.mark.multiproc
def test_zero3_with_packing_proves_isolation_and_matches_one_process(multiproc, single):
    assert single["packed"]["data"]["packing"]["train"]["rows"] < 32  # examples were packed
    for rank in (0, 1):
        result = multiproc[rank]["zero3_packed"]
        assert result["world_size"] == 2 and result["steps"] == 4
        assert_same_losses(losses(result), losses(single["packed"]))


@pytest.mark.multiproc
@pytest.mark.parametrize("run", ["zero2_offload", "zero3_offload"])
def test_cpu_offload_matches_one_process(multiproc, single, run):
    if run not in multiproc[0]:
        pytest.skip("DeepSpeed's cpu_adam op is not built yet (2-4 min); FINETUNE_TEST_OFFLOAD=1 builds it")
    for rank in (0, 1):
        assert multiproc[rank][run]["world_size"] == 2
        assert_same_losses(losses(multiproc[rank][run]), losses(single["lora"]))


@pytest.mark.multiproc
def test_one_run_per_folder_holds_across_its_processes(multiproc):
    """Every other run of the launch wrote into its folder from both processes (rank 0 holds the lock for them);
    a folder another run holds is refused on both processes with the holder's name, before any data is read."""
    for rank in (0, 1):
        busy = multiproc[rank]["busy"]
        assert busy["exit_code"] == 2 and f"in use by another run: process {os.getpid()} on host" in busy["error"]
        assert all("error" not in result for run, result in multiproc[rank].items() if run != "busy")


@pytest.mark.multiproc
def test_only_the_main_process_tokenizes(multiproc):
    # cold cache in the first run: rank 0 tokenizes once while rank 1 waits, then reads rank 0's cache
    assert multiproc[0]["ddp"]["tokenize_calls"] == 1
    assert multiproc[1]["ddp"]["tokenize_calls"] == 0
    assert all(result["tokenize_calls"] == 0 for rank in (0, 1) for run, result in multiproc[rank].items()
               if run not in ("ddp", "busy"))  # busy: refused before any data is read


@pytest.mark.multiproc
def test_deepspeed_checkpoint_resumes(multiproc, single, workdir):
    first, resumed = multiproc[0]["zero2_first_half"], multiproc[0]["zero2"]
    assert first["steps"] == 2 and resumed["resumed_from"].endswith("step-2")
    # steps 3-4 after the resume equal the uninterrupted single-process run: optimizer state came back
    assert_same_losses(losses(resumed)[2:], losses(single["lora"])[2:])
    shards = sorted(p.name for p in (workdir / "mp_zero2" / "checkpoints").glob("step-*/global_step*/*"))
    assert any("optim_states" in name for name in shards), shards


@pytest.mark.multiproc
def test_zero3_full_finetune_saves_the_gathered_model(multiproc, single, workdir, tiny_model_dir):
    assert_same_losses(losses(multiproc[0]["zero3_full"]), losses(single["full"]))
    saved = load_file(str(workdir / "mp_zero3_full" / "model.safetensors"))
    reference = load_file(str(workdir / "single_full" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert saved.keys() == reference.keys()
    for name, tensor in saved.items():  # full shapes (not ZeRO-3's empty shards), trained like one process
        assert tensor.shape == reference[name].shape, name
        assert torch.allclose(tensor.float(), reference[name].float(), atol=1e-4), name
    assert any(not torch.equal(saved[k], base[k]) for k in base)


@pytest.mark.multiproc
def test_finetune_train_num_processes_zero3(workdir, single, tiny_model_dir):
    """The command a user runs: `finetune train recipe.yml --num-processes 2` with ZeRO-3 and LoRA."""
    proc = subprocess.run(
        [sys.executable, "-m", "finetune.cli", "train", "recipe.yml", "--num-processes", "2",
         "--set", "deepspeed=zero3", "--set", "output_dir=cli_zero3"],
        capture_output=True, text=True, timeout=600, cwd=workdir, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = workdir / "cli_zero3"
    run = json.loads((out / "run.json").read_text())
    assert run["plan"]["world_size"] == 2 and run["recipe"]["gradient_accumulation_steps"] == 1
    assert run["total_parameters"] == single["lora"]["total_parameters"]  # counted whole under ZeRO-3
    assert_same_losses(losses(run), losses(single["lora"]))

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))
    reference = load_file(str(workdir / "single" / "adapter_model.safetensors"))
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved.keys() == reference.keys() and len(saved) > 0
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(saved)
    for name, tensor in saved.items():
        assert torch.allclose(tensor, reference[name], atol=ADAPTER_ATOL), name


@pytest.mark.multiproc
def test_one_process_under_deepspeed_needs_no_launcher(workdir, single):
    """`python -m finetune.train` with `deepspeed:` and no launcher: finetune supplies the rendezvous variables
    (without them DeepSpeed goes looking for MPI). The config brings its own optimizer with an "auto" lr and
    the recipe says `learning_rate: auto`, resolved only after the data is counted: DeepSpeed's optimizer must
    get the resolved value (2e-3 x sqrt(56.25 supervised tokens per step / 225) = 1e-3), not a placeholder."""
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "zero_optimization": {"stage": 1},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                          "weight_decay": "auto", "torch_adam": True}}}
    name = write_ds(workdir, "zero1_adamw.json", config)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    overrides = [f"deepspeed={name}", "output_dir=one_zero1", "learning_rate=auto", "lr_base=2e-3",
                 "lr_pretrained_batch_tokens=225"]
    proc = subprocess.run(
        [sys.executable, "-m", "finetune.train", "recipe.yml", *(a for o in overrides for a in ("--set", o))],
        capture_output=True, text=True, timeout=600, cwd=workdir, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    run = json.loads((workdir / "one_zero1" / "run.json").read_text())
    assert run["plan"]["world_size"] == 1 and run["recipe"]["gradient_accumulation_steps"] == 2
    assert run["learning_rate"] == pytest.approx(1e-3)
    assert all(e["learning_rate"] == pytest.approx(1e-3) for e in run["log_history"] if "loss" in e)
    assert_same_losses(losses(run), losses(single["lora"]))


# --- refusals before anything starts (no processes launched) ----------------------------------------------


def write_ds(workdir: Path, name: str, config) -> str:
    path = workdir / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return name


@pytest.mark.parametrize("config, needle", [
    ({"train_micro_batch_size_per_gpu": 8}, "train_micro_batch_size_per_gpu = 8 but the recipe's `micro_batch_size` is 2"),
    ({"gradient_accumulation_steps": 4}, "`gradient_accumulation_steps` is 2"),
    ({"train_batch_size": 16}, "train_batch_size = 16 but the recipe makes 4"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, "hard-codes optimizer.params.lr"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}, "scheduler.params.warmup_num_steps"),
    ({"bf16": {"enabled": True}}, "bf16.enabled = true but the recipe's `precision` is `auto`"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage is 4"),
    ('{"zero_optimization": {"stage": 2},}', "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
])
def test_contradicting_or_malformed_deepspeed_config_is_a_recipe_error(workdir, config, needle):
    name = write_ds(workdir, "bad_ds.json", config)
    with pytest.raises(RecipeError) as err:
        load_recipe(workdir / "recipe.yml", [f"deepspeed={name}"], world_size=1)
    assert needle in str(err.value) and "deepspeed" in str(err.value)


def test_missing_deepspeed_config_names_the_shipped_ones(workdir):
    with pytest.raises(RecipeError, match="no file at .*zero1, zero2, zero3, zero2_offload, zero3_offload"):
        load_recipe(workdir / "recipe.yml", ["deepspeed=zero4"], world_size=1)


def test_shipped_configs_load_and_say_auto_for_what_the_recipe_owns(workdir):
    from finetune.train.deepspeed_config import SHIPPED, shipped_path, trainer_deepspeed_config

    for name in SHIPPED:
        recipe = load_recipe(workdir / "recipe.yml", [f"deepspeed={name}"], world_size=2)
        assert recipe.deepspeed == str(shipped_path(name)) and Path(recipe.deepspeed).is_file()
        config = json.loads(Path(recipe.deepspeed).read_text())
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
            assert config[key] == "auto", (name, key)
        assert config["bf16"]["enabled"] == config["fp16"]["enabled"] == "auto"
        assert "train_batch_size" not in trainer_deepspeed_config(recipe.deepspeed)  # DeepSpeed derives it
        stage = config["zero_optimization"]["stage"]
        assert stage == int(name[4])
        if "offload" in name:
            assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
            assert config["optimizer"]["params"]["lr"] == "auto"
            assert ("offload_param" in config["zero_optimization"]) == (stage == 3)


def test_zero3_with_qlora_is_refused_with_the_reason(workdir):
    with pytest.raises(RecipeError, match="ZeRO-3 shards every weight.*use `deepspeed: zero2`"):
        load_recipe(workdir / "recipe.yml", ["deepspeed=zero3", "adapter=qlora"], world_size=1)
    assert load_recipe(workdir / "recipe.yml", ["deepspeed=zero2", "adapter=qlora"], world_size=1).deepspeed


def test_launcher_refuses_more_processes_than_gpus():
    with pytest.raises(LaunchError, match="4 processes per machine but this machine has 2 GPU"):
        launch_command(["recipe.yml"], 4, cuda_devices=2)
    with pytest.raises(LaunchError, match="not a multiple of --num-machines 2"):
        launch_command(["recipe.yml"], 3, cuda_devices=0, num_machines=2)


def test_launcher_picks_accelerate_on_gpus_and_torchrun_on_cpu():
    gpu = launch_command(["r.yml", "--set", "lora_r=4"], 8, cuda_devices=4, num_machines=2, machine_rank=1,
                         main_process_ip="10.0.0.1", main_process_port=29501)
    assert gpu[1:4] == ["-m", "accelerate.commands.launch", "--multi_gpu"]
    assert gpu[gpu.index("--num_processes") + 1] == "8" and gpu[gpu.index("--machine_rank") + 1] == "1"
    assert gpu[gpu.index("--main_process_ip") + 1] == "10.0.0.1"
    assert gpu[-5:] == ["-m", "finetune.train", "r.yml", "--set", "lora_r=4"]
    cpu = launch_command(["r.yml"], 2, cuda_devices=0, main_process_port=29502)
    assert cpu[1:3] == ["-m", "torch.distributed.run"] and cpu[cpu.index("--nproc_per_node") + 1] == "2"
    assert cpu[-3:] == ["-m", "finetune.train", "r.yml"]


def test_process_group_timeout_comes_from_the_recipe(workdir):
    from conftest import resolved_training_arguments

    recipe = load_recipe(workdir / "recipe.yml", ["ddp_timeout=12345"], world_size=1)
    assert resolved_training_arguments(recipe).ddp_timeout == 12345
