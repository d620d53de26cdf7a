"""The one `finetune` command. Each verb lives in its own module, imported only when it runs,
so `finetune --help` never imports torch.

A verb module exposes `add_arguments(parser)` and `run(args) -> int`.

`--quiet` / `--verbose` are global: before or after the verb (finetune/log.py says what they do).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from finetune.errors import FinetuneError

# verb -> (module, one-line help). Order is the order shown in --help.
VERBS: dict[str, tuple[str, str]] = {
    "validate": ("finetune.commands.validate",
                 "check a recipe; print it resolved or every problem (exit 2); GRPO: run each reward on a few records"),
    "schema": ("finetune.commands.schema", "print the recipe's JSON schema (or --markdown for docs/recipe.md)"),
    "ingest": ("finetune.commands.ingest", "turn HTML / CSV / SQL / record files into clean JSONL records"),
    "preprocess": ("finetune.commands.preprocess", "tokenize and cache a recipe's datasets; print counts"),
    "train": ("finetune.commands.train", "fine-tune from a recipe (also: accelerate launch -m finetune.train)"),
    "lr": ("finetune.commands.lr", "learning rate from supervised tokens per step"),
    "plan": ("finetune.commands.plan", "memory and steps plan for a recipe or a model config"),
    "targets": ("finetune.commands.targets", "list a model's modules LoRA can target, with parameter counts"),
    "models": ("finetune.commands.models", "the model families finetune knows: packing, attention, GGUF, MoE"),
    "merge": ("finetune.commands.merge", "merge a trained LoRA adapter into its base model"),
    "eval": ("finetune.commands.eval", "evaluate a trained run: base vs tuned held-out loss, answers, lm-eval tasks"),
    "chat": ("finetune.commands.chat", "chat with the trained model"),
    "generate": ("finetune.commands.generate", "generate a reply to one prompt with the trained model"),
    "curves": ("finetune.commands.curves", "re-render loss_curve.png and re-diagnose a finished run"),
    "runs": ("finetune.commands.runs", "compare runs on one HTML page: curves, settings, verdicts, evaluations"),
    "port": ("finetune.commands.port", "convert an axolotl recipe into a finetune recipe, commenting what changed"),
    "export": ("finetune.commands.export", "export a trained run to GGUF (llama.cpp, Ollama, LM Studio) + Modelfile"),
}


GLOBAL_FLAGS = {"--quiet": "quiet", "-q": "quiet", "--verbose": "verbose", "-v": "verbose"}


def _top_help() -> str:
    width = max(len(v) for v in VERBS)
    lines = [
        "usage: finetune VERB [options]   (finetune VERB --help for a verb's options)",
        "",
        "Fine-tune causal language models from one YAML recipe.",
        "",
        "verbs:",
    ]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in VERBS.items()]
    lines += ["", "global options (before or after the verb):",
              "  -q, --quiet    warnings and errors only",
              "  -v, --verbose  debug messages too, from every process of a distributed run"]
    return "\n".join(lines)


def _add_global_flags(parser: argparse.ArgumentParser) -> None:
    """--quiet / --verbose after the verb; a verb that declares one itself (`lr --verbose`, `ingest --quiet`)
    keeps its own help, and its flag then also sets the log level."""
    for flags, dest, text in ((("-q", "--quiet"), "quiet", "warnings and errors only"),
                              (("-v", "--verbose"), "verbose", "debug messages too, from every process")):
        for flag in flags:
            try:
                parser.add_argument(flag, dest=dest, action="store_true", help=text)
            except argparse.ArgumentError:  # the verb has this flag already
                continue


def verb_parser(module_name: str, prog: str, **kwargs) -> argparse.ArgumentParser:
    """A verb's parser: its own arguments, then the global --quiet / --verbose."""
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=prog, description=module.__doc__.strip().splitlines()[0], **kwargs)
    module.add_arguments(parser)
    _add_global_flags(parser)
    return parser


def run_verb(module_name: str, prog: str, argv: list[str], quiet: bool = False, verbose: bool = False) -> int:
    from finetune import log

    module = importlib.import_module(module_name)
    args = verb_parser(module_name, prog).parse_args(argv)
    args.quiet = quiet or getattr(args, "quiet", False)
    args.verbose = verbose or getattr(args, "verbose", False)
    log.configure(quiet=args.quiet, verbose=args.verbose)
    try:
        return int(module.run(args) or 0)
    except FinetuneError as err:
        from finetune.redact import redact_text

        print(f"error: {redact_text(str(err))}", file=sys.stderr)  # a database URL's password stays out
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Run one verb. A reader that stops early (`finetune targets DIR --json | head`) ends the run quietly
    with the status a process killed by SIGPIPE has (128 + 13), as `cat` or `git log` do, not a traceback."""
    try:
        try:
            return _dispatch(argv)
        finally:  # also when argparse exits after --help: buffered output meets the closed pipe here
            sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush has nowhere to fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = set()
    while argv and argv[0] in GLOBAL_FLAGS:  # global flags before the verb
        given.add(GLOBAL_FLAGS[argv.pop(0)])
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        from finetune import __version__

        print(__version__)
        return 0
    verb = argv[0]
    if verb not in VERBS:
        import difflib

        close = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        print(f"error: unknown verb `{verb}`.{hint} Run `finetune --help` for the list.", file=sys.stderr)
        return 2
    module_name, _ = VERBS[verb]
    return run_verb(module_name, f"finetune {verb}", argv[1:], quiet="quiet" in given, verbose="verbose" in given)


if __name__ == "__main__":
    sys.exit(main())
