"""Training a mixture-of-experts model: what a recipe's LoRA targets reach in it, the routers, and ZeRO-3.

The layout (experts fused or per expert, routers, shared experts) is found from the model's structure by
finetune/plan/moe.py. Here:
- `breakdown`: per kind of weight (expert, shared expert, router, attention, other), how many parameters the model
  has, how many the recipe's adapters reach and what they add, as peft builds them: a Linear gets r x (in + out),
  a fused 3-D expert weight (experts x a x b) one rank-r adapter per expert, r x experts x (a + b) (peft 0.21.2's
  lora.ParamWrapper), a module in modules_to_save a full copy; the targets counted are those peft builds after
  its own conversion for fused experts (plan/moe.lora_targets: `all-linear` and transformers 4's expert names reach
  the experts of some families). `finetune targets` prints it, with the adapter's size on disk; `expert_warning`
  says when the adapters reach (almost) none of the experts, `dropout_problem` why dropout cannot stay.
- routers: frozen unless `train_router` (LoRA's `exclude_modules` keeps a Linear router out of `all-linear`; with
  `train_router` each router is a full copy in modules_to_save; a full fine-tune switches their gradients off).
- `set_zero3_leaves`: DeepSpeed ZeRO-3 gathers each MoE block's weights at once instead of expert by expert as
  tokens reach them (ranks route differently, so per-expert gathering would disagree between them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from finetune.compat import parameter_count
from finetune.errors import ModelError
from finetune.log import get_logger
from finetune.model.targets import linear_features, matches
from finetune.plan.moe import (ATTENTION_NAMES, KINDS, LoraTargets, MoeLayout, lora_targets, moe_layout,
                              parameter_lora_size, pattern_of, targeted_parameters)

log = get_logger(__name__)

# under this share of the expert weights reached, a recipe that names experts is warned (issue 40: axolotl's
# Qwen3.5-35B-A3B example adapted only the shared expert: a 13.5 MB adapter where the experts take 3.7 GB)
EXPERT_SHARE_WARNING = 0.05
ADAPTER_BYTES = 4  # peft keeps the adapter weights in fp32 (get_peft_model's autocast_adapter_dtype) and saves them so


@dataclass
class KindRow:
    kind: str
    parameters: int  # the model's weights of this kind
    adapted: int = 0  # of those, the ones an adapter (or a full copy) trains
    lora: int = 0  # LoRA parameters added on them
    saved: int = 0  # parameters of full copies (modules_to_save, routers with train_router)

    @property
    def added(self) -> int:
        return self.lora + self.saved


@dataclass
class Breakdown:
    rows: list[KindRow]
    saved_bytes_per_parameter: int  # a full copy keeps the base's dtype
    layout: MoeLayout | None
    attention_only: bool  # every module the targets reach is attention, and no parameter is targeted
    targets: LoraTargets | None = None  # what peft adapts for those names (its conversion for fused experts)
    label: str = "the recipe's adapters"  # whose targets these are

    def row(self, kind: str) -> KindRow:
        return next(r for r in self.rows if r.kind == kind)

    @property
    def trainable(self) -> int:
        return sum(r.added for r in self.rows)

    @property
    def adapter_bytes(self) -> int:
        return sum(ADAPTER_BYTES * r.lora + self.saved_bytes_per_parameter * r.saved for r in self.rows)

    @property
    def expert_share(self) -> float:
        rows = [self.row("expert"), self.row("shared expert")]
        total = sum(r.parameters for r in rows)
        return sum(r.adapted for r in rows) / total if total else 1.0

    def to_json(self) -> dict:
        return {"rows": [{**asdict(r), "added": r.added} for r in self.rows], "adapter_bytes": self.adapter_bytes,
                "trainable_parameters": self.trainable, "expert_share": round(self.expert_share, 6),
                "experts": self.layout.num_experts if self.layout else 0,
                "top_k": self.layout.top_k if self.layout else None,
                "peft_targets": asdict(self.targets) if self.targets else None}


def router_suffixes(layout: MoeLayout | None) -> list[str]:
    """The routers' names as peft matches them across layers: `mlp.gate`, `mlp.shared_expert_gate`."""
    return sorted({pattern_of(name).rsplit("*.", 1)[-1] for name in layout.routers}) if layout else []


def check_target_parameters(model, targets) -> None:
    """ModelError when a `lora_target_parameters` entry names no parameter, listing the expert weights there are."""
    if not targets:
        return
    names = [n for n, _ in model.named_parameters()]
    missing = [t for t in targets if not any(matches(n, t) for n in names)]
    if not missing:
        return
    layout = moe_layout(model)
    fused = [e.suffix for e in layout.experts if e.fused] if layout else []
    there = (f"This model's fused expert weights: {', '.join(fused)}" if fused else
             "This model has no fused expert weights (3-D parameters); adapt its Linear layers with "
             "`lora_target_modules`")
    raise ModelError(f"`lora_target_parameters` {missing} match no parameter of this model. {there}. "
                     "`finetune targets RECIPE` lists them.")


