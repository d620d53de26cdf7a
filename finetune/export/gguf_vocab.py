"""The tokenizer half of a GGUF file: vocabulary, merges, token types, special ids, add-BOS/EOS and the chat
template, under llama.cpp's `tokenizer.ggml.*` keys, so a runtime tokenizes and renders chats as training did.

Two kinds are written. Byte-level BPE (GPT-2 style: SmolLM, Llama 3, Qwen2/3, OLMo 2, gpt-oss ...): llama.cpp
splits text before BPE with a named regex (`tokenizer.ggml.pre`), which we pick by reading the tokenizer's own
pre-tokenizer rather than guessing from the model's name. Sentencepiece BPE (Llama 2, Mistral v0.1, Mixtral,
Phi-3-mini, Gemma), as transformers' tokenizer.json holds it (BPE with byte fallback, `▁` for a space): llama.cpp's
`llama` tokenizer, which merges by token score, so each token's score is its merge's rank.
"""

from __future__ import annotations

import json
import re

from finetune.errors import ModelError

# llama_token_type in llama.cpp (gguf.TokenType): how the runtime treats a token when it meets it in text
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"  # sentencepiece's visible space

# The split regexes of the byte-level tokenizers we recognise, as their tokenizer.json spells them, with the
# name llama.cpp gives the same split. The plain GPT-2 split has no regex in the JSON (ByteLevel use_regex).
_LLAMA3_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
# o200k (GPT-4o, gpt-oss): llama.cpp quotes this as the "original regex from tokenizer.json" of `gpt-4o`
_GPT4O_SPLIT = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_SPLIT_NAMES = {_LLAMA3_SPLIT: "llama-bpe", _QWEN2_SPLIT: "qwen2", _GPT4O_SPLIT: "gpt-4o"}


def _pre_tokenizer_name(pre: dict | None, ignore_merges: bool = False) -> str | None:
    """llama.cpp's name for this pre-tokenizer, or None if it is not one llama.cpp implements the same way."""
    if pre is None:
        return None
    steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    kinds = [s["type"] for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True) and not steps[0].get("add_prefix_space"):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"  # each digit alone, then the GPT-2 split (SmolLM's own tokenizer.json)
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        name = _SPLIT_NAMES.get(steps[0].get("pattern", {}).get("Regex"))
        # llama.cpp's `llama-bpe` also takes a whole word found in the vocabulary before merging (ignore_merges,
        # as Llama 3's tokenizer.json says); `dbrx` is the same split without it (cl100k: OLMo 2, DBRX, Phi-4)
        return "dbrx" if name == "llama-bpe" and not ignore_merges else name
    return None


def _space_prefix(spec: dict) -> bool | None:
    """For a sentencepiece vocabulary: whether a space goes before the text, or None for a shape llama.cpp does not
    share. llama.cpp puts one before the text and after every special token, even text that starts with a space
    (add_space_prefix), as a `Prepend` normalizer does (Llama 2's tokenizer.json); or none (Gemma)."""
    norm, pre = spec.get("normalizer"), spec.get("pre_tokenizer")
    steps = (norm["normalizers"] if norm["type"] == "Sequence" else [norm]) if norm else []
    kinds = [(s["type"], s.get("prepend") or s.get("pattern", {}).get("String"), s.get("content")) for s in steps]
    # after a normalizer that spells every space `▁`, a split on " " (Gemma's) finds nothing to split
    no_split = pre is None or (pre["type"] == "Split" and pre.get("pattern", {}).get("String") == " ")
    if no_split and kinds in ([("Replace", " ", _SPACE)], [("Prepend", _SPACE, None), ("Replace", " ", _SPACE)]):
        return len(kinds) == 2  # legacy Llama 2 / Mistral (Prepend + Replace); Gemma (Replace only)
    # transformers' `Metaspace` adds no space to text that starts with one, llama.cpp does: only `never` agrees
    if not steps and pre and pre["type"] == "Metaspace" and pre.get("replacement") == _SPACE \
            and not pre.get("split", True) and pre.get("prepend_scheme") == "never":
        return False
    return None


