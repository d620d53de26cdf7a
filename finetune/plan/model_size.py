"""Exact parameter counts from a model config: the model is built on torch's `meta` device (no memory,
no weights downloaded) and its modules are counted. Imports torch/transformers inside the functions."""

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


def model_shape(model) -> ModelShape:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    params = {id(p): p for p in model.parameters()}  # tied weights once
    # parameter_count, not numel: a loaded 4-bit base packs 2 weights a byte, a ZeRO-3 shard holds a
    # placeholder (the throughput callback measures the trained model; FLOPs count every weight)
    total = sum(parameter_count(p) for p in params.values())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    heads = cfg.num_attention_heads
    return ModelShape(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        intermediate_size=getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size,
        num_attention_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        vocab_size=cfg.vocab_size,
        total_params=total,
        embedding_params=parameter_count(emb),
        quantizable_params=sum(parameter_count(m.weight) for _, m in _blocks_linears(model)),
        tied_embeddings=tied,
        head_outputs=None if out is not None else getattr(cfg, "num_labels", None),
    )


def full_trainable(model) -> Trainable:
    params = {id(p): p for p in model.parameters()}
    return Trainable(trainable_params=sum(p.numel() for p in params.values()), trainable_tensors=len(params))


def _matches(name: str, targets) -> bool:
    if targets == "all-linear":
        return True
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_trainable(model, r: int, target_modules="all-linear", modules_to_save=None, dora: bool = False) -> Trainable:
    """LoRA counts as peft builds them: A (r x in) and B (out x r) per adapted Linear, no bias; `all-linear`
    means every Linear but the output layer; DoRA adds one magnitude per output feature (a tensor per layer).
    modules_to_save are trained as full copies."""
    linears = [(n, m) for n, m in _blocks_linears(model) if _matches(n, target_modules)]
    if not linears:
        raise FinetuneError(
            f"lora_target_modules {target_modules} match no Linear module of this model; "
            "run `finetune targets` to list them"
        )
    params = sum(r * (m.in_features + m.out_features) + (m.out_features if dora else 0) for _, m in linears)
    tensors = (3 if dora else 2) * len(linears)
    for name in modules_to_save or []:
        for qualified, module in model.named_modules():
            if qualified == name or qualified.endswith("." + name):
                own = list(module.parameters())
                params += sum(p.numel() for p in own)
                tensors += len(own)
    return Trainable(trainable_params=params, trainable_tensors=tensors,
                     adapter_input_features=sum(m.in_features for _, m in linears),
                     dora_output_features=sum(m.out_features for _, m in linears) if dora else 0,
                     dora_weight_elements=max(m.in_features * m.out_features for _, m in linears) if dora else 0)


def count_model(config, lora_r: int = 8, target_modules="all-linear", modules_to_save=None, dora: bool = False,
                reward: bool = False):
    """(ModelShape, full Trainable, LoRA Trainable) for a config; `reward`: as a reward model, whose score head
    trains in full beside the adapter."""
    model = meta_model(config, reward)
    if reward:
        modules_to_save = [*(modules_to_save or []), "score"]
    return (model_shape(model), full_trainable(model),
            lora_trainable(model, lora_r, target_modules, modules_to_save, dora))


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
