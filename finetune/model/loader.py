"""Find the base model and its tokenizer: a local HF folder, a .gguf file (converted once into the cache),
a file inside an installed Python package, or a hub id (from the local HF cache when offline). The tokenizer
is set up here too: a pad token, the recipe's new tokens, the chat template."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from finetune.atomic import honour_umask, temp_dir
from finetune.compat import drop_quantizer
from finetune.contract import CHATML_TEMPLATE
from finetune.errors import ModelError
from finetune.log import get_logger


def package_resource(spec: str) -> Path | None:
    """`pkg/sub/file` -> the file inside installed package `pkg`, when there is one."""
    head, _, rest = spec.partition("/")
    if not rest or not head.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(head)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    for location in found.submodule_search_locations:
        candidate = Path(location) / rest
        if candidate.exists():
            return candidate
    return None


def _gguf_cache_dir(gguf: Path, cache_dir: str) -> Path:
    stat = gguf.stat()
    ident = f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    return Path(cache_dir) / "models" / f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def convert_gguf(gguf: Path, cache_dir: str) -> Path:
    """Dequantize a GGUF file into an HF folder once; later runs load the folder directly."""
    target = _gguf_cache_dir(gguf, cache_dir)
    if (target / "config.json").is_file():
        return target
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"`{gguf}` is a GGUF file; loading it needs the `gguf` package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    get_logger(__name__).info(f"converting {gguf.name} to an HF model in {target} (once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The weights are now dequantized floats: the GGUF quantizer and its config no longer describe them.
        drop_quantizer(model)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        honour_umask(tmp)  # safetensors writes 0600 files (finetune/atomic.py)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process (a parallel run, a test worker) converted the same file first: keep its folder.
            if not (target / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def adapter_folder(name: str) -> Path | None:
    """`name` as a PEFT adapter folder (a finetune LoRA output: adapter_config.json, no config.json), or None.
    A run whose base_model is one starts from its base with that adapter on, and keeps training the adapter."""
    path = Path(name).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        return path
    return None


def adapter_base(folder: Path) -> str:
    """The base model an adapter folder was trained on, from its adapter_config.json."""
    import json

    try:
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise ModelError(f"`{folder}/adapter_config.json` cannot be read ({exc}); is `{folder}` a LoRA output?") from None
    if not base:
        raise ModelError(f"`{folder}/adapter_config.json` does not name its base model (base_model_name_or_path); "
                         "set it to the folder or hub id the adapter was trained on")
    return base


def resolve_model_path(name: str, cache_dir: str) -> str:
    """A local folder for `name`, or `name` itself when it can only be a hub id. An adapter folder resolves to
    its base model (adapter_folder)."""
    adapter = adapter_folder(name)
    if adapter is not None:
        return resolve_model_path(adapter_base(adapter), cache_dir)
    path = Path(name).expanduser()
    if not path.exists():
        path = package_resource(name) or path
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"`{name}` is a file but not a .gguf model; point base_model at a model folder or .gguf")
        return str(convert_gguf(path, cache_dir))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"`{path}` is a folder without config.json; it is not a Hugging Face model folder")
        return str(path)
    if name.startswith((".", "/", "~")) or name.endswith(".gguf"):
        raise ModelError(f"base model `{name}` does not exist; check the path")
    return name  # a hub id


def _not_found(name: str, exc: Exception) -> ModelError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    return ModelError(
        f"cannot load base model `{name}`: it is not a local folder, a .gguf file, a file inside an installed "
        f"package, nor{' (offline)' if offline else ''} a hub model that could be fetched or found in the local "
        f"HF cache. Check the spelling, or download it first. ({exc.__class__.__name__}: {' '.join(str(exc).split())})"
    )


# --- the recipe's new tokens, tokenizer side (finetune/model/tokens.py gives them embedding rows) ---


def recipe_tokens(recipe) -> list[str]:
    """Every token the recipe names, special ones first, without repeats."""
    return list(dict.fromkeys([*recipe.special_tokens.values(), *recipe.tokens]))


def missing_tokens(tokenizer, recipe) -> list[str]:
    """The recipe's tokens that `tokenizer` does not have yet."""
    vocab = tokenizer.get_vocab()
    return [t for t in recipe_tokens(recipe) if t not in vocab]


def add_recipe_tokens(tokenizer, recipe) -> list[str]:
    """Set the recipe's special tokens and add its extra tokens; returns the ones that were new."""
    new = missing_tokens(tokenizer, recipe)
    if recipe.special_tokens:
        tokenizer.add_special_tokens(dict(recipe.special_tokens))
    if recipe.tokens:
        tokenizer.add_tokens(list(recipe.tokens))
    return new


def tokenizer_source(recipe) -> str:
    """The folder (or hub id) the recipe's tokenizer loads from."""
    name = recipe.tokenizer_config or recipe.base_model
    adapter = adapter_folder(name)
    # an adapter run saved its tokenizer beside the adapter (its tokens and chat template): read that one
    return str(adapter) if adapter is not None and (adapter / "tokenizer_config.json").is_file() else \
        resolve_model_path(name, recipe.cache_dir)


def load_tokenizer(recipe):
    """The tokenizer with a pad token and the recipe's chat template applied."""
    from transformers import AutoTokenizer

    name = recipe.tokenizer_config or recipe.base_model
    source = tokenizer_source(recipe)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=recipe.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _not_found(name, exc) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"the tokenizer of `{name}` is not a fast tokenizer; finetune needs offsets from one")
    # before anything reads the vocabulary: the data cache key fingerprints the tokenizer with these tokens
    add_recipe_tokens(tokenizer, recipe)
    if tokenizer.eos_token_id is None:
        raise ModelError(f"the tokenizer of `{name}` has no EOS token; set one with `special_tokens: {{eos_token: ...}}`")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out of the loss anyway
    if recipe.chat_template == "chatml" or (recipe.chat_template == "tokenizer_default" and not tokenizer.chat_template):
        tokenizer.chat_template = CHATML_TEMPLATE
    elif recipe.chat_template == "jinja":
        tokenizer.chat_template = recipe.chat_template_jinja
    return tokenizer
