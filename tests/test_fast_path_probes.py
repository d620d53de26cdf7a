"""A GPU fast path is used only once it has run on the device (finetune/train/fast_paths.py, model/probes.py).

What `auto` picks from the device's compute capability; what a failed probe does when `auto` chose the path (the
run falls back, says why once, run.json records it) and when the recipe asked for it (exit 2 before anything is
written, naming the key and the alternative); a kernel failure in the middle of training; the Colab notebook's
recipe on a T4. The failures are real where a CPU has them (flex_attention has no backward on CPU; inductor
without a working C++ compiler) and injected where only a GPU would fail (out of shared memory). The real probes
passing on a GPU are the `gpu`-marked tests at the end.
"""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest
import torch

from finetune.model import attention, regional_compile, resolve_precision
from finetune.model.attention import choose_attention
from finetune.model.device import Device
from finetune.model.probes import ProbeUnavailable
from finetune.model.regional_compile import resolve_compile
from finetune.train.fast_paths import Choice, FastPathError, failed_fast_path, prove_fast_paths

CPU = Device()
V100 = Device("cuda", 0, (7, 0), "Tesla V100-SXM2-16GB")
T4 = Device("cuda", 0, (7, 5), "Tesla T4")
A10G = Device("cuda", 0, (8, 6), "NVIDIA A10G")
H100 = Device("cuda", 0, (9, 0), "NVIDIA H100 80GB HBM3")
# what the GPUs most users own report when flex_attention's backward does not fit (pytorch #133254)
SHARED_MEMORY = "out of resource: shared memory, Required: 131074, Hardware limit: 101376"


def recipe(**keys):
    return types.SimpleNamespace(**{"attn_implementation": "auto", "sample_packing": True, "compile": "auto",
                                    "precision": "auto", **keys})


class Probes:
    """Injected probes: each records that it ran and raises what it is given (None: it passes)."""

    def __init__(self, flex=None, compiled=None):
        self.flex, self.compiled, self.calls = flex, compiled, []

    def describe(self):
        return "a faked GPU, head_dim 128, 32 heads (8 key/value), bf16"

    def flex_attention(self):
        self.calls.append("flex_attention")
        if self.flex is not None:
            raise self.flex
        return 0.5

    def compiled_layer(self, attn):
        self.calls.append(f"compiled_layer({attn})")
        if self.compiled is not None:
            raise self.compiled
        return 2.0


def chosen(r, device) -> Choice:
    attn = choose_attention(r, device, supports_flex=lambda recipe: (True, ""))
    return Choice(*attn, *resolve_compile(r, device), {})


@pytest.mark.parametrize("device, precision, attn, attn_with_flash_attn, compiled", [
    (CPU, "fp32", "sdpa", "sdpa", False),
    (V100, "fp16", "sdpa", "sdpa", False),  # no bf16; flash-attn 2 needs 8.0+; flex needs more shared memory
    (T4, "fp16", "sdpa", "sdpa", False),
    (A10G, "bf16", "flex_attention", "flash_attention_2", True),  # then probed: A10G is where flex may not fit
    (H100, "bf16", "flex_attention", "flash_attention_2", True),
])
def test_auto_picks_precision_attention_and_compile_from_the_compute_capability(
        monkeypatch, device, precision, attn, attn_with_flash_attn, compiled):
    monkeypatch.setattr(attention, "_flex_available", lambda: True)
    real = attention.importlib.util.find_spec
    for flash_attn_installed, expected in ((False, attn), (True, attn_with_flash_attn)):
        monkeypatch.setattr(attention.importlib.util, "find_spec",
                            lambda name: (object() if flash_attn_installed else None) if name == "flash_attn"
                            else real(name))
        assert resolve_precision(recipe(), device) == precision
        choice = chosen(recipe(), device)
        assert (choice.attn_implementation, choice.compile) == (expected, compiled)
    if device in (T4, V100):  # the reason names the device and the line it is below
        assert device.describe() in choice.attn_reason and "8.0" in choice.attn_reason
        assert "8.0" in choice.compile_reason and "compile: true" in choice.compile_reason
    # what the recipe sets is what it gets, probed where it is a fast path
    assert resolve_compile(recipe(compile=True), device) == (True, "set in the recipe (compile)")
    assert choose_attention(recipe(attn_implementation="flex_attention"), device)[0] == "flex_attention"


