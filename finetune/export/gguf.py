"""Export a trained run as one GGUF file (llama.cpp, Ollama, LM Studio, llama-cpp-python) plus an Ollama
Modelfile: merge the adapter if there is one (in memory, fp32, unquantized base), then write the weights and
the tokenizer with the `gguf` package's writer. No llama.cpp checkout and no compiler.

Everything is checked before the first byte is written; the file is written to a temporary name in the
output folder and renamed when complete, so a refusal or a crash never leaves a half file under the name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from finetune.atomic import replaced_whole
from finetune.errors import ModelError
from finetune.log import get_logger
from finetune.export.gguf_tensors import QUANT_TYPES


@dataclass
class Exported:
    gguf_path: Path
    modelfile_path: Path
    size_bytes: int
    tensor_count: int
    pre_tokenizer: str
    mmproj_path: Path | None = None  # a vision-language run's tower and projector (export/gguf_mmproj.py)


def _log(message: str) -> None:
    get_logger(__name__).info(message)


def check_output(out: Path) -> None:
    from finetune.export.ollama import modelfile_path

    for path in (out, modelfile_path(out)):
        if path.exists():
            raise ModelError(f"`{path}` already exists; remove it or pass another file with -o/--output "
                             "(an export never overwrites)")
    if out.suffix != ".gguf":
        raise ModelError(f"`{out}`: the output file must end in .gguf (runtimes look for that name)")


def load_model(trained, tokenizer):
    """The model in fp32: the adapter merged into its unquantized base, or the full model as trained.
    `tokenizer`: the run's (merge.saved_tokenizer)."""
    if trained.is_adapter:
        from finetune.model.trained import load_adapter_model

        _log(f"merging the adapter in {trained.folder} into {trained.base_source} (fp32, unquantized)")
        return load_adapter_model(trained, "fp32", tokenizer=tokenizer)[0].merge_and_unload()
    from finetune.model.trained import load_full_model

    _log(f"loading the model in {trained.folder}")
    return load_full_model(trained, "fp32")


def check_family(folder: Path):
    """Refuse an unsupported family or head from config.json alone, before loading any weight."""
    from transformers import AutoConfig

    from finetune.export.gguf_families import family_of

    try:
        config = AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:  # moved folder, or a hub id not in the cache while offline
        raise ModelError(f"cannot read the model's config at `{folder}` ({exc.__class__.__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'not found'}); check that the base model "
                         "and the trained output are where run.json says, then run the export again") from None
    return family_of(config)


def check_quant(quant: str) -> None:
    """Refuse a quantization type the gguf package cannot write, before anything is loaded or written."""
    if quant not in QUANT_TYPES:
        raise ModelError(f"--quant {quant}: choose one of {', '.join(QUANT_TYPES)}")


@contextmanager
def gguf_file(out: Path, arch: str) -> Iterator:
    """A GGUFWriter for `arch` that the block fills (keys, tensors); leaving the block writes the file at `out` whole
    (atomic.replaced_whole: beside it, then renamed); an error inside it writes nothing. The model's GGUF and a
    vision-language model's mmproj file (export/gguf_mmproj.py) are both written through it."""
    import gguf

    writer = gguf.GGUFWriter(None, arch)
    with replaced_whole(out) as tmp, closing(writer):  # closed before the rename, or before the removal
        yield writer
        writer.write_header_to_file(path=Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()


def write_gguf(model, tokenizer, out: Path, quant: str, name: str, prompt_format: str = "chat") -> Exported:
    """Write model + tokenizer as one GGUF at `out`, atomically. Raises ModelError before writing if unfit."""
    from finetune.export.gguf_families import add_hyperparameters, family_of
    from finetune.export.gguf_tensors import add_file_type, encode, gguf_tensors
    from finetune.export.gguf_vocab import add_tokenizer, check_tokenizer
    from finetune.export.ollama import write_modelfile

    check_quant(quant)
    config = model.config
    family = family_of(config)
    check_tokenizer(tokenizer, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gguf_file(out, family.arch) as writer:
        writer.add_name(name)
        add_hyperparameters(writer, config, family)
        add_file_type(writer, quant)
        pre = add_tokenizer(writer, tokenizer, config.vocab_size)
        # every weight named and laid out first: one llama.cpp cannot hold refuses here, with nothing on disk yet
        tensors = list(gguf_tensors(model.state_dict(), config, family))
        for done, (tensor_name, data) in enumerate(tensors, 1):
            array, raw = encode(tensor_name, data, quant)
            writer.add_tensor(tensor_name, array, raw_dtype=raw)
            if done % 32 == 0 or done == len(tensors):
                _log(f"converted {done}/{len(tensors)} tensors ({quant})")
    modelfile = write_modelfile(out, tokenizer, config.max_position_embeddings, prompt_format)
    return Exported(out, modelfile, out.stat().st_size, len(tensors), pre)


def export(trained, out: Path, quant: str) -> Exported:
    """A located run (finetune.model.trained.locate) -> GGUF + Modelfile at `out`."""
    from finetune.export.gguf_vocab import check_tokenizer
    from finetune.model.trained import saved_tokenizer

    check_output(out)
    check_quant(quant)
    check_family(Path(trained.base_source) if trained.is_adapter else trained.folder)
    tokenizer = saved_tokenizer(trained.folder)
    check_tokenizer(tokenizer, out.stem)  # before the merge: a refusal costs seconds, not minutes
    from finetune.model.prompt_format import served_format

    model = load_model(trained, tokenizer)
    return write_gguf(model, tokenizer, out, quant, name=out.stem, prompt_format=served_format(trained.folder)[0])
