"""The mixture-of-experts parts of a model, found from its structure, not from a list of families.

    layout = moe_layout(model)      # None for a dense model
    layout.kind_of("model.layers.0.mlp.experts.gate_up_proj")   # "expert"

Two expert layouts exist:
- fused: one module holds every expert's weights as 3-D parameters (num_experts x out x in, or x in x out),
  e.g. `mlp.experts.gate_up_proj`. transformers 5 stores qwen3_moe, gpt_oss, mixtral, olmoe, qwen2_moe,
  deepseek_v3 and every other MoE it ships this way. No Linear module is there, so `all-linear` never reaches
  them: LoRA reaches them through peft's `target_parameters` (the recipe's `lora_target_parameters`).
- per expert: a ModuleList of identical expert MLPs made of Linear layers (older transformers, models with their
  own code); `lora_target_modules` reaches them.

Around the experts, in the same block (the experts' parent module): the router (a weight with one row per expert,
or a gate with one row, e.g. qwen2_moe's `shared_expert_gate`) and shared experts (every other module of the block
that holds weights: an MLP every token goes through). Each token uses `top_k` of the routed experts, so per token
only top_k / num_experts of the expert weights do work: FLOPs count those (plan/flops.py), memory counts them all.
Works on a meta model (shapes only). Imports nothing heavy at module level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from finetune.compat import parameter_count

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")
# where configs keep the number of experts each token uses (the router's own `top_k` is read first)
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k", "top_k")
KINDS = ("expert", "shared expert", "router", "attention", "other")
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")


def pattern_of(name: str) -> str:
    """A qualified name with its layer (and expert) indices as `*`: `model.layers.*.mlp.experts.*.w1`."""
    return _INDEX.sub("*", name)


@dataclass
class ExpertWeights:
    """One expert weight across the layers: a fused 3-D parameter, or the per-expert Linear modules of one name."""

    pattern: str  # model.layers.*.mlp.experts.gate_up_proj | model.layers.*.block_sparse_moe.experts.*.w1
    fused: bool  # a 3-D parameter (lora_target_parameters) rather than Linear modules (lora_target_modules)
    shape: tuple  # one layer's: (experts, a, b) fused; (out, in) of one expert's Linear otherwise
    names: list[str] = field(default_factory=list)  # parameter names (fused) or module names (per expert)
    parameters: int = 0  # all of them together

    @property
    def suffix(self) -> str:
        """What peft matches across layers: `mlp.experts.gate_up_proj` (fused), `w1` (per-expert Linear)."""
        return self.pattern.rsplit("*.", 1)[-1]


@dataclass
class MoeLayout:
    num_experts: int
    top_k: int | None  # None when neither the router nor the config says
    blocks: list[str]  # the MoE blocks (the experts' parents), qualified names
    block_classes: list[str]  # their classes: DeepSpeed ZeRO-3 gathers each as one unit
    experts: list[ExpertWeights]
    kinds: dict[str, str]  # every parameter name -> one of KINDS
    sizes: dict[str, int]  # every parameter name -> its number of elements
    routers: list[str] = field(default_factory=list)  # router modules, qualified names
    expert_modules: list[str] = field(default_factory=list)  # the modules holding the experts (under peft: its wrapper)

    @property
    def fused(self) -> bool:
        return any(e.fused for e in self.experts)

    def kind_of(self, parameter_name: str) -> str:
        return self.kinds.get(parameter_name, "other")

    def parameters(self, kind: str) -> int:
        return sum(n for name, n in self.sizes.items() if self.kinds[name] == kind)

    @property
    def expert_params(self) -> int:
        """The routed experts' matmul weights (their biases, gpt_oss's, are not in a matmul)."""
        return sum(e.parameters for e in self.experts)

    @property
    def active_fraction(self) -> float:
        """The share of the routed experts' weights one token uses."""
        return 1.0 if not self.top_k else min(self.top_k, self.num_experts) / self.num_experts

    @property
    def active_expert_params(self) -> int:
        return round(self.expert_params * self.active_fraction)

    def inactive_trainable(self, model) -> int:
        """Trainable parameters (adapters) inside the routed experts that one token does not use."""
        trained = sum(parameter_count(p) for name, p in model.named_parameters()
                      if p.requires_grad and self.kinds.get(name) == "expert")
        return round(trained * (1 - self.active_fraction))


def _own(module) -> list:
    return list(module.named_parameters(recurse=False))


def shape_of(param) -> tuple:
    """A parameter's shape, also under DeepSpeed ZeRO-3 (0.19 keeps the real one in `ds_shape`)."""
    return tuple(getattr(param, "ds_shape", param.shape))


def _fused_containers(model) -> dict[str, int]:
    """Modules holding 3-D parameters (the experts stacked on the first dimension) -> number of experts."""
    return {name: shape_of(params[0][1])[0] for name, module in model.named_modules()
            if (params := [(n, p) for n, p in _own(module) if len(shape_of(p)) == 3])}


def _leading_dim(module) -> int | None:
    weight = getattr(module, "weight", None)
    shape = shape_of(weight) if weight is not None and hasattr(weight, "shape") else ()
    return shape[0] if len(shape) == 2 else None


def _per_expert_containers(model) -> dict[str, int]:
    """ModuleLists of >= 2 identical modules made of Linear layers, beside a router: a weight with one row each."""
    import torch

    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2 or "." not in name:
            continue
        children = list(module)
        linear = any(isinstance(m, torch.nn.Linear) for m in children[0].modules())
        if len({type(c) for c in children}) != 1 or not linear:
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        if any(_leading_dim(m) == len(children) for m in parent.children() if m is not module):
            found[name] = len(children)
    return found


