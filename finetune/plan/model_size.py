"""Exact parameter counts from a model config: the model is built on torch's `meta` device (no memory,
no weights downloaded) and its modules are counted. Imports torch/transformers inside the functions.

A vision-language model is counted whole (finetune/model/vision_budget.py builds it): `frozen(name)` says which
weights its freeze keys leave out of training (no gradients, no adapters), `unquantized(name)` which stay out of
QLoRA's 4-bit storage (its tower and projector)."""

from __future__ import annotations

from pathlib import Path

from finetune.compat import parameter_count
from finetune.errors import FinetuneError
from finetune.plan.shape import ModelShape, Trainable


def load_config(model: str, trust_remote_code: bool = False):
    """An HF config from a folder with config.json, a config.json file, or a hub id (cached or online)."""
    from transformers import AutoConfig

    path = Path(model)
    source = str(path.parent) if path.name == "config.json" else model
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise FinetuneError(
            f"cannot read a model config from `{model}` ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}). "
            "Pass a recipe, a folder containing config.json, a config.json, or a hub id that is cached or reachable."
        ) from None


def meta_model(config, reward: bool = False):
    """The model with every tensor on the meta device: shapes without storage. `reward`: the base's
    sequence-classification class with one output (a reward model: the score head in place of the LM head)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if reward:
        import copy

        config = copy.deepcopy(config)
        config.num_labels = 1
    with torch.device("meta"):
        if reward:
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


def _head(model):
    """The output layer: the LM head, or a sequence-classification model's score head."""
    return model.get_output_embeddings() or getattr(model, "score", None)


def _blocks_linears(model):
    """(qualified name, module) for every Linear except the output layer."""
    import torch

    out = _head(model)
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not out]


def _added_by_peft(name: str) -> bool:
    return ".lora_" in name or ".modules_to_save." in name


def _non_matmul(model) -> int:
    """Norm weights, biases and attention sinks: parameters no matmul multiplies with."""
    from finetune.plan.moe import shape_of

    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) not in seen and not _added_by_peft(name) and (len(shape_of(p)) < 2 or name.endswith("bias")):
            seen.add(id(p))
            total += parameter_count(p)
    return total


def model_shape(model, unquantized=None) -> ModelShape:
    from finetune.plan.moe import moe_layout

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    # tied weights once; a peft model's adapters and full copies are what it trains, not the model's shape
    params = {id(p): p for n, p in model.named_parameters() if not _added_by_peft(n)}
    # parameter_count, not numel: a loaded 4-bit base packs 2 weights a byte, a ZeRO-3 shard holds a
    # placeholder (the throughput callback measures the trained model; FLOPs count every weight)
    total = sum(parameter_count(p) for p in params.values())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    heads = cfg.num_attention_heads
    moe = moe_layout(model)
    return ModelShape(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        intermediate_size=getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size,
        num_attention_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        vocab_size=cfg.vocab_size,
        total_params=total,
        embedding_params=parameter_count(emb),
        quantizable_params=sum(parameter_count(m.weight) for n, m in _blocks_linears(model)
                               if unquantized is None or not unquantized(n)),
        tied_embeddings=tied,
        expert_params=moe.expert_params if moe else 0,
        active_expert_params=moe.active_expert_params if moe else 0,
        non_matmul_params=_non_matmul(model),
        head_outputs=None if out is not None else getattr(cfg, "num_labels", None),
    )


def full_trainable(model, frozen=None) -> Trainable:
    params = {id(p): p for n, p in model.named_parameters() if frozen is None or not frozen(n)}
    return Trainable(trainable_params=sum(p.numel() for p in params.values()), trainable_tensors=len(params))


