"""A records dataset's `path` as `datasets` takes it: a records file (JSONL, JSON, parquet, arrow), a folder laid
out like a hub dataset (parquet/arrow/JSON shards, a dataset card), a `save_to_disk` folder, or a hub dataset
id (with `name`, `split`, `revision`, `data_files`). Loading goes through `datasets.load_dataset` /
`load_from_disk`; this module only says which, and what identifies the data:

  local file or folder   the content hash of every file in it (names relative to it, bytes)
  hub dataset id         the id, config, files and the revision resolved to a commit sha

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from finetune.errors import DataError
from finetune.recipe.data import looks_like_hub_id

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at a folder's top


def source_kind(path: str) -> str:
    """`file`, `saved` (a save_to_disk folder), `folder` (hub-shaped) or `hub`; DataError when it is none."""
    p = Path(path)
    if p.is_file():
        if p.suffix.lower() not in FILE_BUILDERS:
            raise DataError(f"`{path}`: a records file is .jsonl, .json, .parquet or .arrow; for a raw source "
                            "(HTML, CSV, SQL) set the dataset's `type:` to it")
        return "file"
    if p.is_dir():
        if any((p / m).is_file() for m in SAVED_MARKERS):
            return "saved"
        if not any(f.suffix.lower() in FILE_BUILDERS for f in p.rglob("*") if f.is_file()):
            inside = sorted(f.name for f in p.iterdir())[:5]
            listing = f" ({', '.join(inside)} {'is' if len(inside) == 1 else 'are'} in it)" if inside else " (it is empty)"
            raise DataError(f"`{path}` is a folder with no records files{listing}: a records dataset's folder holds "
                            ".parquet, .arrow, .jsonl or .json files (as on the hub) or is a save_to_disk folder; "
                            "for a folder of HTML, CSV or SQL sources set the entry's `type` to the source "
                            "(e.g. `type: html`)")
        return "folder"
    if looks_like_hub_id(path):
        return "hub"
    raise DataError(f"no data at `{path}`; check the dataset path in the recipe (a records file, a folder of "
                    "parquet/arrow/JSON shards, a save_to_disk folder, or a hub dataset id like `tatsu-lab/alpaca`)")


def local_digest(path: str) -> str:
    """The content hash of a local file or of every file under a folder (names relative to it), `.cache` and
    hidden folders aside (datasets writes its own cache there)."""
    digest = hashlib.sha256()
    p = Path(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and not any(
        part.startswith(".") for part in f.relative_to(p).parts))
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        digest.update(f"{f.relative_to(p) if f != p else f.name}:{h.hexdigest()}\n".encode())
    return digest.hexdigest()


def offline_message(spec, why: str) -> str:
    local = "data/" + spec.path.split("/")[-1]
    return (f"no file or folder `{spec.path}` is here (relative to the recipe), and as a Hugging Face hub dataset "
            f"id it cannot be fetched: {why}; download it "
            f"where the hub is reachable: `hf download --repo-type dataset {spec.path} --local-dir "
            f"{local}` (with `--revision` for a revision), copy the folder here, and set the dataset's `path: {local}` "
            "(parquet/arrow/JSON shards or a save_to_disk folder are read as they are)")


def check_options(spec, kind: str) -> None:
    """DataError for a hub option where it means nothing: a setting is never silently ignored."""
    applies = {"name": ("hub", "folder"), "data_files": ("hub", "folder"), "revision": ("hub",),
               "split": ("hub", "folder", "saved")}
    what = {"file": "a single file (one split)", "json": "a single file (one split)", "saved": "a save_to_disk folder",
            "folder": "a local folder"}
    for key, kinds in applies.items():
        value = getattr(spec, key)
        if kind not in kinds and value is not None and not (key == "split" and value == "train"):
            raise DataError(f"`{spec.path}`: `{key}: {value}` does not apply to {what[kind]}; it works with "
                            f"{' and '.join({'hub': 'hub ids', 'folder': 'hub-shaped folders', 'saved': 'save_to_disk folders'}[k] for k in kinds)}")


def _offline() -> bool:
    from huggingface_hub.constants import HF_HUB_OFFLINE

    truthy = ("1", "true", "yes", "on")
    return bool(HF_HUB_OFFLINE) or any(os.environ.get(name, "").lower() in truthy
                                       for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def resolve_hub_revision(spec) -> str:
    """The commit sha the hub id (at `revision`) points to now; DataError saying how to get the files when offline."""
    if _offline():
        raise DataError(offline_message(spec, "the hub cannot be reached (HF_HUB_OFFLINE is set)"))
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(spec.path, revision=spec.revision).sha
    except Exception as exc:  # connection, unknown repo, gated: one message, nothing written
        said = " ".join(str(exc).split())  # whole: a message cut short can end mid-URL
        raise DataError(offline_message(spec, f"asking the hub for it failed ({type(exc).__name__}: {said})")) \
            from None


def identity(spec, kind: str, revision: str | None = None) -> str:
    """What identifies the data of a records source, for the cache key: the hub commit, or the content hash."""
    where = {"name": spec.name, "split": spec.split, "data_files": spec.data_files}
    if kind == "hub":
        return f"hub:{spec.path}@{revision}:{where}"
    return f"{kind}:{local_digest(spec.path)}:{where}"


def undecoded_images(rows) -> tuple[object, list[str]]:
    """(the rows with their image columns left undecoded: datasets' {"bytes", "path"}, not a PIL image decoded
    for every row, the names of those columns). An image column is an Image feature or a list of them."""
    import dataclasses

    from datasets import Image

    features, columns = rows.features.copy(), []
    for name, feature in rows.features.items():
        if isinstance(feature, Image):
            features[name] = Image(decode=False)
        elif isinstance(getattr(feature, "feature", None), Image) and dataclasses.is_dataclass(feature):
            features[name] = dataclasses.replace(feature, feature=Image(decode=False))  # List / Sequence of images
        else:
            continue
        columns.append(name)
    return (rows.cast(features) if columns else rows), columns


def load_rows(spec, kind: str, revision: str | None = None, cache_dir: str | None = None):
    """The dataset's rows (a `datasets.Dataset`) for the spec's split; DataError naming what is missing.

    `datasets` keeps its arrow copy of a local source under `cache_dir` (the recipe's), not the user's home; a
    hub dataset stays in the Hugging Face cache. A local source is
    prepared afresh: this runs only when its content hash is new, and datasets' own key for local files is
    their paths and modification times, which an in-place edit can keep."""
    import datasets

    datasets.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    try:
        if kind == "saved":
            loaded = datasets.load_from_disk(spec.path)
            if isinstance(loaded, datasets.DatasetDict):
                if spec.split not in loaded:
                    raise DataError(f"`{spec.path}` has the splits {', '.join(loaded)}, not `{spec.split}`; set the "
                                    "dataset's `split:` to one of them")
                loaded = loaded[spec.split]
            return loaded
        fresh = None if kind == "hub" else "force_redownload"
        if kind == "file":
            builder = FILE_BUILDERS[Path(spec.path).suffix.lower()]
            return datasets.load_dataset(builder, data_files=spec.path, split="train", cache_dir=cache_dir,
                                         download_mode=fresh)
        # a hub dataset stays in the user's Hugging Face cache, shared by every project, like a hub model
        return datasets.load_dataset(spec.path, name=spec.name, split=spec.split, data_files=spec.data_files,
                                     revision=revision if kind == "hub" else None,
                                     cache_dir=None if kind == "hub" else cache_dir, download_mode=fresh)
    except DataError:
        raise
    except ValueError as exc:  # an unknown split or config: datasets says which exist
        raise DataError(f"`{spec.path}` cannot be loaded as asked (name: {spec.name}, split: {spec.split}, "
                        f"data_files: {spec.data_files}): {str(exc).splitlines()[0][:400]}") from None
    except Exception as exc:
        raise DataError(f"`{spec.path}` cannot be read as a dataset ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:400] if str(exc) else ''}); a records dataset is JSONL, JSON, "
                        "parquet or arrow files, a save_to_disk folder, or a hub dataset id") from None
