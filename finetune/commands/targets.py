"""List a model's modules LoRA can target, with trainable parameters for common presets (config only).

    finetune targets recipe.yml              # the recipe's base model, rank and targets
    finetune targets path/to/model --rank 16 # a model folder, a config.json or a cached hub id
    finetune targets recipe.yml --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from finetune.commands.args import add_overrides
from finetune.errors import ModelError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL_OR_RECIPE",
                        help="a recipe (.yml/.yaml), a model folder, a config.json, a .gguf file or a hub id")
    parser.add_argument("--rank", type=int, default=None, help="LoRA rank for the counts (default: the recipe's, or 8)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_overrides(parser)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (no recipe)")


def is_recipe(path: str) -> bool:
    return Path(path).suffix in (".yml", ".yaml")


def build_report(args: argparse.Namespace):
    from finetune.model.loader import resolve_model_path
    from finetune.model.targets import inspect_model, is_image_text_config, meta_model

    targets = saved = recipe = None
    dora, recipe_keys = False, {}
    if is_recipe(args.model):
        from finetune.model import resolve_precision
        from finetune.model.moe import saved_bytes
        from finetune.recipe import load_recipe

        recipe = load_recipe(args.model, args.overrides)
        source, trust, rank = recipe.base_model, recipe.trust_remote_code, args.rank or recipe.lora_r
        if recipe.adapter != "none":
            targets, saved = recipe.lora_target_modules, recipe.lora_modules_to_save
            dora = recipe.peft_use_dora  # + one magnitude per output feature of each adapted layer
            recipe_keys = dict(target_parameters=recipe.lora_target_parameters, train_router=recipe.train_router,
                               saved_bytes=saved_bytes(resolve_precision(recipe)), alpha=recipe.lora_alpha)
        cache_dir = recipe.cache_dir
    else:
        from finetune.recipe.data import _default_cache_dir

        source, trust, rank, cache_dir = args.model, args.trust_remote_code, args.rank or 8, _default_cache_dir()
    if Path(source).name == "config.json":
        source = str(Path(source).parent)  # a model folder, maybe without weights
    from finetune.plan.model_size import load_config

    config = load_config(resolve_model_path(source, cache_dir), trust)
    model = meta_model(config, trust)
    parts = part_of = names = None
    if is_image_text_config(config):  # a vision-language model: its three parts, and which the recipe freezes
        from finetune.model.vision import lora_target_names, report_parts

        parts, part_of = report_parts(model, recipe)
        if targets is not None:  # its adapters go only where its parts are not frozen: the layers training adapts
            names = lora_target_names(model, recipe)
    recipe_breakdown, warning = moe_breakdown(model, rank, targets, saved, dora, recipe_keys, names)
    report = inspect_model(model, source, rank, targets, saved, dora, parts, part_of, recipe_breakdown, warning)
    report.training = part_training(report, recipe)
    return report


def moe_breakdown(model, rank: int, targets, saved, dora: bool, recipe_keys: dict, names: list[str] | None = None):
    """(what the recipe's adapters train per kind of weight, the expert warning or None). Without a recipe, a
    mixture-of-experts model shows what all-linear + its fused experts would train; a dense one nothing. `names`: the
    layers the recipe's targets come to (a vision-language model's outside its frozen parts), when not the targets."""
    from finetune.model.moe import breakdown, expert_warning
    from finetune.plan.moe import moe_layout

    if targets is not None:
        report = breakdown(model, rank, names if names is not None else targets, recipe_keys.get("target_parameters"),
                           saved, recipe_keys.get("train_router", False), dora, recipe_keys.get("saved_bytes", 4),
                           recipe_keys.get("alpha", 16))
        return report, expert_warning(report, targets, recipe_keys.get("target_parameters"))
    layout = moe_layout(model)
    if layout is None:
        return None, None
    fused = [e.suffix for e in layout.experts if e.fused] or None
    report = breakdown(model, rank, "all-linear", fused)
    report.label = "all-linear" + (f" + lora_target_parameters: [{', '.join(fused)}]" if fused else "")
    return report, None


def part_training(report, recipe) -> dict[str, str]:
    """What trains in each part of a vision-language model under the recipe: its adapter, freeze keys and targets."""
    from finetune.model.targets import matched_groups

    out = {}
    for part, (_, frozen) in report.parts.items():
        groups = [g for g in report.groups if g.part == part]
        weights = sum(g.parameters for g in groups)
        linear = sum(g.count for g in groups if g.targetable and not g.output_layer)
        if frozen:
            out[part] = f"frozen: no gradients, no adapters ({weights:,} weights)"
        elif recipe is None:
            out[part] = f"trains: in full, or adapters on its {linear} linear layers ({weights:,} weights)"
        elif recipe.adapter == "none":
            out[part] = f"trains in full: {weights:,} weights"
        else:
            adapted = [g for g in matched_groups(groups, recipe.lora_target_modules) if not g.output_layer]
            size = sum(g.count * (report.rank * (g.in_features + g.out_features) + (g.out_features if report.dora
                                                                                    else 0)) for g in adapted)
            out[part] = (f"LoRA on {sum(g.count for g in adapted)} of its {linear} linear layers: {size:,} adapter "
                         f"parameters (its {weights:,} weights frozen)")
    return out


def format_report(report) -> str:
    rows = [("module pattern", "class", "shape", "count", "params", "LoRA")]
    frozen = {part for part, (_, is_frozen) in report.parts.items() if is_frozen}
    for g in report.groups:
        lora = ("output layer" if g.output_layer else "frozen part" if g.targetable and g.part in frozen
                else "yes" if g.targetable else "lora_target_parameters" if g.fused_experts else "")
        rows.append((g.pattern, g.cls, g.shape, str(g.count), f"{g.parameters:,}", lora))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{report.architecture} ({report.model_type}) from {report.source}: "
             f"{report.total_parameters:,} parameters (config only, no weights loaded)", ""]
    for part, (prefixes, _) in report.parts.items():  # a vision-language model (finetune/model/vision.py)
        lines.append(f"{part.replace('_', ' ')} ({', '.join(prefixes) or 'none'}): {report.training[part]}")
    lines += [""] if report.parts else []
    lines += ["  ".join(c.ljust(w) if i in (0, 1, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              .rstrip() for r in rows]
    dora = " with DoRA (+ a magnitude per output feature of each adapted layer)" if report.dora else ""
    lines += ["", f"LoRA presets at rank {report.rank}{dora} (trainable of total after adapting, as peft counts):"]
    for p in report.presets:
        targets = p.target_modules if isinstance(p.target_modules, str) else "[" + ", ".join(p.target_modules) + "]"
        saved = f"  modules_to_save: [{', '.join(p.modules_to_save)}]" if p.modules_to_save else ""
        lines.append(f"  {p.name:<40} {p.trainable_parameters:>14,}  {p.trainable_percent:8.4f}%   "
                     f"lora_target_modules: {targets}{saved}")
    lines += ["", "The output layer is left out of all-linear (as peft does); train it in full with "
                  "lora_modules_to_save instead."]
    if report.recipe is not None:
        lines += ["", *recipe_lines(report.recipe)]
    if report.warning:
        lines += ["", f"warning: {report.warning}"]
    return "\n".join(lines)


def recipe_lines(recipe) -> list[str]:
    """What the recipe's adapters train, per kind of weight (expert, shared expert, router, attention, other for a
    mixture-of-experts model), and the adapter's size on disk."""
    layout = recipe.layout
    lines = []
    if layout is not None:
        top_k = f"top-{layout.top_k}" if layout.top_k else "top-k unknown"
        lines.append(f"Mixture-of-experts: {layout.num_experts} experts per MoE layer ({top_k}), "
                     f"{'fused 3-D weights (lora_target_parameters)' if layout.fused else 'one Linear per expert'}; "
                     f"routers {', '.join(sorted({n.rsplit('.', 1)[-1] for n in layout.routers})) or '-'}.")
    rows = [("weights", "params", "trained", "share", "LoRA added", "full copies")]
    for r in recipe.rows:
        if layout is None and r.kind not in ("attention", "other") or not r.parameters:
            continue
        share = f"{100 * r.adapted / r.parameters:.1f}%"
        rows.append((r.kind, f"{r.parameters:,}", f"{r.adapted:,}", share, f"{r.lora:,}", f"{r.saved:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.append(f"What {recipe.label} train{'s' if recipe.label.startswith('all-linear') else ''}:")
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in rows]
    lines.append(f"  adapter: {recipe.trainable:,} trainable parameters, {recipe.adapter_bytes / 1e6:.3f} MB "
                 f"({recipe.adapter_bytes:,} bytes: LoRA weights in fp32, full copies in the base's dtype)")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.rank is not None and args.rank <= 0:
        raise ModelError(f"--rank must be a positive integer, got {args.rank}")
    report = build_report(args)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0
