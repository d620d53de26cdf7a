"""The import structure of finetune/ (DESIGN.md, "The layout"): imports point down the pipeline only.

    shared base   three floors, nothing heavy at import time: the top-level modules (errors, redact, log, compat,
                  contract, ...: any top-level module but cli.py) < finetune.recipe/ (the recipe package) < port/
                  (other tools' recipes -> a Recipe); each imports only its own floor and those below
    ingest < data < model < train < export < evaluation < runs < commands (and cli.py, on top); ingestion never
                  reaches torch; export (merge, GGUF) sits beside evaluation, which may check an export; runs (the
                  runs page) reads run folders and evaluation reports, and the train verb writes a run's page
    method folders  a stage's folder for one training method (train/preference/, data/preference/, train/grpo/,
                  ...) never imports another method's folder: what two methods share lives in the stage itself
    plan/         beside the stages: pure math, imports only the base and plan/
    __main__      entry points: may import the CLI (`python -m finetune.train` is `finetune train`)

Every module is parsed (never imported), and every `import` / `from ... import` at any depth counts,
lazy imports inside functions included. Cycles are judged twice: on module-level imports (what Python
would trip on), and with lazy imports too, where only a package reaching its own submodules is fine.
New modules fit these rules by their package, without edits here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "finetune"

STAGES = ("ingest", "data", "model", "train", "export", "evaluation", "runs", "commands")  # the pipeline order, earliest first
# The shared base's floors, lowest first: port builds a Recipe, so the recipe (reading a recipe, naming the fix for a
# key it does not know) may not import port. They were one floor here once, which let recipe/load.py import
# port.axolotl unseen: an edge inside one floor is never checked.
BASE_FLOORS = ("base", "recipe", "port")
BASE_RANK, TOP_RANK = 0, len(BASE_FLOORS) + len(STAGES) - 1  # cli.py sits with commands, on top
# An entry point (`__main__`) may import the CLI it shares its code with: `python -m finetune.train` is
# `finetune train`.
CLI = ("finetune.cli", "finetune.commands")
# The one base module whose job is to touch the libraries (at their versions); it may import them.
LIBRARY_SHIMS = ("finetune.compat",)
# Imports that bring torch with them; ingestion must stay free of them (it runs where torch is absent).
TORCH_FAMILY = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "trl", "flash_attn")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def _import_time_nodes(tree: ast.Module) -> set[int]:
    """Every node that runs when the module is imported: not function bodies, not `if TYPE_CHECKING:`."""
    found, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        found.add(id(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or _type_checking(node):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, at import time) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top = _import_time_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, name, path)
            for alias in node.names:
                sub = f"{target}.{alias.name}"  # `from finetune.data import batched` imports a module
                found.append((sub if sub in known else target, node.lineno, id(node) in top))
    return list(dict.fromkeys(found))


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> tuple[str, int]:
    """(layer name, rank) of a finetune module; plan has no rank (it sits beside the stages)."""
    parts = name.split(".")
    if len(parts) == 1:
        return "base", BASE_RANK  # the package itself: a version string, nothing else
    if parts[1] in ("cli", "__main__"):
        return "cli", TOP_RANK
    if parts[1] == "plan":
        return "plan", -1
    if parts[1] in STAGES:
        return parts[1], len(BASE_FLOORS) + STAGES.index(parts[1])
    if parts[1] in BASE_FLOORS:
        return parts[1], BASE_FLOORS.index(parts[1])
    return "base", BASE_RANK


def _internal(target: str) -> bool:
    return target == "finetune" or target.startswith("finetune.")


def _entry_point_to_cli(source: str, target: str) -> bool:
    return source.endswith(".__main__") and target.startswith(CLI)


def _heavy(target: str) -> bool:
    return target.split(".")[0] in TORCH_FAMILY


def layer_problems(edges: dict) -> list[str]:
    problems = []
    for source, targets in edges.items():
        src_layer, src_rank = layer(source)
        for target, line, _ in targets:
            if not _internal(target) or _entry_point_to_cli(source, target):
                continue
            dst_layer, dst_rank = layer(target)
            edge = f"{source} (line {line}) imports {target}"
            if src_layer == "plan":
                if dst_layer != "plan" and dst_layer not in BASE_FLOORS:
                    problems.append(f"{edge}: plan/ is pure math and imports only the shared base and plan/")
            elif dst_layer == "plan":
                if src_layer in BASE_FLOORS:
                    problems.append(f"{edge}: the shared base imports nothing above it, plan/ included")
            elif dst_rank > src_rank:
                problems.append(f"{edge}: {src_layer} may not import {dst_layer}, a later floor "
                                f"(order: {' < '.join(BASE_FLOORS + STAGES)}/cli); move the shared part down")
    return problems


def _lazy_edge_allowed(source: str, target: str) -> bool:
    """A package's __init__ may reach its own submodules lazily (to keep `import finetune.x` light)."""
    return target.startswith(source + ".")