def _linear_modules(model, targets, excluded: list[str]) -> list[tuple[str, object]]:
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found = []
    for name, module in model.named_modules():
        if linear_features(module) is None or any(matches(name, e) for e in excluded):
            continue
        if (targets == "all-linear" and module is not output) or (
                targets != "all-linear" and any(matches(name, t) for t in targets)):
            found.append((name, module))
    return found


def breakdown(model, rank: int, target_modules, target_parameters=None, modules_to_save=None,
              train_router: bool = False, dora: bool = False, saved_bytes: int = 4, alpha: int = 16) -> Breakdown:
    """What the recipe's adapters train, per kind of weight (the module docstring says how peft counts), after
    peft's own conversion for fused experts (plan/moe.lora_targets)."""
    layout = moe_layout(model)
    targets = lora_targets(model, rank, alpha, target_modules, target_parameters, train_router, layout)
    kinds = layout.kinds if layout else {}
    rows = {k: KindRow(k, 0) for k in KINDS}
    seen = set()
    for name, param in model.named_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            rows[kinds.get(name) or _dense_kind(name)].parameters += parameter_count(param)
    excluded = [] if train_router else router_suffixes(layout)
    reached = []
    for name, module in _linear_modules(model, targets.modules, excluded):
        features = linear_features(module)
        row = rows[kinds.get(f"{name}.weight") or _dense_kind(name)]
        row.adapted += parameter_count(module.weight)
        row.lora += rank * (features[0] + features[1]) + (features[1] if dora else 0)
        reached.append(row.kind)
    for name, shape in targeted_parameters(model, targets.parameters):
        row = rows[kinds.get(name) or _dense_kind(name)]
        size = 1
        for d in shape:
            size *= d
        row.adapted += size
        row.lora += parameter_lora_size(shape, targets.rank_of(name, rank))
        reached.append("parameter")
    saved = list(modules_to_save or []) + (router_suffixes(layout) if train_router else [])
    _count_saved(model, saved, rows, kinds)
    return Breakdown(list(rows.values()), saved_bytes, layout,
                     attention_only=target_modules != "all-linear" and set(reached) == {"attention"},
                     targets=targets)


def _dense_kind(name: str) -> str:
    return "attention" if set(name.split(".")) & set(ATTENTION_NAMES) else "other"


def _count_saved(model, saved: list[str], rows: dict, kinds: dict) -> None:
    """Full copies, as peft makes them: one per matched module; a tied embedding / lm_head pair once."""
    from finetune.model.targets import ties_embeddings

    tied = ties_embeddings(model) if hasattr(model, "get_output_embeddings") else False
    counted = set()
    for name, module in model.named_modules():
        if not any(matches(name, t) for t in saved):
            continue
        for pname, param in module.named_parameters():
            if tied and id(param) in counted:
                continue
            counted.add(id(param))
            row = rows[kinds.get(f"{name}.{pname}") or _dense_kind(name)]
            row.adapted += parameter_count(param)
            row.saved += parameter_count(param)


def expert_warning(report: Breakdown, target_modules, target_parameters) -> str | None:
    """A line when the recipe names experts (all-linear, MLP names, parameter targets: anything but attention
    alone) and its adapters reach under 5% of the expert weights; None otherwise."""
    layout = report.layout
    if layout is None or report.expert_share >= EXPERT_SHARE_WARNING or report.attention_only:
        return None
    experts, shared = report.row("expert"), report.row("shared expert")
    reached = experts.adapted + shared.adapted
    total = experts.parameters + shared.parameters
    fused = [e.suffix for e in layout.experts if e.fused]
    names = f"`lora_target_modules: {target_modules}`" + (
        f" and `lora_target_parameters: {target_parameters}`" if target_parameters else "")
    if fused:
        fix = (f"add `lora_target_parameters: [{', '.join(fused)}]` (with `lora_dropout: 0`): this model's "
               f"{layout.num_experts} experts are fused 3-D weights, which Linear module names do not reach")
    else:
        fix = ("add the experts' Linear names to `lora_target_modules`: "
               f"[{', '.join(sorted({e.suffix for e in layout.experts}))}]")
    return (f"mixture-of-experts: {names} adapt{'s' if not target_parameters else ''} {100 * reached / total:.2f}% "
            f"of the expert weights ({reached:,} of {total:,}); to train the experts, {fix}. "
            "`finetune targets RECIPE` shows what each target trains.")


def dropout_problem(targets: LoraTargets | None, dropout: float) -> str | None:
    """peft cannot drop out the input of an adapter on a parameter: say so before it raises."""
    if targets is None or not targets.parameters or not dropout:
        return None
    how = ("peft 0.21.2 maps the recipe's module targets onto this model's fused expert weights "
           f"({', '.join(targets.parameters)}; gate_up_proj at twice the rank, as transformers 4's separate gate "
           "and up adapters)" if targets.converted
           else f"`lora_target_parameters` adapt {', '.join(targets.parameters)}")
    return (f"{how}, and an adapter on a parameter adds its update to the weight itself: there is no input to drop "
            f"out. Set `lora_dropout: 0` (now {dropout}), or target attention modules only")