@pytest.mark.parametrize("device", [CPU, T4, V100])
def test_nothing_is_probed_where_auto_chooses_nothing_from_it(monkeypatch, device):
    monkeypatch.setattr(attention, "_flex_available", lambda: True)
    probes = Probes(flex=RuntimeError("must not run"), compiled=RuntimeError("must not run"))
    choice = prove_fast_paths(recipe(), chosen(recipe(), device), probes)
    assert probes.calls == [] and choice.probes == {}
    assert (choice.attn_implementation, choice.compile) == ("sdpa", False)


def test_a_failed_probe_under_auto_falls_back_and_records_why(monkeypatch):
    monkeypatch.setattr(attention, "_flex_available", lambda: True)
    probes = Probes(flex=RuntimeError(SHARED_MEMORY))
    choice = prove_fast_paths(recipe(), chosen(recipe(), A10G), probes)
    assert choice.attn_implementation == "sdpa"
    assert "auto chose flex_attention" in choice.attn_reason and SHARED_MEMORY in choice.attn_reason
    # the compiled layer is probed with the attention the run will train with, and passes: compile stays on
    assert probes.calls == ["flex_attention", "compiled_layer(sdpa)"] and choice.compile is True
    assert choice.probes["flex_attention"]["ok"] is False and SHARED_MEMORY in choice.probes["flex_attention"]["error"]
    assert choice.probes["compile"]["ok"] is True and choice.probes["compile"]["seconds"] >= 0

    probes = Probes(compiled=RuntimeError("No valid triton configs. OutOfMemoryError: out of resource"))
    choice = prove_fast_paths(recipe(), chosen(recipe(), A10G), probes)
    assert (choice.attn_implementation, choice.compile) == ("flex_attention", False)
    assert probes.calls == ["flex_attention", "compiled_layer(flex_attention)"]
    assert "failed its probe" in choice.compile_reason and "No valid triton configs" in choice.compile_reason

    # a stand-in that cannot be built says nothing about the kernel; `auto` still takes the safe path
    probes = Probes(flex=ProbeUnavailable("an architecture the probe cannot cut"))
    choice = prove_fast_paths(recipe(), chosen(recipe(), H100), probes)
    assert choice.attn_implementation == "sdpa" and "could not be built" in choice.attn_reason


def test_a_fast_path_the_recipe_sets_that_fails_its_probe_is_refused_naming_the_key():
    flex = recipe(attn_implementation="flex_attention", compile=False)
    with pytest.raises(FastPathError) as err:
        prove_fast_paths(flex, chosen(flex, A10G), Probes(flex=RuntimeError(SHARED_MEMORY)))
    message = str(err.value)
    assert "`attn_implementation: flex_attention` is set in the recipe" in message
    assert "Set `attn_implementation: sdpa`" in message and SHARED_MEMORY in message
    assert "nothing was written" in message and "troubleshooting.md" in message

    compiled = recipe(compile=True, sample_packing=False)
    probes = Probes(compiled=RuntimeError("InductorError: No valid triton configs"))
    with pytest.raises(FastPathError, match=r"`compile: true` is set in the recipe.*Set `compile: false`"):
        prove_fast_paths(compiled, chosen(compiled, A10G), probes)
    # set in the recipe and the stand-in could not be built: the run goes ahead with it, and says so
    probes = Probes(compiled=ProbeUnavailable("an architecture the probe cannot cut"))
    choice = prove_fast_paths(compiled, chosen(compiled, A10G), probes)
    assert choice.compile is True and "not probed" in choice.compile_reason


