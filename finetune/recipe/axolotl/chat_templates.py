"""axolotl's chat template names -> finetune's `chat_template`.

axolotl ships a copy of each family's template under a name (`qwen3`, `gemma3`, `phi_3`, `llama3`, `mistral_v7_tekken`
...); finetune renders with the template the base model's tokenizer ships (`tokenizer_default`; ChatML where it has
none). The two agree when axolotl's name is the base's own family; the port says which, from the base model's
config.json when it is a local folder, else by naming the families the template belongs to. Read by `finetune port`
(port/convert.py) and by `finetune validate` (hints.py: no base model, so the families are named).
"""

from __future__ import annotations

import json
from pathlib import Path

SAME_CHAT_TEMPLATES = ("tokenizer_default", "chatml", "jinja")

# axolotl template name -> (the transformers model_types whose instruct tokenizers ship that template, its owner)
OWN_TEMPLATES: dict[str, tuple[tuple[str, ...], str]] = {
    "llama3": (("llama",), "Llama 3"),
    "llama4": (("llama4", "llama4_text"), "Llama 4"),
    "qwen_25": (("qwen2",), "Qwen2.5"),
    "qwen3": (("qwen3", "qwen3_moe", "qwen3_next"), "Qwen3"),
    "qwen3_5": (("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), "Qwen3.5"),
    "gemma": (("gemma", "gemma2"), "Gemma and Gemma 2"),
    "gemma3": (("gemma3", "gemma3_text"), "Gemma 3"),
    "gemma3n": (("gemma3n", "gemma3n_text"), "Gemma 3n"),
    "phi_3": (("phi3",), "Phi-3"),
    "phi_35": (("phi3",), "Phi-3.5"),
    "phi_4": (("phi3",), "Phi-4"),
    "mistral_v1": (("mistral", "mixtral"), "Mistral (v1)"),
    "mistral_v2v3": (("mistral", "mixtral"), "Mistral (v2 / v3)"),
    "mistral_v3_tekken": (("mistral",), "Mistral Nemo (v3, Tekken)"),
    "mistral_v7_tekken": (("mistral", "mistral3"), "Mistral Small (v7, Tekken)"),
    "deepseek_v2": (("deepseek_v2",), "DeepSeek-V2"),
    "deepseek_v3": (("deepseek_v3",), "DeepSeek-V3"),
    "granite": (("granite",), "Granite"),
    "granitemoe": (("granitemoe",), "Granite MoE"),
    "cohere": (("cohere",), "Command R"),
    "command_a": (("cohere2",), "Command A"),
    "exaone4": (("exaone4",), "EXAONE 4"),
    "falcon_h1": (("falcon_h1",), "Falcon-H1"),
    "jamba": (("jamba",), "Jamba"),
    "nemotron": (("nemotron",), "Nemotron"),
    "nemotron_h": (("nemotron_h",), "Nemotron-H"),
}


def base_model_type(base_model, source_dir) -> str | None:
    """The `model_type` in the base model's config.json when base_model is a local folder; None otherwise."""
    if not isinstance(base_model, str):
        return None
    folder = Path(base_model).expanduser()
    if not folder.is_absolute():
        folder = Path(source_dir) / folder
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def chat_template(value, base_model=None, source_dir=".") -> tuple[str, str]:
    """(finetune's chat_template, a note) for axolotl's `chat_template: value` with this base model."""
    if value in SAME_CHAT_TEMPLATES:
        return value, ""
    other = ("to train another template's turns, give it as `chat_template: jinja` with `chat_template_jinja`")
    if value not in OWN_TEMPLATES:
        return "tokenizer_default", (
            f"axolotl's `{value}` template is no family's own: finetune renders with the tokenizer's own chat template "
            f"(ChatML if it has none); {other}")
    families, owner = OWN_TEMPLATES[value]
    model_type = base_model_type(base_model, source_dir)
    if model_type in families:
        return "tokenizer_default", (f"axolotl's `{value}` is {owner}'s own template, which this `{model_type}` "
                                     "base's tokenizer ships: `tokenizer_default` renders the same turns")
    if model_type is not None:
        return "tokenizer_default", (
            f"axolotl's `{value}` is {owner}'s template, but this base is `{model_type}`: finetune renders with the "
            f"tokenizer's own template (ChatML if it has none), not {owner}'s; {other}")
    return "tokenizer_default", (
        f"axolotl's `{value}` is {owner}'s own template (model_type {', '.join(families)}): `tokenizer_default` "
        f"renders the same turns with such a base, whose tokenizer ships it (ChatML if it has none); {other}")