@dataclass
class MoeSetup:
    """What build_model hands peft for a mixture-of-experts model."""

    excluded: list[str] = field(default_factory=list)  # frozen routers: no adapter may reach them
    saved: list[str] = field(default_factory=list)  # routers trained in full (`train_router` with an adapter)
    targets: LoraTargets | None = None  # what peft adapts (its conversion applied, frozen routers out)

    def apply(self, lora_config) -> None:
        """The LoraConfig as build_model hands it to peft: converted already, so peft's own pass changes nothing."""
        if self.targets is not None:
            lora_config.target_modules = self.targets.modules
            lora_config.target_parameters = self.targets.parameters or None
            lora_config.rank_pattern = self.targets.rank_pattern
            lora_config.alpha_pattern = self.targets.alpha_pattern


def saved_bytes(precision: str) -> int:
    """Bytes per parameter of a full copy: the base's dtype (an adapter's base loads in the compute dtype)."""
    return 2 if precision in ("bf16", "fp16") else 4


def prepare_experts(model, recipe, precision: str) -> MoeSetup:
    """Before the adapters go on (or a full fine-tune starts): the routers frozen or trained, the expert coverage
    checked and warned about. A dense model: nothing to do."""
    layout = moe_layout(model)
    if layout is None:
        return MoeSetup()
    routers = router_suffixes(layout)
    _refuse_router_targets(layout, recipe, routers)
    top_k = f"top-{layout.top_k}" if layout.top_k else "top-k unknown"
    log.info(f"mixture-of-experts: {layout.num_experts} experts ({top_k}, {'fused' if layout.fused else 'per-expert'}"
             f" weights) in {len(layout.blocks)} layers; routers {'train' if recipe.train_router else 'frozen'} "
             f"({', '.join(routers)})")
    if recipe.adapter == "none":
        if not recipe.train_router:
            freeze_routers(model, layout)
        return MoeSetup()
    report = breakdown(model, recipe.lora_r, recipe.lora_target_modules, recipe.lora_target_parameters,
                       recipe.lora_modules_to_save, recipe.train_router, recipe.peft_use_dora, saved_bytes(precision),
                       recipe.lora_alpha)
    problem = dropout_problem(report.targets, recipe.lora_dropout)
    if problem:
        raise ModelError(problem)
    if report.targets.converted:
        log.info(f"peft maps the module targets onto the fused experts: lora_target_parameters "
                 f"{report.targets.parameters} (rank pattern {report.targets.rank_pattern})")
    if report.targets.dropped_routers:
        log.info(f"routers frozen: no adapter on {', '.join(report.targets.dropped_routers)} (`train_router: true` "
                 "trains them in full)")
    warning = expert_warning(report, recipe.lora_target_modules, recipe.lora_target_parameters)
    if warning:
        log.warning(warning)
    return MoeSetup(excluded=[] if recipe.train_router else routers, saved=routers if recipe.train_router else [],
                    targets=report.targets)


def _refuse_router_targets(layout: MoeLayout, recipe, routers: list[str]) -> None:
    """A router named among the adapter's targets: it is frozen, or with `train_router` trained in full already."""
    if recipe.adapter == "none":
        return
    modules = recipe.lora_target_modules if isinstance(recipe.lora_target_modules, list) else []
    named = sorted({t for t in modules for r in layout.routers if matches(r.replace(".base_layer", ""), t)}
                   | {t for t in recipe.lora_target_parameters or () for n in layout.kinds
                      if layout.kinds[n] == "router" and matches(n, t)})
    if not named:
        return
    now = ("`train_router: true` trains them in full already" if recipe.train_router else
           "routers stay frozen unless `train_router: true`, which trains them in full")
    raise ModelError(f"the LoRA targets {named} name this model's routers ({', '.join(routers)}): {now}. "
                     "Remove them from the targets.")


def freeze_routers(model, layout: MoeLayout | None) -> int:
    """A full fine-tune without `train_router`: the routers' weights get no gradient. Returns how many."""
    if layout is None:
        return 0
    frozen = 0
    for name, param in model.named_parameters():
        if layout.kinds.get(name) == "router":
            param.requires_grad_(False)
            frozen += parameter_count(param)
    return frozen


def set_zero3_leaves(model) -> list[str]:
    """Mark each MoE block a ZeRO-3 leaf: its weights are gathered once for the whole block (deepspeed 0.19's
    set_z3_leaf_modules_by_name). Returns the block names (none for a dense model)."""
    layout = moe_layout(model)
    if layout is None:
        return []
    from deepspeed.utils.z3_leaf_module import set_z3_leaf_modules_by_name

    set_z3_leaf_modules_by_name(model, layout.blocks)
    return layout.blocks