def import_cycles(edges: dict, lazy: bool = False) -> list[list[str]]:
    """One cycle per group of modules that import each other, as a path; module-level imports only, or with
    `lazy` also the imports inside functions (except a package reaching its own submodules)."""
    nodes = set(edges)
    succ = {n: sorted({t for t, _, top in edges[n] if t in nodes and t != n
                       and (top or (lazy and not _lazy_edge_allowed(n, t)))}) for n in nodes}
    cycles, done = [], set()
    for start in sorted(nodes):
        if start in done:
            continue
        # depth-first search for a path back to `start`
        stack, seen = [(start, [start])], {start}
        while stack:
            node, path = stack.pop()
            for nxt in succ[node]:
                if nxt == start:
                    cycles.append(path + [start])
                    done.update(path)
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return cycles


def torch_problems(edges: dict) -> list[str]:
    """Ingestion modules importing torch (or a library that brings it), directly or through a module they
    import at module level."""
    problems = []
    for source, targets in edges.items():
        if layer(source)[0] != "ingest":
            continue
        problems += [f"{source} (line {line}) imports {target}: ingestion never imports torch"
                     for target, line, _ in targets if _heavy(target)]
        # what this module loads at import time, transitively
        reach, todo = set(), [t for t, _, top in targets if top and t in edges]
        while todo:
            mod = todo.pop()
            if mod in reach:
                continue
            reach.add(mod)
            for target, line, top in edges[mod]:
                if top and _heavy(target):
                    problems.append(f"{source} imports {mod}, which imports {target} at module level "
                                    f"(line {line}): ingestion never imports torch")
                elif top and target in edges:
                    todo.append(target)
    return problems


@pytest.fixture(scope="module")
def edges():
    return graph()


def test_no_stage_imports_a_later_stage(edges):
    problems = layer_problems(edges)
    assert not problems, "imports that point up the pipeline:\n" + "\n".join(problems)


def test_no_module_level_import_cycle(edges):
    cycles = import_cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_two_modules_need_each_other_even_lazily(edges):
    """A lazy import hides a cycle from Python but not from a reader: the two modules are one concern, or
    the shared part belongs in a third module both import."""
    cycles = import_cycles(edges, lazy=True)
    assert not cycles, "modules that import each other (inside functions too):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_ingestion_never_imports_torch(edges):
    problems = torch_problems(edges)
    assert not problems, "\n".join(problems)


METHODS = ("preference", "reward", "grpo")  # the methods beyond SFT, each a folder inside the stages it needs


