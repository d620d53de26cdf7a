"""axolotl's FSDP keys -> finetune's `fsdp:` section (FSDP2), with a note for each setting that does not carry over.

axolotl spells FSDP two ways (docs/multi-gpu.qmd, "Migrating from FSDP1 to FSDP2"):

    fsdp_version: 2                      fsdp_version: 1  (deprecated there, and in transformers)
    fsdp_config:                         fsdp: [full_shard, auto_wrap]
      offload_params: false              fsdp_config:
      reshard_after_forward: true          fsdp_offload_params: false
      state_dict_type: FULL_STATE_DICT     fsdp_sharding_strategy: FULL_SHARD
      auto_wrap_policy: TRANSFORMER_BASED_WRAP   fsdp_state_dict_type: FULL_STATE_DICT
      transformer_layer_cls_to_wrap: Qwen3DecoderLayer   fsdp_transformer_layer_cls_to_wrap: ...
      activation_checkpointing: true       fsdp_activation_checkpointing: true
      cpu_ram_efficient_loading: true      fsdp_cpu_ram_efficient_loading: true

Both become FSDP2 here: FSDP1's sharding strategy is FSDP2's reshard_after_forward (FULL_SHARD: true,
SHARD_GRAD_OP: false), and the FSDP1-only settings axolotl's table marks REMOVED get a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune.recipe.distributed import FSDPSpec

QUANTIZED = ("dropped: QLoRA under FSDP2 is not in finetune (accelerate leaves bitsandbytes' uint8-packed weights "
             "out of the sharding unless stored in a float dtype; axolotl patches accelerate and bitsandbytes for "
             "it): the QLoRA recipe trains on one GPU, over several with `--num-processes N` or `deepspeed: zero2`")
TOP_KEYS = ("fsdp", "fsdp_config", "fsdp_version", "fsdp_final_state_dict_type")
# a ported setting equal to finetune's default (the recipe's, recipe/distributed.py) is left out, with a comment
DEFAULTS = {key: FSDPSpec.model_fields[key].default for key in ("offload_params", "reshard_after_forward",
                                                                "state_dict_type")}

_FSDP1_ONLY = ("FSDP1-only (axolotl's FSDP1 -> FSDP2 table marks it REMOVED: FSDP2 prefetches and keeps original "
               "parameters by design): dropped")
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "1": True, "2": False}  # FSDP1 ShardingStrategy (ints too)
_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "4", "5")
_NOTES = {
    "backward_prefetch": _FSDP1_ONLY, "backward_prefetch_policy": _FSDP1_ONLY, "forward_prefetch": _FSDP1_ONLY,
    "sync_module_states": _FSDP1_ONLY, "use_orig_params": _FSDP1_ONLY, "limit_all_gathers": _FSDP1_ONLY,
    "cpu_ram_efficient_loading": ("not in finetune: every process loads the base before FSDP2 shards it (the "
                                  "packing guard and the logits probe run on the whole model); dropped"),
    "cpu_offload_pin_memory": "not in finetune: offloaded shards are pinned (accelerate's default); dropped",
    "min_num_params": "not in finetune: FSDP2 shards one decoder layer at a time, not by size; dropped",
    "version": "",  # read above
}


@dataclass
class FSDPPort:
    settings: dict = field(default_factory=dict)  # finetune keys: `fsdp`, maybe `gradient_checkpointing`
    notes: list[str] = field(default_factory=list)  # said on the `fsdp` key of the ported recipe
    dropped: list[str] = field(default_factory=list)  # the axolotl settings (`fsdp_config.KEY`) with no effect here

    def drop(self, where: str, text: str) -> None:
        """`where` (`fsdp_config.KEY`, `fsdp: ITEM`) is left out of the recipe: `text` says why."""
        self.notes.append(text)
        self.dropped.append(where)


def used(config: dict) -> bool:
    """Does the axolotl config turn FSDP on? (`fsdp_config`, or FSDP1's `fsdp:` list)"""
    return bool(config.get("fsdp_config")) or bool(config.get("fsdp"))


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bool(value) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def port(config: dict) -> FSDPPort:
    out, spec = FSDPPort(), {}
    raw = config.get("fsdp_config") or {}
    options = {key.removeprefix("fsdp_"): value for key, value in (raw.items() if isinstance(raw, dict) else ())}
    version = config.get("fsdp_version", options.get("version"))
    if str(version) == "1" or (version is None and config.get("fsdp")):
        out.notes.append("axolotl's FSDP1 (deprecated in axolotl and transformers) runs as FSDP2 here, its settings "
                         "translated by axolotl's FSDP1 -> FSDP2 table")
    _legacy_list(config.get("fsdp"), spec, out)
    for key, value in options.items():
        _option(key, value, spec, out)
    if config.get("fsdp_final_state_dict_type"):
        out.drop("fsdp_final_state_dict_type", f"fsdp_final_state_dict_type: {config['fsdp_final_state_dict_type']}: "
                 "not needed: the final save is always the whole model or adapter; dropped")
    defaults = [key for key, value in DEFAULTS.items() if spec.get(key) == value]
    for key in defaults:  # the section says only what differs, and this comment says why the rest is not written
        del spec[key]
    if defaults:
        out.notes.append(f"{', '.join(f'{key}: {_show(DEFAULTS[key])}' for key in defaults)}: finetune's "
                         "defaults under `fsdp`, so not written")
    if spec.pop("no_shard", False):
        out.notes.append("NO_SHARD / no_shard is plain data parallelism: no `fsdp` section "
                         "(`--num-processes N` runs DDP)")
        return out
    out.settings["fsdp"] = spec
    return out


def _legacy_list(value: Any, spec: dict, out: FSDPPort) -> None:
    """FSDP1's `fsdp: [full_shard, offload, auto_wrap]` (or a space-separated string)."""
    items = value.split() if isinstance(value, str) else value if isinstance(value, list) else []
    for item in map(str, items):
        name = item.lower()
        if name == "full_shard":
            spec["reshard_after_forward"] = True
        elif name == "shard_grad_op":
            spec["reshard_after_forward"] = False
        elif name == "offload":
            spec["offload_params"] = True
        elif name == "auto_wrap":
            pass  # finetune wraps each decoder layer
        elif name == "no_shard":
            spec["no_shard"] = True
        elif name in ("hybrid_shard", "hybrid_shard_zero2"):
            spec["reshard_after_forward"] = name == "hybrid_shard"
            out.notes.append(f"fsdp: {item}: not in finetune (FSDP1's shard-within-a-node): every process shards "
                             "over all of them")
        else:
            out.drop(f"fsdp: {item}", f"fsdp: {item}: not an FSDP option finetune knows; dropped")


def _option(key: str, value: Any, spec: dict, out: FSDPPort) -> None:
    """One `fsdp_config` key, its `fsdp_` prefix removed."""
    if key == "offload_params":
        spec["offload_params"] = _bool(value)
    elif key == "reshard_after_forward" and isinstance(value, bool):
        spec["reshard_after_forward"] = value
    elif key in ("sharding_strategy", "reshard_after_forward"):  # FSDP1's strategy, by name or number
        name = str(value).upper()
        if name in _RESHARD:
            spec["reshard_after_forward"] = _RESHARD[name]
        elif name in ("NO_SHARD", "3"):
            spec["no_shard"] = True
        elif name in _HYBRID:
            spec["reshard_after_forward"] = name in ("HYBRID_SHARD", "4")
            out.notes.append(f"fsdp_config.{key}: {value}: not in finetune (FSDP1's shard-within-a-node): every "
                             "process shards over all of them")
        else:
            out.drop(f"fsdp_config.{key}", f"fsdp_config.{key}: {value}: not a sharding strategy; dropped")
    elif key == "state_dict_type":
        name = str(value).upper()
        spec["state_dict_type"] = "FULL_STATE_DICT" if name == "FULL_STATE_DICT" else "SHARDED_STATE_DICT"
        if name not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            out.notes.append(f"fsdp_config.state_dict_type: {value}: FSDP1-only; checkpoints are SHARDED_STATE_DICT")
    elif key == "auto_wrap_policy":
        if str(value).upper() == "TRANSFORMER_BASED_WRAP":
            out.notes.append(f"fsdp_config.auto_wrap_policy: {value}: finetune's behaviour already (FSDP2 shards one "
                             "decoder layer at a time: `transformer_layer_cls_to_wrap`), so not written")
        else:
            out.drop(f"fsdp_config.{key}", f"fsdp_config.auto_wrap_policy: {value}: not in finetune: FSDP2 shards "
                     "one decoder layer at a time (TRANSFORMER_BASED_WRAP); dropped")
    elif key == "transformer_layer_cls_to_wrap":
        names = value if isinstance(value, list) else str(value).split(",")
        names = [str(n).strip() for n in names if str(n).strip()]
        if names:
            spec["transformer_layer_cls_to_wrap"] = names[0]
        if len(names) > 1:
            out.notes.append(f"fsdp_config.transformer_layer_cls_to_wrap: {', '.join(names)}: finetune wraps one "
                             f"class, `{names[0]}` (its default is the model's decoder layer)")
    elif key == "activation_checkpointing":
        if _bool(value):  # said on the `gradient_checkpointing` key (port/convert.py)
            out.settings["gradient_checkpointing"] = "full"
        else:
            out.notes.append(f"fsdp_config.activation_checkpointing: {_show(value)}: finetune's "
                             "`gradient_checkpointing` decides (`full`: FSDP2 checkpoints each decoder layer)")
    elif key in _NOTES:
        if _NOTES[key]:
            out.drop(f"fsdp_config.{key}", f"fsdp_config.{key}: {_show(value)}: {_NOTES[key]}")
    else:
        out.drop(f"fsdp_config.{key}", f"fsdp_config.{key}: {_show(value)}: not in finetune's `fsdp:` section; "
                 "dropped")
