"""axolotl's preference recipes (`rl: dpo | ipo | orpo | simpo | kto`) -> finetune's `method:` and its settings,
each as axolotl passes it to TRL; the dataset types are preference_records.py's. Pure data and small functions,
like axolotl.py beside it; convert.py applies them. Its keys' HINTS live with the recipe
(finetune/recipe/axolotl/preference.py), which names them in `finetune validate` too.

Checked against axolotl at commit 067b021 (2026-07): core/builders/rl.py and core/trainers/dpo/__init__.py
(which recipe key reaches which TRL argument, for which `rl:`), utils/schemas/{config,deprecated,validation}.py,
with the defaults of TRL 1.16's DPOConfig, CPOConfig, ORPOConfig and KTOConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the keys' hints (`finetune validate` names them too): the reason a key is dropped when nothing more is said
from finetune.recipe.axolotl.preference import HINTS, PADDING_FREE

RL_METHODS = ("dpo", "ipo", "orpo", "simpo", "kto")
ONLINE_RL = ("gdpo", "ebft")  # generate-and-score training finetune does not do (`rl: grpo` ports: port/grpo.py)

# TRL CPOConfig's beta, simpo_gamma and cpo_alpha, in finetune's names: what axolotl's SimPO trains with when unset
_SIMPO_TRL_DEFAULTS = {"rl_beta": 0.1, "simpo_gamma": 0.5, "rpo_alpha": 1.0}
_DPO_LOSSES = {"sigmoid": "dpo", "ipo": "ipo"}  # TRL loss_type -> finetune method; "sft" is rpo_alpha


@dataclass(frozen=True)
class KeyPort:
    """What one axolotl key of a preference recipe becomes: finetune `settings` (with a `note` when the meaning
    moved), or a `drop` reason, or a `block`: the key changes what is trained and finetune cannot honour it, so
    it stays in the recipe as written and the recipe does not load until the user decides."""

    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    drop: str = ""
    block: str = ""


_DELETE_TO_TRAIN = "delete the line to train without it, or keep training this recipe with axolotl"

# finetune's method settings: the same names in axolotl, read by these `rl:` values there (and methods here)
SETTINGS = ("rl_beta", "dpo_label_smoothing", "rpo_alpha", "simpo_gamma", "orpo_alpha", "kto_desirable_weight",
            "kto_undesirable_weight")
RL_KEYS = frozenset(HINTS) | frozenset(SETTINGS)


def port_keys(config: dict) -> tuple[str, dict[str, KeyPort]]:
    """(finetune method, what each rl key of `config` becomes). `config["rl"]` is one of RL_METHODS."""
    ports: dict[str, KeyPort] = {}
    method = _loss_types(config, ports)
    _beta(config, method, ports)
    _method_settings(config, method, ports)
    implied = {}
    if method == "simpo":  # TRL's CPOConfig defaults, not finetune's (the SimPO paper's): keep what axolotl trained
        implied = {key: value for key, value in _SIMPO_TRL_DEFAULTS.items()
                   if not any(key in p.settings for p in ports.values())}
    note = "" if method == config["rl"] else f"axolotl's `rl: {config['rl']}` with `dpo_loss_type` trains {method}"
    if implied:
        shown = ", ".join(f"{key}: {value}" for key, value in implied.items())
        why = {"rpo_alpha": "rpo_alpha is CPO's `cpo_alpha`, an SFT term on the chosen answers",
               "simpo_gamma": "unset, axolotl passes gamma None and TRL fails; 0.5 is TRL's default and the value "
                              "axolotl's docs show"}
        said = "; ".join(text for key, text in why.items() if key in implied)
        note = (note + "; " if note else "") + (
            f"axolotl's SimPO is TRL's CPOTrainer: what the recipe leaves unset takes TRL's values ({shown}"
            + (f"; {said}" if said else "") + "), not finetune's defaults (the SimPO paper's: rl_beta 2.0, "
            "simpo_gamma 1.0, no SFT term), so they are written out")
    if method == "orpo":
        note = (note + "; " if note else "") + (
            "finetune's ORPO takes the NLL of the chosen answer's tokens; axolotl's (TRL's ORPOTrainer) also scores "
            "the prompt's, so the two losses differ by that term (docs/preference.md)")
    ports["rl"] = KeyPort({"method": method, **implied}, note)
    for key, hint in HINTS.items():
        if key in config and key not in ports:
            ports[key] = _static(key, config[key], hint)
    return method, ports


def _static(key: str, value: Any, hint: str) -> KeyPort:
    if key in ("dpo_use_weighting", "dpo_norm_loss") and value:
        return KeyPort(block=f"{hint}; {_DELETE_TO_TRAIN}")
    if key == "dpo_padding_free" and value:
        return KeyPort({"sample_packing": True}, PADDING_FREE)
    if key in ("dpo_use_weighting", "dpo_norm_loss", "dpo_padding_free"):
        return KeyPort(drop="not needed: off is finetune's behaviour")
    return KeyPort(drop=hint)


def _loss_types(config: dict, ports: dict[str, KeyPort]) -> str:
    """The method an `rl: dpo` recipe trains with `dpo_loss_type` / `dpo_loss_weights` (TRL >= 0.29 writes IPO
    and RPO that way), and what those two keys become."""
    rl, types, weights = config["rl"], config.get("dpo_loss_type"), config.get("dpo_loss_weights")
    if types is None:
        if weights is not None:
            ports["dpo_loss_weights"] = KeyPort(drop="dropped: axolotl reads it only with `dpo_loss_type`")
        return rl
    if rl != "dpo":
        ports["dpo_loss_type"] = KeyPort(drop=f"dropped: axolotl reads it only with `rl: dpo` (`rl: {rl}` refuses "
                                              "it)")
        if weights is not None:
            ports["dpo_loss_weights"] = KeyPort(drop=ports["dpo_loss_type"].drop)
        return rl
    types = [types] if isinstance(types, str) else list(types)
    weights = list(weights) if isinstance(weights, list) and len(weights) == len(types) else [1.0] * len(types)
    weight = dict(zip(types, weights))
    preference = [t for t in types if t != "sft"]
    unknown = [t for t in preference if t not in _DPO_LOSSES]
    if unknown or len(preference) != 1 or weight[preference[0]] != 1.0:
        why = (f"TRL's `{'`, `'.join(unknown)}` loss is not in finetune" if unknown else
               "finetune trains one preference loss (sigmoid for dpo, or ipo) with weight 1, plus `rpo_alpha` x the "
               "SFT term" + ("" if len(preference) != 1 else
                             f"; for weights [{weight[preference[0]]}, a] write rpo_alpha: a / {weight[preference[0]]}"
                             " (Adam is nearly blind to the overall scale)"))
        ports["dpo_loss_type"] = KeyPort(block=f"{why}; delete the line to train DPO's sigmoid loss, or keep "
                                               "training this recipe with axolotl")
        if "dpo_loss_weights" in config:
            ports["dpo_loss_weights"] = KeyPort(drop="dropped: decided with `dpo_loss_type`, which needs your edit")
        return "dpo"
    method = _DPO_LOSSES[preference[0]]
    settings = {"rpo_alpha": weight["sft"]} if "sft" in weight else {}
    ports["dpo_loss_type"] = KeyPort(settings, f"TRL's `{preference[0]}` loss is finetune's `method: {method}`" + (
        "; its 'sft' term (the chosen answers' mean NLL) is `rpo_alpha`" if settings else ""))
    if "dpo_loss_weights" in config:
        ports["dpo_loss_weights"] = KeyPort(drop="dropped: folded into `rpo_alpha` (see above)" if settings else
                                            "dropped: weight 1, finetune's already")
    return method


def _beta(config: dict, method: str, ports: dict[str, KeyPort]) -> None:
    """TRL's `beta` in axolotl: trl.beta, else rl_beta (or its old name dpo_beta), else orpo_alpha, whatever
    `rl:` is. For ORPO, TRL's beta is the odds-ratio weight lambda: finetune's `orpo_alpha`."""
    trl = config.get("trl") if isinstance(config.get("trl"), dict) else {}
    sources = {"trl": trl.get("beta"), "rl_beta": config.get("rl_beta"),
               "dpo_beta": config.get("dpo_beta") if not config.get("rl_beta") else None,
               "orpo_alpha": config.get("orpo_alpha")}
    winner = next((key for key, value in sources.items() if value is not None), None)
    target = "orpo_alpha" if method == "orpo" else "rl_beta"
    for key in ("trl", "rl_beta", "dpo_beta", "orpo_alpha"):
        if key not in config:
            continue
        if key == winner:
            ports[key] = KeyPort({target: sources[key]}, _beta_note(key, target, method))
        elif key == "orpo_alpha" and method != "orpo" and config[key] is not None:
            ports[key] = KeyPort(drop=f"dropped: ORPO's weight; `rl: {config['rl']}` trains with `{winner}` as beta")
        elif config[key] is not None and key != "trl":
            ports[key] = KeyPort(drop=f"dropped: axolotl trains with `{'trl.beta' if winner == 'trl' else winner}` "
                                      "instead (TRL's beta: trl.beta, else rl_beta, else orpo_alpha)")
    rest = sorted(k for k, v in trl.items() if k != "beta" and v is not None)
    if "trl" in config and rest:
        said = (f"`trl.{'`, `trl.'.join(rest)}` configure axolotl's GRPO trainer: not read by its "
                "DPO/IPO/ORPO/SimPO/KTO")
        base = ports.get("trl", KeyPort())
        ports["trl"] = KeyPort(base.settings, f"{base.note}; {said}", "" if base.settings else f"dropped: {said}")
    elif "trl" in config and "trl" not in ports:
        ports["trl"] = KeyPort(drop="dropped: nothing in it that axolotl's DPO/IPO/ORPO/SimPO/KTO read")


def _beta_note(key: str, target: str, method: str) -> str:
    if key == "trl":
        return "axolotl's `trl.beta` (it wins over `rl_beta`)" + (
            "; for ORPO, TRL's beta is the odds-ratio weight: finetune's `orpo_alpha`" if method == "orpo" else "")
    if key == "dpo_beta":
        return "axolotl's old name for `rl_beta`" + (
            "; for ORPO it is finetune's `orpo_alpha`" if method == "orpo" else "")
    if key == "rl_beta" and target == "orpo_alpha":
        return ("axolotl passes `rl_beta` as TRL's ORPO beta, which is ORPO's odds-ratio weight lambda: finetune's "
                "`orpo_alpha` (axolotl ignores `orpo_alpha` when `rl_beta` is set)")
    if key == "orpo_alpha" and target == "rl_beta":
        return f"axolotl passes `orpo_alpha` as TRL's beta when `rl_beta` is unset, for `rl: {method}` too"
    return ""


def _method_settings(config: dict, method: str, ports: dict[str, KeyPort]) -> None:
    """The settings axolotl passes for one method only; under another `rl:` it ignores them, so they drop."""
    rl = config["rl"]
    smoothing = config.get("dpo_label_smoothing")
    if smoothing is not None:
        if not smoothing:
            ports["dpo_label_smoothing"] = KeyPort(drop="dropped: 0, finetune's default")
        elif method == "dpo":
            ports["dpo_label_smoothing"] = KeyPort({"dpo_label_smoothing": smoothing})
        else:
            ports["dpo_label_smoothing"] = KeyPort(drop="dropped: only DPO's sigmoid loss reads it (not TRL's IPO, "
                                                        f"nor axolotl's other rl trainers); this recipe trains {method}")
    if "rpo_alpha" in config and config["rpo_alpha"] is not None:
        if method in ("dpo", "ipo") and "rpo_alpha" not in ports.get("dpo_loss_type", KeyPort()).settings:
            ports["rpo_alpha"] = KeyPort({"rpo_alpha": config["rpo_alpha"]},
                                         "current axolotl refuses `rpo_alpha` (TRL >= 0.29 writes it `dpo_loss_type: "
                                         "[sigmoid, sft]`); in finetune it is that SFT term's weight, as before")
        else:
            ports["rpo_alpha"] = KeyPort(drop="dropped: axolotl passed it to its DPO trainer only" if method not in
                                         ("dpo", "ipo") else "dropped: `dpo_loss_weights` sets the SFT weight")
    _only(config, "cpo_alpha", "simpo", method, "rpo_alpha", ports,
          "TRL's CPO `cpo_alpha`: the weight of the chosen answers' mean NLL, finetune's `rpo_alpha`")
    _only(config, "simpo_gamma", "simpo", method, "simpo_gamma", ports, "")
    for key in ("kto_desirable_weight", "kto_undesirable_weight"):
        value = config.get(key)
        if method == "kto" and value == 0:  # axolotl passes `weight or 1.0`
            ports[key] = KeyPort({key: 1.0}, "axolotl reads 0 as unset: it trains with weight 1.0 (`weight or 1.0`)")
        else:
            _only(config, key, "kto", method, key, ports, "")


def _only(config: dict, key: str, method_of_key: str, method: str, target: str, ports: dict[str, KeyPort],
          note: str) -> None:
    if key not in config or config[key] is None:
        return
    if method == method_of_key:
        ports[key] = KeyPort({target: config[key]}, note)
    else:
        ports[key] = KeyPort(drop=f"dropped: a `rl: {method_of_key}` setting; axolotl ignores it under "
                                  f"`rl: {config['rl']}`")