@pytest.fixture
def no_compiler():
    """Inductor pointed at a C++ compiler that does not exist, and nothing compiled earlier to fall back on: no
    graph in dynamo's memory from an earlier test, no cache on disk (torch's own config.patch: pytest's monkeypatch
    cannot restore a torch config value)."""
    torch.compiler.reset()
    with torch._inductor.config.patch({"force_disable_caches": True, "cpp.cxx": ("/nonexistent/c++",)}):
        yield
    torch.compiler.reset()


def fast_paths_as_on_a_gpu(monkeypatch) -> None:
    """`auto`'s answers patched to the CUDA ones (flex_attention for packed rows, compile on), so the probes run on
    this CPU."""
    monkeypatch.setattr(attention, "choose_attention", lambda recipe, device=None, supports_flex=None: (
        ("flex_attention", "packed rows on CUDA without flash-attn (as on a GPU)")
        if recipe.attn_implementation == "auto" else (recipe.attn_implementation, "set in the recipe")))
    monkeypatch.setattr(regional_compile, "resolve_compile", lambda recipe, device=None: (
        (True, "auto: as on a GPU of compute capability 8.0+") if recipe.compile == "auto"
        else (bool(recipe.compile), "set in the recipe (compile)")))


def test_a_run_whose_auto_fast_paths_fail_their_probes_trains_on_the_safe_paths(make_recipe, tmp_path,
                                                                                 monkeypatch, capsys):
    """The real flex_attention probe fails on this CPU for a real reason (no backward pass); the compiled layer's
    probe is injected to fail the way Triton does on a GPU whose shared memory is too small."""
    from finetune.cli import main

    fast_paths_as_on_a_gpu(monkeypatch)
    triton = RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_0\n"
                          "Required: 114688 Hardware limit: 101376 Reducing block sizes or `num_stages` may help.")

    def compiled_layer_fails(spec, attn):
        raise triton

    monkeypatch.setattr("finetune.model.probes.probe_compiled_layer", compiled_layer_fails)
    path = make_recipe("chat", n=12, adapter="lora", lora_r=2, max_steps=2, sample_packing=True)
    assert main(["train", str(path)]) == 0
    err = capsys.readouterr().err
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["steps"] == 2 and record["attn_implementation"] == "sdpa" and record["compile"] is False
    assert "does not support backward on CPU" in record["attn_reason"]  # torch's own words, from the real probe
    assert "Required: 114688 Hardware limit: 101376" in record["compile_reason"]
    probes = record["fast_path_probes"]
    assert probes["flex_attention"]["ok"] is False and probes["compile"]["ok"] is False
    assert probes["flex_attention"]["seconds"] > 0  # the time it took is recorded (and logged where it passes)
    # said once each, as a warning pointing at the docs
    assert err.count("does not support backward on CPU") == 1 and err.count("Required: 114688") == 1
    assert err.count("WARNING: precision fp32, attention sdpa (auto chose flex_attention") == 1
    assert err.count("WARNING: compile: off (auto: as on a GPU") == 1
    assert err.count("troubleshooting.md#a-gpu-fast-path-does-not-fit-this-gpu") == 2


def test_compile_true_that_fails_its_probe_stops_before_anything_is_written(make_recipe, tmp_path, monkeypatch,
                                                                            capsys, no_compiler):
    from finetune.cli import main

    """A real failure: inductor cannot build the compiled layer without a working C++ compiler."""
    fast_paths_as_on_a_gpu(monkeypatch)
    path = make_recipe("chat", n=12, adapter="lora", lora_r=2, max_steps=2, compile=True)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "`compile: true` is set in the recipe" in err and "Set `compile: false`" in err
    assert "C++ compiler" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # the lock it held is gone, and the folder it made for it


