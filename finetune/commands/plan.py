"""Memory and steps plan for a recipe or a model config: per-GPU bytes by component and a fits / doesn't verdict.

    finetune plan recipe.yml --gpu h100 --num-gpus 2
    finetune plan path/to/model_folder --adapter qlora --seq-len 4096 --micro-batch-size 2 --gpu rtx-4090
    finetune plan path/to/model_folder --method dpo --micro-batch-size 4 --gpu h100   # 4 pairs = 8 sequences

A preference method (`method: dpo`...) is planned with both sequences of every pair in the micro batch and no
reference weights: the reference log-probs are computed once before training and cached, so the run holds one
model. Its step count is exact, from the tokenized pairs (KTO: two examples per pair). `method: grpo` is planned
with micro_batch_size completions of sequence_len tokens per micro batch and, on its own line, the KV cache of the
completions a step generates (finetune/plan/grpo.py); its steps in prompts, completions and generations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from finetune.commands.args import add_overrides
from finetune.errors import FinetuneError
from finetune.plan.activations import ATTENTION
from finetune.plan.memory import GIB
from finetune.plan.report import compute_line, format_plan
from finetune.recipe.methods import METHODS

# flag -> recipe field. Planning from a bare model config, a knob without its flag takes the recipe schema's
# default (finetune/recipe/schema.py is the only place a default lives).
KNOBS = {
    "adapter": "adapter", "lora_r": "lora_r", "precision": "precision", "optimizer": "optimizer",
    "seq_len": "sequence_len", "micro_batch_size": "micro_batch_size",
    "gradient_checkpointing": "gradient_checkpointing", "attn": "attn_implementation", "method": "method",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a YAML recipe, or a model: folder with config.json, config.json, or hub id")
    add_overrides(parser)
    parser.add_argument("--gpu", default=None, help="GPU for the verdict: h100, h200, a100-80gb, l40s, rtx-4090, t4...")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="memory per GPU, for a GPU not in the table")
    parser.add_argument("--num-gpus", type=int, default=1, help="data-parallel GPUs (default 1)")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=0, help="DeepSpeed ZeRO stage")
    parser.add_argument("--fsdp", action="store_true",
                        help="FSDP2 over --num-gpus (a recipe with `fsdp:` plans it, with its settings, anyway)")
    parser.add_argument("--adapter", choices=("none", "lora", "qlora"), default=None)
    parser.add_argument("--lora-r", type=int, default=None)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None)
    parser.add_argument("--optimizer", default=None, help="adamw_torch, adamw_8bit, paged_adamw_8bit, sgd, adafactor...")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (recipe: sequence_len)")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--gradient-checkpointing", choices=("off", "mlp", "full"), default=None)
    parser.add_argument("--attn", choices=ATTENTION, default=None)
    parser.add_argument("--method", choices=METHODS, default=None,
                        help="training method: a preference pair (dpo, ipo, orpo, simpo, reward) is two sequences")
    parser.add_argument("--no-data", action="store_true", help="with a recipe: skip tokenizing, so no step count")


def _is_recipe(source: str) -> bool:
    return Path(source).suffix in (".yml", ".yaml")


def _auto_precision(args: argparse.Namespace) -> str:
    """`precision: auto` as a run on the planned GPU resolves it (the same rule training applies to its device).
    Without --gpu the card is unknown: plan for one with bf16, as every GPU of the last generations has."""
    from finetune.plan.precision import resolve_precision

    native_bf16 = True
    if args.gpu:
        from finetune.plan.gpus import find_gpu

        native_bf16 = find_gpu(args.gpu).native_bf16
    return resolve_precision("auto", has_gpu=True, native_bf16=native_bf16)


def _precision_warning(args: argparse.Namespace, precision: str) -> str | None:
    """An explicit bf16 on a GPU without bf16 tensor cores: say so before the run finds out."""
    if precision != "bf16" or not args.gpu:
        return None
    from finetune.plan.gpus import find_gpu

    gpu = find_gpu(args.gpu)
    if gpu.native_bf16:
        return None
    return (f"warning: {gpu.name} has no bf16 tensor cores (bf16 runs emulated, several times slower); "
            "use `precision: auto` (fp16 there) or `precision: fp16`")


def _knobs(args: argparse.Namespace, recipe) -> dict:
    """Each knob from the flag, else the recipe, else the bare-config default."""
    out = {}
    from finetune.recipe import Recipe

    for flag, field in KNOBS.items():
        value = getattr(args, flag)
        if value is None:
            value = getattr(recipe, field) if recipe is not None else Recipe.model_fields[field].get_default()
        out[flag] = value
    if out["precision"] == "auto":
        out["precision"] = _auto_precision(args)
        out["precision_from"] = f"auto on {args.gpu}" if args.gpu else "auto, assuming a bf16 GPU; pass --gpu"
    if out["attn"] == "auto":
        out["attn"] = "sdpa"  # flash_attention_2 keeps the same activations
    if isinstance(out["gradient_checkpointing"], bool):
        out["gradient_checkpointing"] = "full" if out["gradient_checkpointing"] else "off"
    out["packed"] = bool(recipe.sample_packing) if recipe is not None else False
    if out["method"] == "grpo":
        out.update(_grpo_knobs(recipe, out["micro_batch_size"]))
        if recipe is not None:
            from finetune.plan.model_size import reward_model_loads

            out["reward_models"] = reward_model_loads(recipe) or ()  # loaded beside the policy (plan/grpo.py)
    return out


def _grpo_knobs(recipe, micro_batch_size: int) -> dict:
    """What GRPO's plan needs besides the common knobs: the recipe's, else the method's defaults (bare config)."""
    import math

    from finetune.recipe.methods import METHOD_SETTINGS, method_setting

    def setting(key):
        return method_setting(recipe, key) if recipe is not None else METHOD_SETTINGS[key]["grpo"]

    group = setting("num_generations")
    # a bare config has no accumulation: take the smallest that holds whole groups, G / gcd(micro_batch_size, G)
    accumulation = (recipe.gradient_accumulation_steps if recipe is not None
                    else group // math.gcd(micro_batch_size, group))
    # each process generates G completions for each of its prompts of a step: micro_batch_size x accumulation
    return {"group": group, "completion_tokens": setting("max_completion_length"), "rl_beta": setting("rl_beta"),
            "generated_sequences": micro_batch_size * accumulation}


def _batch_shape(knobs: dict) -> dict:
    """PlanInputs' sequences_per_item / packed: a preference pair is two sequences (chosen, rejected)."""
    from finetune.recipe.methods import PAIRED_METHODS

    shape = {"sequences_per_item": 2 if knobs["method"] in PAIRED_METHODS else 1, "packed": knobs["packed"]}
    if knobs["method"] == "grpo":
        shape.update(generated_sequences=knobs["generated_sequences"], completion_tokens=knobs["completion_tokens"],
                     reward_models=knobs.get("reward_models", ()))
    return shape


def _budget(args: argparse.Namespace) -> tuple[float | None, str]:
    if args.gpu_memory_gib:
        return args.gpu_memory_gib * GIB, f"{args.gpu_memory_gib:g} GiB GPU"
    if args.gpu:
        from finetune.plan.gpus import find_gpu

        gpu = find_gpu(args.gpu)
        return gpu.memory_bytes, f"{gpu.name} ({gpu.memory_mib / 1024:.1f} GiB)"
    return None, ""


def _steps_line(recipe, world_size: int) -> str:
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor
    from finetune.plan.steps import check_batch_fits, optimizer_steps
    from finetune.train.settings import step_unit

    prepared = build_dataset(recipe, *tokenizer_and_processor(recipe))
    if recipe.method == "grpo":
        return _grpo_steps_line(recipe, prepared.stats["train"], world_size)
    train = prepared.train_counts()  # packed rows with sample_packing: what the steps are made of
    few = check_batch_fits(prepared.stats["train"]["examples"], recipe.micro_batch_size,
                           recipe.gradient_accumulation_steps, world_size, step_unit(recipe),
                           train["examples"] if prepared.stats.get("packing", {}).get("train") else None)
    if few:
        print(f"warning: {few}", file=sys.stderr)
    total = optimizer_steps(train["examples"], recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                            world_size, recipe.num_epochs, recipe.max_steps)
    per_epoch = optimizer_steps(train["examples"], recipe.micro_batch_size, recipe.gradient_accumulation_steps,
                                world_size, 1, None)
    packed = prepared.stats.get("packing", {}).get("train")
    items = _items(recipe, prepared.stats["train"])
    what = f"{train['examples']:,} packed rows ({items.split(' (')[0]})" if packed else items
    supervised = "response tokens" if recipe.method != "sft" else "supervised"
    return (f"steps: {total:,} optimizer steps ({per_epoch:,} per epoch); {what}, "
            f"{train['tokens']:,} tokens, {train['supervised_tokens']:,} {supervised} "
            f"(~{train['supervised_tokens'] / per_epoch:,.0f} per step)")


def _grpo_steps_line(recipe, split: dict, world_size: int) -> str:
    """GRPO's steps: prompts per step, completions per step, generations and optimizer steps (plan/grpo.py)."""
    from finetune.plan.grpo import grpo_steps
    from finetune.recipe.methods import method_setting

    steps = grpo_steps(split["examples"], recipe.micro_batch_size, recipe.gradient_accumulation_steps, world_size,
                       method_setting(recipe, "num_generations"), method_setting(recipe, "num_iterations"),
                       recipe.num_epochs, recipe.max_steps)
    waiting = steps.prompts - steps.prompts_used_per_epoch
    return (f"steps: {steps.total_steps:,} optimizer steps ({steps.steps_per_epoch:,} per epoch); {steps.prompts:,} "
            f"prompts ({split['tokens']:,} prompt tokens); {steps.prompts_per_step:,} prompts per step "
            f"({steps.prompts_per_process:,} per process) x {steps.group} = {steps.completions_per_step:,} completions "
            f"per step; {steps.generations:,} generations ({steps.generations_per_epoch:,} per epoch), each trained "
            f"{steps.iterations} step(s) (num_iterations)"
            + (f"; {waiting:,} prompts an epoch wait for a later shuffle (whole steps only)" if waiting else ""))


def _items(recipe, split: dict) -> str:
    """What the training split holds, in the method's unit: examples, pairs, or KTO examples (a pair is two)."""
    from finetune.recipe.methods import PAIRED_METHODS

    n = split["examples"]
    if recipe.method in PAIRED_METHODS:
        return f"{n:,} pairs (2 sequences each)"
    if recipe.method == "kto":
        return (f"{n:,} KTO examples ({split.get('desirable', 0):,} desirable, {split.get('undesirable', 0):,} "
                "undesirable; a pair counts as one of each)")
    return f"{n:,} examples"


def _load(args: argparse.Namespace):
    """(recipe or None, HF config)."""
    from finetune.plan.model_size import load_config

    if not _is_recipe(args.source):
        if args.overrides:
            raise FinetuneError("--set applies to a recipe; with a model config use the flags (--adapter, --seq-len...)")
        return None, load_config(args.source)
    from finetune.model.families import generic_path
    from finetune.model.loader import resolve_model_path
    from finetune.recipe import load_recipe

    recipe = load_recipe(args.source, args.overrides, world_size=args.num_gpus)
    config = load_config(resolve_model_path(recipe.base_model, recipe.cache_dir), recipe.trust_remote_code)
    return generic_path(recipe, config), config  # what train plans: a family's refusal, or padded rows


def _fsdp_knobs(args: argparse.Namespace, recipe) -> dict:
    """FSDP2: the recipe's `fsdp:` (its reshard and offload settings), or `--fsdp` with the defaults."""
    from finetune.plan.run_memory import fsdp_shape

    knobs = fsdp_shape(recipe) if recipe is not None else {}
    if args.fsdp and not knobs:
        knobs = {"fsdp": True}
    if knobs and args.zero_stage:
        raise FinetuneError("--zero-stage plans DeepSpeed ZeRO and `fsdp` plans FSDP2: a run uses one; drop one")
    if args.fsdp and recipe is not None and recipe.fsdp is None:  # a recipe with `fsdp:` was checked as it loaded
        _refuse_what_train_refuses(recipe)
    return knobs


def _refuse_what_train_refuses(recipe) -> None:
    """`--fsdp` on a recipe without `fsdp:`: what `finetune train` would refuse with `fsdp: true`, in its words
    (recipe/distributed.py's fsdp_problems, the one source for both), instead of a plan for a run that never starts."""
    from finetune.recipe.distributed import FSDPSpec, fsdp_problems

    problems = fsdp_problems(recipe.model_copy(update={"fsdp": FSDPSpec()}))
    if problems:
        raise FinetuneError("--fsdp: `finetune train` refuses this recipe under `fsdp`, so there is no FSDP plan "
                            "for it:\n" + "\n".join(f"  - {problem}" for problem in problems))


def _vision(args: argparse.Namespace, recipe, config, adapter: str):
    """A vision-language model's parts and one image at the pixel budget (finetune/model/vision_budget.py); None
    for a text model."""
    from finetune.model.targets import is_image_text_config

    if not is_image_text_config(config):
        return None
    from finetune.model.vision_budget import plan_vision

    if recipe is not None:
        from finetune.model.vision import tokenizer_and_processor

        return plan_vision(config, tokenizer_and_processor(recipe)[1], recipe, adapter)
    from transformers import AutoProcessor

    from finetune.recipe.vision import VisionKeys

    try:
        processor = AutoProcessor.from_pretrained(args.source)
    except (OSError, ValueError, ImportError) as exc:
        raise FinetuneError(f"`{args.source}` is a vision-language model, and planning it needs its processor (an "
                            f"image's tokens): {exc.__class__.__name__}: {str(exc)[:200]}; pass its folder with the "
                            "processor files, or a recipe") from None
    return plan_vision(config, processor, VisionKeys(), adapter)


def _vision_counts(vision) -> dict:
    return {} if vision is None else {"model": vision.model, "frozen": vision.frozen, "unquantized": vision.unquantized}


def run(args: argparse.Namespace) -> int:
    from finetune.plan.budget import PlanInputs, plan_memory, verdict
    from finetune.plan.model_size import count_model

    recipe, config = _load(args)
    knobs = _knobs(args, recipe)
    if knobs["method"] == "grpo" and args.zero_stage == 3:
        from finetune.recipe.grpo import ZERO3_REFUSAL

        raise FinetuneError(f"--zero-stage 3: `finetune train` refuses this, so there is no plan for it: "
                            f"{ZERO3_REFUSAL}; plan it with --zero-stage 2")
    from finetune.recipe import Recipe

    defaults = Recipe.model_fields  # a bare model config: the schema's defaults
    targets = recipe.lora_target_modules if recipe is not None else defaults["lora_target_modules"].get_default()
    to_save = recipe.lora_modules_to_save if recipe is not None else defaults["lora_modules_to_save"].get_default()
    dora = recipe is not None and recipe.peft_use_dora  # + magnitudes, and their saved outputs (plan/budget.py)
    parameters = recipe.lora_target_parameters if recipe is not None else None  # fused MoE experts
    vision = _vision(args, recipe, config, knobs["adapter"])  # a vision-language model's tower and projector
    shape, full, lora = count_model(config, knobs["lora_r"], targets, to_save, dora, parameters,
                                     reward=knobs["method"] == "reward", **_vision_counts(vision))
    inputs = PlanInputs(shape, full, lora, adapter=knobs["adapter"], precision=knobs["precision"],
                        optimizer=knobs["optimizer"], seq_len=knobs["seq_len"],
                        micro_batch_size=knobs["micro_batch_size"],
                        gradient_checkpointing=knobs["gradient_checkpointing"], attn=knobs["attn"],
                        zero_stage=args.zero_stage, num_gpus=args.num_gpus, **_batch_shape(knobs),
                        **_fsdp_knobs(args, recipe), vision=vision.shape if vision else None)
    print("\n".join(format_plan(plan_memory(inputs), knobs, shape, inputs.trainable)))
    print(compute_line(shape, inputs.trainable if knobs["adapter"] != "none" else None, knobs["seq_len"]))
    if vision is not None:
        from finetune.plan.vision import describe

        print(describe(vision.shape, inputs.micro_batch_rows()[0], 4 if knobs["precision"] == "fp32" else 2))
    warning = _precision_warning(args, knobs["precision"])
    if warning:
        print(warning)
    if recipe is not None and not args.no_data:
        print(_steps_line(recipe, args.num_gpus))
    budget, label = _budget(args)
    if budget is None:
        print("verdict: pass --gpu NAME (or --gpu-memory-gib N) for a fits / doesn't verdict")
        return 0
    result = verdict(inputs, budget)
    print(f"{result.headline()} on {label}")
    for line in result.suggestions:
        print(f"  - {line}")
    return 0 if result.fits else 1