def _matches(name: str, targets) -> bool:
    if targets == "all-linear":
        return True
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_trainable(model, r: int, target_modules="all-linear", modules_to_save=None, dora: bool = False,
                   target_parameters=None, frozen=None) -> Trainable:
    """LoRA counts as peft builds them: A (r x in) and B (out x r) per adapted Linear, no bias; `all-linear`
    means every Linear but the output layer (and a mixture-of-experts' routers, frozen); DoRA adds one magnitude
    per output feature (a tensor per layer). `target_parameters` (fused 3-D expert weights): one rank-r adapter
    per expert (plan/moe.py). modules_to_save are trained as full copies. `frozen(name)`: a vision-language model's
    frozen parts, which get no adapters."""
    from finetune.plan.moe import lora_targets, moe_layout, parameter_lora_size, pattern_of, targeted_parameters

    layout = moe_layout(model)
    # what peft adapts for these names: its conversion for fused experts, the frozen routers left out
    settled = lora_targets(model, r, 2 * r, target_modules, target_parameters, layout=layout)
    routers = {pattern_of(n).rsplit("*.", 1)[-1] for n in layout.routers} if layout else set()
    linears = [(n, m) for n, m in _blocks_linears(model) if _matches(n, settled.modules or [])
               and not (settled.modules == "all-linear" and _matches(n, routers))
               and (frozen is None or not frozen(n))]
    parameters = targeted_parameters(model, settled.parameters)
    if not linears and not parameters:
        raise FinetuneError(
            f"lora_target_modules {target_modules} match no Linear module of this model; "
            "run `finetune targets` to list them"
        )
    params = sum(r * (m.in_features + m.out_features) + (m.out_features if dora else 0) for _, m in linears)
    on_parameters = [(name, parameter_lora_size(shape, settled.rank_of(name, r))) for name, shape in parameters]
    params += sum(n for _, n in on_parameters)
    tensors = (3 if dora else 2) * len(linears) + 2 * len(parameters)
    # adapters inside the routed experts: a token runs through its top-k experts' only (plan/flops.py)
    in_experts = sum(n for name, n in on_parameters if layout.kind_of(name) == "expert") if layout else 0
    in_experts += sum(r * (m.in_features + m.out_features) for n, m in linears
                      if layout and layout.kind_of(f"{n}.weight") == "expert")
    for name in modules_to_save or []:
        for qualified, module in model.named_modules():
            if qualified == name or qualified.endswith("." + name):
                own = list(module.parameters())
                params += sum(p.numel() for p in own)
                tensors += len(own)
    dora_features = sum(m.out_features for _, m in linears) if dora else 0
    return Trainable(trainable_params=params, trainable_tensors=tensors,
                     adapter_input_features=sum(m.in_features for _, m in linears),
                     dora_output_features=dora_features,
                     dora_weight_elements=max((m.in_features * m.out_features for _, m in linears), default=0)
                     if dora else 0,
                     inactive_adapter_params=round(in_experts * (1 - layout.active_fraction)) if layout else 0,
                     rebuilt_weight_elements=sum(_elements(shape) for _, shape in parameters))


def _elements(shape: tuple) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def count_model(config, lora_r: int = 8, target_modules="all-linear", modules_to_save=None, dora: bool = False,
                target_parameters=None, model=None, frozen=None, unquantized=None, reward: bool = False):
    """(ModelShape, full Trainable, LoRA Trainable) for a config (or its meta `model`, already built); `reward`: as a
    reward model, whose score head trains in full beside the adapter."""
    model = model if model is not None else meta_model(config, reward)
    if reward:
        modules_to_save = [*(modules_to_save or []), "score"]
    return (model_shape(model, unquantized), full_trainable(model, frozen),
            lora_trainable(model, lora_r, target_modules, modules_to_save, dora, target_parameters, frozen))


def reward_model_loads(recipe) -> tuple:
    """A GRPO recipe's reward models as plan/grpo.py counts them: each one's parameters (the sequence-classification
    model it loads as) and the tokens of one scoring pass (batch_size x max_length: the entry's, else the length it
    trained with, else its max_position_embeddings)."""
    from finetune.plan.grpo import RewardModelLoad
    from finetune.reward_models import config_source, trained_length

    loads = []
    for entry in getattr(recipe, "rewards", None) or ():
        if not entry.model:
            continue
        config = load_config(config_source(entry.model))
        shape = model_shape(meta_model(config, reward=True))
        length = entry.max_length or trained_length(entry.model) or getattr(config, "max_position_embeddings", 2048)
        loads.append(RewardModelLoad(shape.total_params, shape.hidden_size, shape.intermediate_size,
                                     entry.batch_size * length))
    return tuple(loads)