def test_a_kernel_failure_mid_run_names_the_key_and_the_checkpoint_stays(make_recipe, tmp_path, monkeypatch,
                                                                         capsys):
    """Step 1 trains with sdpa and is checkpointed; the run is continued with flex_attention (its probe passes:
    injected), whose first backward on this CPU fails for real in step 2. The run ends with one message naming
    the key; checkpoint step-1 stays complete; with the key set, the next run resumes from it and finishes."""
    from finetune.cli import main
    from finetune.run_folder import Layout, complete_checkpoints

    path = make_recipe("chat", n=16, adapter="lora", lora_r=2, max_steps=1, checkpoint_interval=1)
    assert main(["train", str(path)]) == 0
    out = tmp_path / "out"
    monkeypatch.setattr(attention, "choose_attention", lambda recipe, device=None, supports_flex=None: (
        "flex_attention", "as on a GPU") if recipe.attn_implementation == "auto" else ("sdpa", "set in the recipe"))
    monkeypatch.setattr("finetune.model.probes.probe_flex_attention", lambda spec: 0.0)
    capsys.readouterr()
    assert main(["train", str(path), "--set", "max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "training stopped in step 2: flex_attention failed on CPU" in err
    assert "does not support backward on CPU" in err and "set `attn_implementation: sdpa`" in err
    assert f"`{out / 'checkpoints' / 'step-1'}`, is intact" in err and "Traceback" not in err
    assert [step for step, _ in complete_checkpoints(Layout(out))] == [1]
    assert main(["train", str(path), "--set", "max_steps=3", "--set", "attn_implementation=sdpa"]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["resumed_from"] == str(out / "checkpoints" / "step-1") and record["steps"] == 3


def test_a_compile_failure_is_told_apart_from_other_errors(no_compiler):
    """failed_fast_path on real exceptions: inductor failing to build a kernel is the compile path's only when
    the run compiles; an out-of-memory or an ordinary error is nobody's fast path."""
    with pytest.raises(Exception) as raised:  # the real error inductor raises
        torch.compile(lambda x: (x.sin() * 2.5 + 1.25).cos().sum())(torch.randn(8))
    inductor = raised.value
    settings = types.SimpleNamespace(attn_implementation="sdpa", compile=True)
    assert failed_fast_path(inductor, settings) == ("a compiled decoder layer", "compile: true", "compile: false")
    assert failed_fast_path(inductor, types.SimpleNamespace(attn_implementation="sdpa", compile=False)) is None
    assert failed_fast_path(torch.OutOfMemoryError("CUDA out of memory"), settings) is None
    assert failed_fast_path(ValueError("a bad batch"), settings) is None


def notebook_recipe(name: str = "colab_qlora_quickstart") -> dict:
    """The recipe dict the notebook writes: its parameters cell run, the dict given to yaml.safe_dump evaluated."""
    import nbformat

    nb = nbformat.read(Path(__file__).parent.parent / "examples" / "notebooks" / f"{name}.ipynb", as_version=4)
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    namespace: dict = {}
    exec(params, namespace)  # noqa: S102 constant assignments only
    for cell in nb.cells:
        python = cell.cell_type == "code" and not cell.source.lstrip().startswith("%")  # not `%pip install`
        for node in ast.walk(ast.parse(cell.source)) if python else ():
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "yaml.safe_dump":
                return eval(compile(ast.Expression(node.args[0]), name, "eval"), namespace)  # noqa: S307
    raise AssertionError(f"{name} writes no recipe with yaml.safe_dump")


def test_the_colab_notebooks_recipe_takes_the_safe_path_on_a_t4_by_construction(monkeypatch):
    """The notebook leaves precision, attention and compile to `auto`; on a T4 (compute capability 7.5) `auto`
    picks fp16, sdpa and eager from the capability alone, with or without packing or flash-attn, and nothing is
    probed. The same recipe on an A10G would compile, probed first."""
    from finetune.recipe import Recipe

    monkeypatch.setattr(attention, "_flex_available", lambda: True)
    monkeypatch.setattr(attention.importlib.util, "find_spec", lambda name: object())  # flash-attn "installed" too
    source = notebook_recipe()
    assert source["adapter"] == "qlora"
    assert not {"precision", "attn_implementation", "compile", "sample_packing"} & set(source)  # all left to auto
    for keys in ({}, {"sample_packing": True}):
        notebook = Recipe.model_validate({**source, **keys})
        probes = Probes(flex=RuntimeError("must not run"), compiled=RuntimeError("must not run"))
        choice = prove_fast_paths(notebook, chosen(notebook, T4), probes)
        assert resolve_precision(notebook, T4) == "fp16"
        assert (choice.attn_implementation, choice.compile, probes.calls) == ("sdpa", False, [])
    probes = Probes()
    choice = prove_fast_paths(notebook, chosen(notebook, A10G), probes)
    assert probes.calls and choice.compile is True and choice.probes["compile"]["ok"] is True


# --- on a GPU: the real probes ------------------------------------------------------------------------------


def tiny_recipe(tiny_model_dir, tmp_path, **keys):
    return types.SimpleNamespace(**{"base_model": str(tiny_model_dir), "cache_dir": str(tmp_path / "cache"),
                                    "trust_remote_code": False, "adapter": "lora", "sequence_len": 512, **keys})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the probes prove GPU kernels")
@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_the_real_probes_pass_on_this_gpu_for_the_tiny_model(tiny_model_dir, tmp_path, adapter):
    from finetune.model.device import training_device
    from finetune.train.fast_paths import DeviceProbes

    device = training_device()
    probes = DeviceProbes(tiny_recipe(tiny_model_dir, tmp_path, adapter=adapter), device,
                          resolve_precision(recipe(), device))
    assert probes.flex_attention() > 0
    assert probes.compiled_layer("flex_attention") > 0
    assert probes.compiled_layer("sdpa") > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the probes prove GPU kernels")
def test_a_packed_run_on_this_gpu_records_its_probes(make_recipe, tmp_path):
    from finetune.model.device import training_device
    from finetune.recipe import load_recipe
    from finetune.train import run_training

    if not training_device().fast_paths:
        pytest.skip("below compute capability 8.0 `auto` probes nothing (tested above with a faked T4)")
    summary = run_training(load_recipe(make_recipe("chat", n=16, adapter="lora", sample_packing=True, max_steps=2)))
    probes = summary["fast_path_probes"]
    if summary["attn_implementation"] == "flash_attention_2":
        assert "flex_attention" not in probes
    else:
        assert probes["flex_attention"]["ok"] is True and summary["attn_implementation"] == "flex_attention"
    assert probes["compile"]["ok"] is True and summary["compile"] is True


def _agree_in_a_group(rank: int, port: int, errors: list, results) -> None:
    import torch.distributed as dist

    from finetune.train.fast_paths import agree

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results.put((rank, [agree(error) for error in errors[rank]]))
    finally:
        dist.destroy_process_group()


def test_the_processes_of_one_run_take_the_same_path():
    """Two processes (a gloo group, as a CPU launch forms): a probe that failed on one fails the path on both,
    each saying where; where both passed, both keep it."""
    import multiprocessing

    from finetune.train.launch import free_port

    context = multiprocessing.get_context("fork")  # this process's imports, no second start-up
    results = context.Queue()
    errors = [[None, "out of resource: shared memory", None], [None, None, None]]  # rank -> three probes
    port = free_port()
    procs = [context.Process(target=_agree_in_a_group, args=(rank, port, errors, results)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert got[0] == [None, "out of resource: shared memory", None]
    assert got[1] == [None, "on process 0 of this run: out of resource: shared memory", None]
