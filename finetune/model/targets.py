"""The LoRA target-module inspector: what a model is made of and what LoRA presets would train.

Works from the config alone: the model is built on torch's `meta` device (shapes, no storage, no weights
downloaded), so a 70B model is inspected in a second. Counts follow peft exactly:
- a LoRA adapter on a layer with `in` inputs and `out` outputs adds A (r x in) + B (out x r) = r * (in + out);
- `all-linear` means every Linear / Conv1D except the output layer (lm_head);
- a module in `modules_to_save` is trained as a full copy (a tied embedding / lm_head pair is copied twice);
- the total is peft's: the base parameters (tied weights once) plus everything added.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

from finetune.errors import ModelError
from finetune.plan.moe import ATTENTION_NAMES, pattern_of  # one rule: the inspector's groups and the MoE kinds


@dataclass
class ModuleGroup:
    """Modules that differ only by layer index, e.g. `model.layers.*.self_attn.q_proj`."""

    pattern: str
    cls: str
    shape: str  # `in -> out` for layers LoRA can target, the weight shape otherwise
    count: int
    parameters: int  # all of them together
    targetable: bool  # a Linear / Conv1D LoRA can adapt
    output_layer: bool = False  # lm_head: left out of `all-linear`
    fused_experts: bool = False  # holds 3-D expert weights: LoRA reaches them with lora_target_parameters only
    in_features: int = 0
    out_features: int = 0
    names: list[str] = field(default_factory=list, repr=False)
    part: str = ""  # a vision-language model's part: vision_tower, multi_modal_projector or language_model

    @property
    def suffix(self) -> str:
        """The name peft matches across layers: what follows the last layer index (`self_attn.q_proj`)."""
        return self.pattern.rsplit("*.", 1)[-1]


@dataclass
class Preset:
    name: str
    target_modules: list[str]
    modules_to_save: list[str]
    trainable_parameters: int
    total_parameters: int

    @property
    def trainable_percent(self) -> float:
        return 100.0 * self.trainable_parameters / self.total_parameters


def linear_features(module) -> tuple[int, int] | None:
    """(in, out) of a layer LoRA can adapt (nn.Linear, bitsandbytes' Linear4bit/8bit, transformers' Conv1D)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, Conv1D):  # GPT-2 style: weight is (in, out)
        return module.weight.shape[0], module.nf
    return None


def _group_key(name: str) -> str:
    return pattern_of(name)


def module_groups(model, part_of=None) -> list[ModuleGroup]:
    """Every module that holds parameters itself, grouped by pattern, in model order. `part_of`: a vision-language
    model's name -> part (finetune/model/vision.py: Parts.part_of), recorded on each group."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    groups: dict[str, ModuleGroup] = {}
    for name, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        features = linear_features(module)
        if not own and features is None:
            continue
        key = _group_key(name)
        group = groups.get(key)
        if group is None:
            weight = getattr(module, "weight", None)
            stacked = [p for p in own if p.dim() == 3]  # fused experts: (experts, a, b) each
            shape = (f"{features[0]} -> {features[1]}" if features
                     else "x".join(str(d) for d in weight.shape) if weight is not None
                     else ", ".join("x".join(str(d) for d in p.shape) for p in stacked) if stacked else "-")
            group = groups[key] = ModuleGroup(
                pattern=key, cls=type(module).__name__, shape=shape, count=0, parameters=0,
                targetable=features is not None, output_layer=module is output,
                in_features=features[0] if features else 0, out_features=features[1] if features else 0,
                part=(part_of(name) or "") if part_of else "", fused_experts=bool(stacked))
        group.count += 1
        group.parameters += sum(p.numel() for p in own)
        group.names.append(name)
    return list(groups.values())


def matches(name: str, target: str) -> bool:
    """peft's rule: a target names a module exactly or is a dotted suffix of its name."""
    return name == target or name.endswith("." + target)


def matched_groups(groups: list[ModuleGroup], targets) -> list[ModuleGroup]:
    """The targetable groups `targets` (a list of names/suffixes, or `all-linear`) selects."""
    if targets == "all-linear":
        return [g for g in groups if g.targetable and not g.output_layer]
    return [g for g in groups if g.targetable and any(matches(n, t) for n in g.names for t in targets)]


