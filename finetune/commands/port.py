"""Convert an axolotl recipe into a finetune recipe, with a comment on every key that changed or was dropped.

    finetune port axolotl.yml -o recipe.yml
    finetune port axolotl.yml -o recipe.yml --set base_model=path/to/model --set datasets.0.path=data.jsonl

The result is validated as it is written: exit 0 when it loads as a finetune recipe, 1 when it was written
but still needs edits (the problems are listed: a value finetune refuses, or an axolotl key that changes what
is trained and that finetune cannot honour, kept as written so the recipe does not load until you decide), 2
when nothing was written (unreadable input, an output that exists, a kind of training finetune does not do,
such as `rl: gdpo`). Records to download or convert before training (and a GRPO dataset transform's command) are
listed either way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from finetune.atomic import write_text_atomic
from finetune.commands.args import add_overrides
from finetune.errors import FinetuneError, RecipeError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("axolotl_recipe", help="the axolotl YAML config to convert")
    parser.add_argument("-o", "--output", required=True, help="where to write the finetune recipe")
    add_overrides(parser)
    parser.add_argument("--force", action="store_true", help="replace the output file if it exists")


def _read(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise FinetuneError(f"no axolotl recipe at `{path}`; check the path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise FinetuneError(f"`{path}` is not a readable YAML file ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise FinetuneError(f"`{path}` is not a mapping of keys to values; is it an axolotl recipe?")
    return data


def _write(path: Path, text: str) -> None:
    """Temp file + rename in the same folder: never a half-written recipe; the umask applies as for any file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


def run(args: argparse.Namespace) -> int:
    from finetune import __version__
    from finetune.port.convert import port_axolotl, render
    from finetune.recipe.load import apply_override, recipe_from_dict

    source, output = Path(args.axolotl_recipe), Path(args.output)
    if output.exists() and not args.force:
        raise FinetuneError(f"`{output}` exists; choose another -o, or pass --force to replace it")
    ported = port_axolotl(_read(source), source.parent.resolve())
    for assignment in args.overrides:
        key = assignment.split("=", 1)[0].split(".")[0]
        written = ported.settings.get(key)
        apply_override(ported.settings, assignment)
        if key in ported.blocked and ported.settings.get(key) is None:  # `--set KEY=null`: decided, without it
            ported.unblock(key, written, f"removed on the command line (--set {assignment}): trained without it")
        else:
            ported.note(key, f"set on the command line: --set {assignment}")
    header = [f"Converted from the axolotl recipe {source.name} by `finetune port` (finetune {__version__}).",
              "Every axolotl key that changed or was dropped has a comment saying why. Relative paths are "
              "relative to this file (axolotl reads them from the working directory). "
              "docs/porting-from-axolotl.md"]
    _write(output, render(ported, header))
    print(f"wrote {output}: {len(ported.settings)} keys set, {ported.dropped_count} axolotl settings dropped "
          f"(each with a comment saying why)")
    problems = [f"  - {line}" for line in ported.blocked.values()]
    try:  # the rest of the recipe too, so one run lists every edit
        recipe_from_dict({k: v for k, v in ported.settings.items() if k not in ported.blocked},
                         base_dir=output.parent.resolve(), source=str(output))
    except RecipeError as err:
        problems.append(str(err))
    if problems:
        kept = (" (kept as written, marked NEEDS YOUR DECISION: they change what is trained and finetune cannot "
                "honour them)") if ported.blocked else ""
        print(f"{output} needs edits before it trains{kept}:\n" + "\n".join(problems), file=sys.stderr)
        _before_training(ported)
        return 1
    print(f"{output} is a valid finetune recipe: `finetune validate {output}` shows it resolved")
    _before_training(ported)
    return 0


def _before_training(ported) -> None:
    if ported.hub_paths:
        print(f"the dataset(s) {', '.join(dict.fromkeys(ported.hub_paths))} are read from the Hugging Face hub when training: the "
              "hub must be reachable then, or download them first and point `path` at the folder (see the comments "
              "in the recipe)")
    for edit in ported.data_edits:
        print(f"before training, convert the records of {edit}")
    for step in ported.todo:
        print(f"before training, {step}")