def method_of(name: str) -> str | None:
    """The method folder a module belongs to (finetune.train.preference.loss -> preference), or None."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] in STAGES and parts[2] in METHODS else None


def method_problems(edges: dict) -> list[str]:
    problems = []
    for source, targets in edges.items():
        mine = method_of(source)
        for target, line, _ in targets:
            theirs = method_of(target)
            if mine and theirs and theirs != mine:
                problems.append(f"{source} (line {line}) imports {target}: the {mine} method's code reaches into "
                                f"the {theirs} method's folder; move what both need into the stage's shared modules")
    return problems


def test_a_method_folder_never_imports_another_methods(edges):
    problems = method_problems(edges)
    assert not problems, "\n".join(problems)


def test_the_method_check_catches_a_crossing():
    bad = {"finetune.train.grpo.loss": [("finetune.train.preference.loss", 7, True), ("finetune.train.settings", 8, True)],
           "finetune.data.grpo.prompts": [("finetune.data.preference.pairs", 3, False)],
           "finetune.train.run": [("finetune.train.grpo.loss", 9, False)]}
    problems = method_problems(bad)
    assert len(problems) == 2
    assert problems[0].startswith("finetune.train.grpo.loss (line 7) imports finetune.train.preference.loss")


def test_library_never_imports_the_cli(edges):
    bad = [f"{source} (line {line}) imports {target}" for source, targets in edges.items()
           if layer(source)[0] not in ("cli", "commands")
           for target, line, _ in targets
           if target.startswith(CLI) and not _entry_point_to_cli(source, target)]
    assert not bad, "the library imports the CLI:\n" + "\n".join(bad)


def test_the_shared_base_imports_nothing_heavy_at_import_time(edges):
    """The recipe, its checks and the contract load in `finetune validate` and `finetune --help`: no torch."""
    bad = [f"{source} (line {line}) imports {target} at module level; import it inside the function that needs it"
           for source, targets in edges.items() if layer(source)[0] in BASE_FLOORS and source not in LIBRARY_SHIMS
           for target, line, top in targets if top and _heavy(target)]
    assert not bad, "\n".join(bad)


@functools.lru_cache(maxsize=None)
def defined_names(path: Path) -> set[str] | None:
    """The names a module defines at top level (functions, classes, assignments, imports); None when it has
    a module __getattr__ (it may answer any name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Name,)) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return None if "__getattr__" in names else names


def dangling_imports(files: list[Path]) -> list[str]:
    """`from finetune.x import name` in `files` where finetune.x or its `name` does not exist."""
    mods = modules()
    problems = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and not node.level and _internal(node.module or "")):
                continue
            where = f"{path.relative_to(ROOT.parent) if path.is_relative_to(ROOT.parent) else path.name}:{node.lineno}"
            if node.module not in mods:
                problems.append(f"{where} imports {node.module}, which does not exist")
                continue
            names = defined_names(mods[node.module])
            for alias in node.names:
                if names is not None and alias.name not in names and f"{node.module}.{alias.name}" not in mods:
                    problems.append(f"{where} imports {alias.name} from {node.module}, which has no such name")
    return problems


def test_every_import_of_finetune_resolves():
    """A module or a name that moved leaves no import behind, in the package, the tests or the benchmarks
    (the benchmarks run on demand only, so nothing else would notice)."""
    files = [p for folder in ("finetune", "tests", "benchmarks", "examples") for p in (ROOT.parent / folder).rglob("*.py")]
    problems = dangling_imports(files)
    assert not problems, "\n".join(problems)


# --- the checks themselves catch what they are for ---------------------------------------------------