def check_targets(groups: list[ModuleGroup], targets) -> None:
    """ModelError when `targets` select nothing LoRA can adapt, listing what the model has."""
    if targets == "all-linear" or matched_groups(groups, targets):
        return
    targetable = [g for g in groups if g.targetable]
    untargetable = [g.pattern for g in groups if not g.targetable and any(
        matches(n, t) for n in g.names for t in targets)]
    listing = ", ".join(f"{g.suffix} ({g.count}x {g.cls})" for g in targetable)
    extra = f" ({', '.join(untargetable)} matched, but LoRA cannot adapt those)" if untargetable else ""
    raise ModelError(
        f"`lora_target_modules` {list(targets)} match no layer LoRA can adapt in this model{extra}. "
        f"Layers it can adapt: {listing}. Use some of these names, or `all-linear`; "
        "`finetune targets RECIPE` shows them with parameter counts."
    )


def unique_parameter_count(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def ties_embeddings(model) -> bool:
    """Whether the output layer shares its weight with the input embeddings (GPT-2, Gemma, small Qwen2)."""
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def saved_module_parameters(model, modules_to_save: list[str]) -> int:
    """Parameters of the full copies peft trains for `modules_to_save`. Each matched module gets its own copy,
    except a tied embedding / lm_head pair, which build_model keeps tied (peft's `ensure_weight_tying`)."""
    modules = [m for n, m in model.named_modules() if any(matches(n, t) for t in modules_to_save)]
    if ties_embeddings(model):
        return sum(p.numel() for p in {id(p): p for m in modules for p in m.parameters()}.values())
    return sum(p.numel() for m in modules for p in m.parameters())


def preset(model, groups, name: str, targets, modules_to_save: list[str], rank: int, base_total: int,
           dora: bool = False, frozen=()) -> Preset:
    # A (r x in) and B (out x r) per adapted layer; DoRA adds its magnitude vector, one number per output feature
    per_layer = (lambda g: rank * (g.in_features + g.out_features) + (g.out_features if dora else 0))
    # a vision-language model's frozen parts get no adapters (finetune/model/vision.py: lora_target_names)
    lora = sum(per_layer(g) * g.count for g in matched_groups(groups, targets) if g.part not in frozen)
    saved = saved_module_parameters(model, modules_to_save)
    trainable = lora + saved
    target_list = targets if targets == "all-linear" else sorted(set(targets))
    return Preset(name, target_list, list(modules_to_save), trainable, base_total + trainable)


def embedding_module_names(model) -> list[str]:
    """The last name component of the input embeddings and, when there is one, the output layer."""
    wanted = [model.get_input_embeddings(), model.get_output_embeddings()]
    names = [n.rsplit(".", 1)[-1] for m in wanted if m is not None for n, mod in model.named_modules() if mod is m]
    return list(dict.fromkeys(names))


def default_qv_targets(model, groups) -> list[str]:
    """peft's per-architecture default (q_proj, v_proj for most; c_attn for GPT-2)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

    known = defaults.get(getattr(model.config, "model_type", ""))
    if known:
        return list(known)
    return sorted({g.suffix for g in groups if g.targetable and g.suffix.endswith(("q_proj", "v_proj"))})


def presets(model, groups, rank: int, recipe_targets=None, recipe_saved=None, dora: bool = False,
            frozen=(), recipe_breakdown=None) -> list[Preset]:
    base_total = unique_parameter_count(model)
    attention = sorted({g.suffix for g in groups if g.targetable and not g.output_layer
                        and set(g.pattern.split(".")) & set(ATTENTION_NAMES)})
    out = []
    qv = default_qv_targets(model, groups)
    make = functools.partial(preset, model, groups, rank=rank, base_total=base_total, dora=dora, frozen=frozen)
    if qv and matched_groups(groups, qv):
        out.append(make("q,v", qv, []))
    if attention:
        out.append(make("all attention", attention, []))
    out.append(make("all-linear", "all-linear", []))
    out.append(make("all-linear + embeddings/lm_head saved", "all-linear", embedding_module_names(model)))
    if recipe_targets is not None:
        settled = recipe_breakdown.targets if recipe_breakdown is not None else None
        modules = settled.modules if settled is not None else recipe_targets  # after peft's conversion
        if modules or settled is None or not settled.parameters:
            check_targets(groups, modules)
        if recipe_breakdown is None or frozen:  # a vision-language model's row counts only its unfrozen parts
            out.append(make("recipe", recipe_targets, recipe_saved or []))
            return out
        # the recipe's row counts what build_model hands peft: parameter targets, frozen or trained routers too
        trainable = recipe_breakdown.trainable
        target_list = recipe_targets if recipe_targets == "all-linear" else sorted(set(recipe_targets))
        if settled is not None and settled.converted:  # what peft adapts for those names
            target_list = [*([modules] if isinstance(modules, str) else modules), *settled.parameters]
        out.append(Preset("recipe", target_list, list(recipe_saved or []), trainable, base_total + trainable))
    return out


def is_image_text_config(config) -> bool:
    """Whether a config is a vision-language model's: transformers maps it to AutoModelForImageTextToText and it
    has a vision tower (finetune/model/vision.py)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IMAGE_TEXT

    return getattr(config, "model_type", None) in IMAGE_TEXT and getattr(config, "vision_config", None) is not None


def meta_model(config, trust_remote_code: bool = False):
    """The model with every tensor on the meta device: shapes without storage."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_image_text_config(config) else AutoModelForCausalLM
    try:
        with torch.device("meta"):
            return auto.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        raise ModelError(f"transformers cannot build a causal LM from this config: {str(exc).splitlines()[0]}") from None


@dataclass
class Report:
    source: str
    architecture: str
    model_type: str
    rank: int
    total_parameters: int
    groups: list[ModuleGroup]
    presets: list[Preset]
    dora: bool = False  # the counts include DoRA's magnitude vectors
    parts: dict = field(default_factory=dict)  # a vision-language model's parts: name -> (module prefixes, frozen)
    # what the recipe's adapters train per kind of weight, the adapter's bytes (model/moe.py); None without a recipe
    recipe: object = None
    warning: str | None = None  # a mixture-of-experts recipe whose adapters reach almost no expert
    training: dict = field(default_factory=dict)  # ... and what trains in each under the recipe: part -> words

    def to_json(self) -> dict:
        modules = [{k: v for k, v in asdict(g).items() if k != "names"} for g in self.groups]
        return {
            "source": self.source, "architecture": self.architecture, "model_type": self.model_type,
            "rank": self.rank, "dora": self.dora, "total_parameters": self.total_parameters, "modules": modules,
            "parts": {part: {"modules": prefixes, "frozen": frozen, "trains": self.training.get(part)}
                      for part, (prefixes, frozen) in self.parts.items()},
            "presets": [{**asdict(p), "trainable_percent": round(p.trainable_percent, 4)} for p in self.presets],
            "recipe": self.recipe.to_json() if self.recipe is not None else None, "warning": self.warning,
        }


def inspect_model(model, source: str, rank: int, recipe_targets=None, recipe_saved=None, dora: bool = False,
                  parts: dict | None = None, part_of=None, recipe_breakdown=None,
                  warning: str | None = None) -> Report:
    """`parts` / `part_of`: a vision-language model's parts (name -> (prefixes, frozen)) and name -> part;
    `recipe_breakdown`: what the recipe's adapters train per kind of weight (model/moe.py breakdown), which the
    recipe's preset row counts; `warning`: model/moe.py's expert_warning."""
    groups = module_groups(model, part_of)
    frozen = {name for name, (_, is_frozen) in (parts or {}).items() if is_frozen}
    return Report(source=source, architecture=type(model).__name__,
                  model_type=getattr(model.config, "model_type", "?"), rank=rank,
                  total_parameters=unique_parameter_count(model), groups=groups,
                  presets=presets(model, groups, rank, recipe_targets, recipe_saved, dora, frozen,
                                  recipe_breakdown if recipe_targets is not None else None), dora=dora,
                  parts=parts or {}, recipe=recipe_breakdown, warning=warning)
