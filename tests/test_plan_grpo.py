"""`finetune plan` for GRPO: the KV cache of a step's generation on its own line (checked by hand arithmetic), the
peak as the larger of generating and scoring, and the step numbers in prompts, completions and generations, equal
to what the GRPO sampler hands the Trainer."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from finetune.cli import main
from finetune.plan.budget import PlanInputs, plan_memory
from finetune.plan.grpo import Generation, grpo_steps, kv_cache_bytes
from grpo_helpers import grpo_recipe
from test_plan_preference import _llama7b


def test_plan_a_grpo_recipe_prints_the_kv_cache_by_its_factors(tmp_path, tiny_model_dir, capsys):
    path = grpo_recipe(tmp_path, tiny_model_dir, max_steps=None, num_epochs=1)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    # the tiny model (tests/tiny.py): 2 layers, 2 kv heads, hidden 64 / 4 heads = head dim 16; fp32: 4 bytes. The
    # recipe: micro_batch_size 4 x accumulation 2 = 8 completions a step = G 4 x 2 prompts; sequence_len 64 =
    # 56 prompt + 8 completion tokens. 2 x 2 x 2 x 16 x 4 x 8 x 64 = 262,144 bytes
    by_hand = 2 * 2 * 2 * 16 * 4 * 8 * 64
    assert by_hand == 262_144
    line = next(x for x in out.splitlines() if x.startswith("generation:"))
    assert ("2 (K and V) x 2 layers x 2 kv heads x 16 head dim x 4 bytes x 8 sequences (G 4 x 2 prompts) x 64 tokens "
            "(56 prompt + 8 completion) = 262,144 bytes") in line
    assert "generation KV cache" in out  # a component of the memory table too
    assert "4 completions x 64 tokens (prompt <= 56 + completion <= 8) per micro batch" in out
    assert "reference: none (rl_beta 0" in out
    # 16 prompts, 2 a step: 8 steps, 8 generations, 8 completions a step
    steps = next(x for x in out.splitlines() if x.startswith("steps:"))
    assert steps.startswith("steps: 8 optimizer steps (8 per epoch); 16 prompts")
    assert "2 prompts per step (2 per process) x 4 = 8 completions per step; 8 generations (8 per epoch)" in steps


def test_the_plans_kv_cache_follows_precision_and_the_step(tmp_path, tiny_model_dir, capsys):
    path = str(grpo_recipe(tmp_path, tiny_model_dir))

    def kv(*overrides) -> int:
        assert main(["plan", path, "--no-data", *[a for o in overrides for a in ("--set", o)]]) == 0
        return int(re.search(r"= ([\d,]+) bytes", capsys.readouterr().out).group(1).replace(",", ""))

    base = kv()
    assert kv("precision=bf16") == base // 2  # 2 bytes a value
    assert kv("gradient_accumulation_steps=4") == 2 * base  # twice the prompts generated at once
    assert kv("sequence_len=128") == 2 * base  # twice the tokens (120 prompt + 8 completion)
    assert kv("num_generations=8") == base  # the same 8 sequences: G 8 x 1 prompt


def test_the_peak_is_generation_or_scoring_whichever_is_larger():
    shape, full, lora = _llama7b()  # 32 layers, 32 kv heads, head dim 128
    one = PlanInputs(shape, full, lora, adapter="lora", precision="bf16", seq_len=2048, micro_batch_size=8,
                     gradient_checkpointing="full", generated_sequences=8, completion_tokens=512)
    estimate = plan_memory(one)
    kv = estimate.components["generation KV cache"]
    assert kv == kv_cache_bytes(shape, Generation(8, 1536, 512, 2)) == 2 * 32 * 32 * 128 * 2 * 8 * 2048
    # one micro batch a step: the scoring activations of 8 full rows outweigh the 8 sequences' cache
    assert estimate.components["activations"] > kv
    assert estimate.peak_allocated == pytest.approx(estimate.model_states + estimate.components["activations"]
                                                   + estimate.components["autocast weight cache"])
    # 16 micro batches a step: 128 completions generated at once, the cache is the peak; the activations are the
    # same (one micro batch at a time) and the two are never added
    many = plan_memory(replace(one, generated_sequences=128))
    assert many.components["activations"] == estimate.components["activations"]
    assert many.components["generation KV cache"] == 16 * kv > many.components["activations"]
    assert many.peak_allocated == pytest.approx(many.model_states + 16 * kv)
    # an SFT plan of the same shape has no such line
    assert "generation KV cache" not in plan_memory(replace(one, generated_sequences=0)).components


@pytest.mark.parametrize("prompts, mbs, accumulation, processes, group, iterations, epochs, max_steps", [
    (16, 4, 2, 1, 4, 1, 1, None),
    (23, 4, 3, 2, 4, 2, 1, None),  # 6 prompts a step: 3 steps' worth, the 5 left wait for a later shuffle
    (40, 8, 1, 2, 8, 3, 1.5, None),  # fractional epochs stop mid-epoch, as the Trainer counts
    (10, 2, 4, 1, 4, 1, 3, 7),  # max_steps wins
])
def test_grpo_steps_are_what_the_sampler_hands_the_trainer(prompts, mbs, accumulation, processes, group, iterations,
                                                           epochs, max_steps):
    from finetune.plan.steps import optimizer_steps
    from finetune.train.grpo.sampler import GroupSampler, StepShape

    steps = grpo_steps(prompts, mbs, accumulation, processes, group, iterations, epochs, max_steps)
    # the run's count: the Trainer iterates the sampler's completion slots, micro_batch_size at a time
    slots = len(GroupSampler(prompts, StepShape(group, mbs, accumulation, processes, iterations), seed=0))
    assert steps.total_steps == optimizer_steps(slots, mbs, accumulation, processes, epochs, max_steps)
    assert steps.steps_per_epoch == optimizer_steps(slots, mbs, accumulation, processes, 1, None)
    assert steps.completions_per_step == mbs * accumulation * processes
    assert slots == steps.prompts_used_per_epoch * group * iterations
    assert steps.generations == -(-steps.total_steps // iterations)


def test_grpo_steps_refuse_what_cannot_make_a_step():
    from finetune.errors import FinetuneError

    with pytest.raises(FinetuneError, match="not a multiple of num_generations 4"):
        grpo_steps(16, 3, 1, 1, 4, 1, 1, None)
    with pytest.raises(FinetuneError, match="3 training prompts, but one optimizer step takes 4"):
        grpo_steps(3, 4, 4, 1, 4, 1, 1, None)


def test_plan_a_model_config_for_grpo(tmp_path, tiny_model_dir, capsys):
    """No recipe: the method's defaults (G 8, 256-token completions) and the smallest accumulation that holds
    whole groups (G / gcd(micro_batch_size, G): 8 / gcd(2, 8) = 4, so 2 x 4 = 8 completions)."""
    assert main(["plan", str(tiny_model_dir), "--method", "grpo", "--micro-batch-size", "2", "--seq-len", "512"]) == 0
    out = capsys.readouterr().out
    assert "8 sequences (G 8 x 1 prompts) x 512 tokens (256 prompt + 256 completion)" in out


def test_the_runs_own_memory_plan_counts_generation(tmp_path, tiny_model_dir):
    from finetune.plan.run_memory import recipe_shape
    from finetune.recipe import load_recipe

    recipe = load_recipe(grpo_recipe(tmp_path, tiny_model_dir, max_completion_length=16))
    assert recipe_shape(recipe) == {"sequences_per_item": 1, "packed": False, "generated_sequences": 8,
                                    "completion_tokens": 16}


def test_plan_refuses_grpo_under_zero3_in_trains_words(tmp_path, tiny_model_dir, capsys):
    """`finetune plan --zero-stage 3` said FITS for GRPO, which train refuses under ZeRO-3: the same reason now, and
    a plan too big for its GPUs never suggests ZeRO-3 for GRPO (zero2 is what it can use)."""
    from finetune.recipe import load_recipe
    from finetune.recipe.load import RecipeError

    path = grpo_recipe(tmp_path, tiny_model_dir)
    (tmp_path / "zero3.json").write_text('{"zero_optimization": {"stage": 3}}')
    with pytest.raises(RecipeError) as caught:  # train: the recipe under ZeRO-3 does not load
        load_recipe(path, ["deepspeed=zero3.json"])
    refused = [p for p in caught.value.problems if "ZeRO-3" in p]
    assert refused
    for source in ([str(path)], [str(tiny_model_dir), "--method", "grpo"]):
        assert main(["plan", *source, "--zero-stage", "3", "--no-data", "--gpu-memory-gib", "80"]) == 2
        out = capsys.readouterr()
        assert "FITS" not in out.out and refused[0] in out.err and "Traceback" not in out.err
    # 2 GPUs, a budget the plan overshoots: the suggestions stop at ZeRO stage 2 for GRPO, stage 3 for SFT
    args = ["--zero-stage", "1", "--num-gpus", "2", "--no-data", "--gpu-memory-gib", "0.5"]
    assert main(["plan", str(path), *args]) == 1
    out = capsys.readouterr().out
    assert "DeepSpeed ZeRO stage 2 across the 2 GPUs" in out and "ZeRO stage 3" not in out
    assert "even with all of these" in out  # the combined changes got past the ZeRO one (IndexError: no colon)
    assert main(["plan", str(tiny_model_dir), "--adapter", "lora", *args]) == 1  # SFT
    assert "DeepSpeed ZeRO stage 3 across the 2 GPUs" in capsys.readouterr().out