def test_the_checks_catch_each_kind_of_bad_edge():
    bad = {
        "finetune.data.x": [("finetune.model.y", 3, False)],  # lazy, still up the pipeline
        "finetune.plan.p": [("finetune.data.x", 4, True)],
        "finetune.recipe.load": [("finetune.train.checkpoints", 14, True)],
        "finetune.model.a": [("finetune.model.b", 1, True)],
        "finetune.model.b": [("finetune.model.a", 2, True)],
        "finetune.ingest.i": [("finetune.ingest.j", 1, True)],
        "finetune.ingest.j": [("transformers", 9, True)],
        "finetune.model.y": [],
        "finetune.train.checkpoints": [],
        "finetune.train.__main__": [("finetune.cli", 1, True)],  # the entry point: allowed
        "finetune.__main__": [("finetune.commands.train", 1, True)],  # allowed too
    }
    problems = layer_problems(bad)
    assert any("finetune.data.x (line 3) imports finetune.model.y" in p for p in problems)
    assert any("finetune.plan.p (line 4) imports finetune.data.x" in p for p in problems)
    assert any("finetune.recipe.load (line 14) imports finetune.train.checkpoints" in p for p in problems)
    assert len(problems) == 3
    assert import_cycles(bad) == [["finetune.model.a", "finetune.model.b", "finetune.model.a"]]
    lazy_back = {**bad, "finetune.model.b": [("finetune.model.a", 2, False)]}
    assert import_cycles(lazy_back) == []
    assert import_cycles(lazy_back, lazy=True) == [["finetune.model.a", "finetune.model.b", "finetune.model.a"]]
    package = {"finetune.model": [("finetune.model.a", 5, False)], "finetune.model.a": [("finetune.model", 1, True)]}
    assert import_cycles(package, lazy=True) == []
    assert sorted(torch_problems(bad)) == ["finetune.ingest.i imports finetune.ingest.j, which imports transformers at "
                                   "module level (line 9): ingestion never imports torch",
                                   "finetune.ingest.j (line 9) imports transformers: ingestion never imports torch"]


def test_the_shared_bases_floors_are_checked():
    """The top-level modules < the recipe < port: port builds a Recipe, so the recipe importing port (its key hints
    once did: recipe/load.py -> port/axolotl.py) is an arrow up, as is a top-level module reaching into the recipe."""
    bad = {
        "finetune.recipe.load": [("finetune.port.axolotl", 15, True), ("finetune.errors", 14, True),
                                 ("finetune.recipe.axolotl.hints", 16, False)],
        "finetune.reward_functions": [("finetune.recipe.grpo", 3, False)],
        "finetune.recipe.grpo": [("finetune.plan.grpo", 9, False)],
        "finetune.port.convert": [("finetune.recipe.schema", 18, True), ("finetune.errors", 17, True)],
        "finetune.plan.grpo": [("finetune.recipe.grpo", 2, True)],
        "finetune.ingest.pipeline": [("finetune.recipe.data", 5, True)],
    }
    problems = layer_problems(bad)
    assert len(problems) == 3, problems
    assert problems[0].startswith("finetune.recipe.load (line 15) imports finetune.port.axolotl: recipe may not "
                                  "import port, a later floor")
    assert problems[1].startswith("finetune.reward_functions (line 3) imports finetune.recipe.grpo: base may not "
                                  "import recipe")
    assert "the shared base imports nothing above it, plan/ included" in problems[2]


def test_a_moved_name_is_a_dangling_import(tmp_path):
    bench = tmp_path / "bench_old.py"
    bench.write_text("from finetune.data.formats import encode_moved\nfrom finetune.data.gone import encode_stream\n"
                     "from finetune.contract import IGNORE_INDEX\nfrom finetune.train import run_training\n"
                     "from finetune.data import formats\n")
    assert dangling_imports([bench]) == [
        "bench_old.py:1 imports encode_moved from finetune.data.formats, which has no such name",
        "bench_old.py:2 imports finetune.data.gone, which does not exist",
    ]


def test_lazy_and_relative_imports_are_seen(tmp_path):
    pkg = tmp_path / "finetune" / "data"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    src = pkg / "mod.py"
    src.write_text("import os\nfrom . import sib\n\ndef f():\n    from finetune.model import build\n"
                   "    import torch\n\nif TYPE_CHECKING:\n    import peft\ntry:\n    import yaml\nexcept ImportError:\n"
                   "    pass\n")
    known = {"finetune.data.sib", "finetune.model"}
    found = imports("finetune.data.mod", src, known)
    assert sorted(found) == [("finetune.data.sib", 2, True), ("finetune.model", 5, False), ("os", 1, True),
                             ("peft", 9, False), ("torch", 6, False), ("yaml", 11, True)]