def _describe(tokenizer) -> tuple[dict, str, bool | None]:
    """(tokenizer.json, llama.cpp's pre-tokenizer name, the space prefix of a sentencepiece vocabulary or None)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    if model["type"] == "BPE" and model.get("byte_fallback"):
        prefix = _space_prefix(spec)
        if prefix is None:
            raise ModelError(
                "the tokenizer is a sentencepiece-style vocabulary (BPE with byte fallback) whose space handling "
                f"llama.cpp does not share (normalizer {json.dumps(spec.get('normalizer'))[:120]}, pre-tokenizer "
                f"{json.dumps(spec.get('pre_tokenizer'))[:160]}; llama.cpp puts a space before every text and after "
                "every special token, a `Metaspace` pre-tokenizer does not always): a runtime would tokenize "
                "differently from training, so nothing was written. Convert the merged model with llama.cpp's "
                "convert_hf_to_gguf.py"
            )
        return spec, "default", prefix
    if model["type"] != "BPE":
        raise ModelError(
            f"the tokenizer is a {model['type']} vocabulary; this exporter writes BPE tokenizers (byte-level, or "
            "sentencepiece BPE). Convert the merged model with llama.cpp's convert_hf_to_gguf.py"
        )
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"), model.get("ignore_merges", False))
    if pre is None:
        raise ModelError(
            f"the tokenizer splits text with a pre-tokenizer llama.cpp has no name for "
            f"({json.dumps(spec.get('pre_tokenizer'))[:200]}); a runtime would tokenize differently from training, "
            "so nothing was written"
        )
    return spec, pre, None


# llama.cpp sets Phi-3's token attributes when the file's general.name contains "phi3" or "phi-3", looking these
# tokens up by their text (llama-vocab.cpp, whatever the architecture): one missing and the file does not load
_PHI3_NAME_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def check_tokenizer(tokenizer, name: str = "") -> None:
    """Refuse a tokenizer this exporter cannot write (sentencepiece-style, or a pre-tokenizer llama.cpp has no
    name for), or a file name llama.cpp would not load with it, from the tokenizer alone: the export asks before
    the minutes-long fp32 merge."""
    _describe(tokenizer)
    missing = [t for t in _PHI3_NAME_TOKENS if t not in tokenizer.get_vocab()]
    if any(part in name.lower() for part in ("phi3", "phi-3")) and missing:
        raise ModelError(
            f"llama.cpp treats a file named `{name}` as Phi-3 and looks up its tokens {', '.join(missing)}, which "
            "this vocabulary does not have: it would not load. Name the output file without phi3 / phi-3 (-o)"
        )


def _tokens(tokenizer, spec: dict, vocab_size: int, spm: bool) -> tuple[list[str], list[int]]:
    """Every id 0..vocab_size-1 with its spelling and type; ids the model has but the tokenizer lacks are UNUSED."""
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    added = {a["id"]: a for a in spec.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            entry = added[i]
            tokens.append(entry["content"])
            types.append(CONTROL if entry.get("special") else USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            # sentencepiece's byte fallback: llama.cpp spells a character missing from the vocabulary with these
            types.append(BYTE if spm and re.fullmatch(r"<0x[0-9A-F]{2}>", by_id[i]) else NORMAL)
        else:  # the embedding was padded past the tokenizer (a multiple of 64 ...): never produced
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        if spm and tokens[-1] == spec["model"].get("unk_token"):
            types[-1] = UNKNOWN
    if len(tokenizer) > vocab_size:
        raise ModelError(f"the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
                         f"{vocab_size}; resize the embedding (the run's `tokens:` does) before exporting")
    return tokens, types


def _adds(tokenizer, token_id: int | None, at_start: bool) -> bool:
    """Whether encoding text puts this special token at the start (BOS) or end (EOS), as the tokenizer does."""
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0 if at_start else -1] == token_id


def _scores(tokens: list[str], spec: dict) -> list[float]:
    """llama.cpp's sentencepiece tokenizer merges the adjacent pair whose joined token scores highest; BPE merges
    the pair ranked first: a token's score is minus the rank of the first merge that makes it (0 for the rest)."""
    rank: dict[str, int] = {}
    for i, merge in enumerate(spec["model"].get("merges", [])):
        rank.setdefault("".join(merge.split(" ", 1) if isinstance(merge, str) else merge), i)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def add_tokenizer(writer, tokenizer, vocab_size: int) -> str:
    """Write the tokenizer keys; return llama.cpp's pre-tokenizer name (for the report)."""
    spec, pre, space_prefix = _describe(tokenizer)
    spm = space_prefix is not None
    tokens, types = _tokens(tokenizer, spec, vocab_size, spm)
    writer.add_tokenizer_model("llama" if spm else "gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if spm:
        writer.add_token_scores(_scores(tokens, spec))
        writer.add_add_space_prefix(space_prefix)
    else:
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])])
    for token_id, add in ((tokenizer.bos_token_id, writer.add_bos_token_id),
                          (tokenizer.eos_token_id, writer.add_eos_token_id),
                          (tokenizer.unk_token_id, writer.add_unk_token_id),
                          (tokenizer.pad_token_id, writer.add_pad_token_id)):
        if token_id is not None:
            add(token_id)
    writer.add_add_bos_token(_adds(tokenizer, tokenizer.bos_token_id, at_start=True))
    writer.add_add_eos_token(_adds(tokenizer, tokenizer.eos_token_id, at_start=False))
    template = tokenizer.chat_template
    if isinstance(template, dict):  # several named templates: the runtimes read the default one
        template = template.get("default")
    if template:
        writer.add_chat_template(template)
    return pre