def _top_k(model, routers: list) -> int | None:
    for router in routers:
        value = getattr(router, "top_k", None)
        if isinstance(value, int) and value > 0:
            return value
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in TOP_K_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def moe_layout(model) -> MoeLayout | None:
    """The experts, routers and shared experts of `model` (a transformers model, meta or real); None if dense."""
    containers = _fused_containers(model) or _per_expert_containers(model)
    if not containers:
        return None
    num_experts = max(containers.values())
    kinds, sizes, routers, blocks, expert_modules = {}, {}, [], {}, []
    for container in containers:
        container = container.replace(".base_layer", "")  # under peft: the LoRA wrapper standing in its place
        expert_modules.append(container)
        block_name = container.rsplit(".", 1)[0] if "." in container else ""
        block = model.get_submodule(block_name)
        blocks[block_name] = type(block).__name__
        for child_name, child in block.named_children():
            qualified = f"{block_name}.{child_name}" if block_name else child_name
            if qualified == container:
                kind = "expert"
            elif _leading_dim(child) in (num_experts, 1) and not list(child.children()):
                kind = "router"  # one row per expert; a one-row gate scales a shared expert's output
                routers.append((qualified, child))
            else:
                kind = "shared expert"
            for name, _ in child.named_parameters():
                kinds[f"{qualified}.{name}"] = kind
    for name, param in model.named_parameters():
        sizes[name] = parameter_count(param)
        if name not in kinds:
            parts = set(name.split("."))
            kinds[name] = "attention" if parts & set(ATTENTION_NAMES) else "other"
    return MoeLayout(num_experts=num_experts, top_k=_top_k(model, [r for _, r in routers]), blocks=list(blocks),
                     block_classes=sorted(set(blocks.values())), experts=_expert_weights(model, containers),
                     kinds=kinds, sizes=sizes, routers=[name for name, _ in routers], expert_modules=expert_modules)


def _expert_weights(model, containers: dict[str, int]) -> list[ExpertWeights]:
    import torch

    groups: dict[str, ExpertWeights] = {}
    for container in containers:
        module = model.get_submodule(container)
        if isinstance(module, torch.nn.ModuleList):  # per-expert Linear modules
            members = [(f"{container}.{n}", m.weight) for n, m in module.named_modules()
                       if isinstance(m, torch.nn.Linear)]
            fused = False
        else:
            members = [(f"{container}.{n}", p) for n, p in _own(module) if len(shape_of(p)) == 3]
            fused = True
        for name, weight in members:
            key = pattern_of(name)
            group = groups.setdefault(key, ExpertWeights(key, fused, shape_of(weight)))
            group.names.append(name)
            group.parameters += parameter_count(weight)
    return list(groups.values())


def parameter_lora_size(shape: tuple, rank: int) -> int:
    """LoRA parameters peft 0.21.2 adds on a targeted parameter: per expert of a 3-D weight A (r x a) and B (b x r);
    on a 2-D weight (out x in), A and B as on a Linear."""
    if len(shape) == 3:
        return rank * shape[0] * (shape[1] + shape[2])
    return rank * (shape[0] + shape[1])


def targeted_parameters(model, targets) -> list[tuple[str, tuple]]:
    """(name, shape) of each parameter peft's `target_parameters` adapts: the name, or a dotted suffix of it."""
    names = []
    for name, param in model.named_parameters():
        if any(name == t or name.endswith("." + t) for t in targets or ()):  # peft's rule
            names.append((name, shape_of(param)))
    return names


@dataclass
class LoraTargets:
    """What peft 0.21.2 adapts for a recipe's targets, after its conversion for transformers 5's fused experts
    (compat.peft_moe_conversion) and with frozen routers taken out."""

    modules: object  # "all-linear" or the module names
    parameters: list[str]  # parameter names (suffixes): fused experts
    rank_pattern: dict = field(default_factory=dict)  # peft's: regex -> rank (gate_up_proj at 2r when converted)
    alpha_pattern: dict = field(default_factory=dict)
    dropped_routers: list[str] = field(default_factory=list)  # router parameters the conversion added, left frozen
    converted: bool = False  # peft mapped module names (or all-linear) onto fused expert weights

    def rank_of(self, name: str, rank: int) -> int:
        from peft.utils.other import get_pattern_key

        return self.rank_pattern.get(get_pattern_key(self.rank_pattern.keys(), name), rank)


def lora_targets(model, rank: int, alpha: int, target_modules, target_parameters=None, train_router: bool = False,
                 layout: MoeLayout | None = None) -> LoraTargets:
    """The module and parameter targets peft will adapt on `model` (meta or real) for the recipe's keys."""
    from peft import LoraConfig

    from finetune.compat import peft_moe_conversion

    modules = target_modules if isinstance(target_modules, str) else list(target_modules or [])
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=modules,
                        target_parameters=list(target_parameters) if target_parameters else None)
    before = sorted(config.target_parameters or [])
    peft_moe_conversion(config, model)
    parameters = sorted(config.target_parameters or [])
    dropped = []
    if not train_router and layout is not None:
        routers = [n for n, kind in layout.kinds.items() if kind == "router"]
        dropped = [t for t in parameters if any(n == t or n.endswith("." + t) for n in routers)]
        parameters = [t for t in parameters if t not in dropped]
    converted = isinstance(config.target_modules, str) is False and (sorted(config.target_parameters or []) != before)
    modules = config.target_modules if isinstance(config.target_modules, str) else sorted(config.target_modules or [])
    return LoraTargets(modules, parameters, dict(config.rank_pattern or {}), dict(config.alpha_pattern or {}),
                       dropped, converted)
