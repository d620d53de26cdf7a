"""A GPU fast path is used only once it has run on this device: flex_attention and compiled decoder layers.

    prove_fast_paths(recipe, choice, probes)   before the model loads (settings.resolve): probe what was chosen
    kernel_failures(settings, layout, step)    around training: a kernel failure later on -> one message

What a probe finds, by who asked for the path:
- `auto` chose it (flex_attention for packed rows, compile on a GPU of compute capability 8.0+): a failed probe
  falls back (flex_attention -> sdpa, compile -> eager); the run says so once, with the reason, as a warning
  (say(): the run's attention and compile lines), and run.json records it (attn_reason / compile_reason,
  fast_path_probes).
- the recipe set it (`attn_implementation: flex_attention`, `compile: true`): a failed probe stops the run before
  anything is written (FastPathError, exit 2), naming the key and the alternative.
Nothing is probed where nothing would be chosen from it: `auto` on CPU or on a GPU older than 8.0 picks sdpa and
eager without asking (finetune/model/device.py). The probes themselves: finetune/model/probes.py. Every process of
a distributed run probes its own GPU, and all of them take a path only if it passed everywhere (a failure
elsewhere is named: `on process R of this run: ...`).

A probe sees one shape on a one-layer stand-in; a kernel that fails later (a new shape in the first steps, the
LoRA or 4-bit layers the stand-in lacks) ends the run with one message naming the key to set; the checkpoints
written before it stay complete (a failed step is never saved) and the next run resumes from the newest.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

from finetune.errors import FinetuneError
from finetune.log import get_logger

log = get_logger(__name__)

DOCS = "docs/troubleshooting.md#a-gpu-fast-path-does-not-fit-this-gpu"


class FastPathError(FinetuneError):
    """A GPU fast path the recipe asked for cannot run here, or a fast path failed while training."""


@dataclass(frozen=True)
class Choice:
    """What the run uses: attention and compile, each with its reason, and what the probes found."""

    attn_implementation: str
    attn_reason: str
    compile: bool
    compile_reason: str
    probes: dict  # {"flex_attention": {...}, "compile": {...}}: only the paths that were probed


def error_text(exc: BaseException, limit: int = 400) -> str:
    """The exception in one line: its type and the first paragraph of its message (Triton's says what ran out
    and by how much; what dynamo appends after a blank line is how to get its stack trace)."""
    paragraph = str(exc).strip().split("\n\n")[0]
    lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {' '.join(lines[:4])}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


class DeviceProbes:
    """The real probes (finetune/model/probes.py) for this recipe on its training device."""

    def __init__(self, recipe, device, precision: str):
        self.recipe, self.device, self.precision = recipe, device, precision
        self._spec = None

    def spec(self):
        if self._spec is None:
            import torch
            from transformers import AutoConfig

            from finetune.model.loader import resolve_model_path
            from finetune.model.probes import ProbeSpec, ProbeUnavailable

            recipe = self.recipe
            try:
                config = AutoConfig.from_pretrained(resolve_model_path(recipe.base_model, recipe.cache_dir),
                                                    trust_remote_code=recipe.trust_remote_code)
            except Exception as exc:  # noqa: BLE001 remote code may raise anything; loading reports it properly
                raise ProbeUnavailable(f"the base model's config could not be read: {error_text(exc)}") from exc
            dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
            adapters = recipe.adapter != "none"
            # as load_base_model: adapters train on a base in the compute dtype, a full fine-tune keeps fp32 weights
            self._spec = ProbeSpec(
                config=config, device=self.device.torch_device(),
                dtype=dtypes[self.precision] if adapters else torch.float32,
                autocast=None if self.precision == "fp32" else dtypes[self.precision],
                sequence_len=recipe.sequence_len, train_weights=not adapters,
                trust_remote_code=recipe.trust_remote_code)
        return self._spec

    def describe(self) -> str:
        """`NVIDIA A10G (compute capability 8.6), head_dim 128, 32 heads (8 key/value), bf16`."""
        config = self.spec().config
        heads = getattr(config, "num_attention_heads", None)
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else "?")
        return f"{self.device.describe()}, head_dim {head_dim}, {heads} heads ({kv} key/value), {self.precision}"

    def flex_attention(self) -> float:
        from finetune.model.probes import probe_flex_attention

        return probe_flex_attention(self.spec())

    def compiled_layer(self, attn: str) -> float:
        from finetune.model.probes import probe_compiled_layer

        return probe_compiled_layer(self.spec(), attn)


def agree(error: str | None) -> str | None:
    """What every process of the run concludes from its own probe's `error` (None: it passed): None where all
    passed, else the first failure, `on process R: ...` when it was another process's. The processes of one run
    take the same path; every process calls this the same number of times (also where nothing was probed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return error
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    for rank, found in enumerate(errors):
        if found is not None:
            return found if rank == dist.get_rank() else f"on process {rank} of this run: {found}"
    return None


def _probe(run, what: str, probes) -> dict:
    """Run one probe: {"ok", "seconds", "error", "unavailable"}; every process agrees on `ok`."""
    from finetune.model.probes import ProbeUnavailable

    started = time.perf_counter()
    outcome = {"ok": True, "seconds": None, "error": None, "unavailable": False}
    try:
        run()
    except ProbeUnavailable as exc:
        outcome.update(ok=False, unavailable=True, error=f"the probe could not be built: {exc}")
    except Exception as exc:  # noqa: BLE001 a kernel may fail with anything: Triton, inductor, CUDA, dtype errors
        outcome.update(ok=False, error=error_text(exc))
    outcome["seconds"] = round(time.perf_counter() - started, 3)
    error = agree(outcome["error"])
    if error is not None and outcome["ok"]:  # passed here, failed on another process: this one follows it
        outcome.update(ok=False, error=error)
    if outcome["ok"]:
        log.info(f"probe: {what} ran on {probes.describe()} in {outcome['seconds']:.1f} s")
    return outcome


def _refuse(key: str, value: str, alternative: str, what: str, outcome: dict, probes) -> FastPathError:
    return FastPathError(
        f"`{key}: {value}` is set in the recipe, but {what} failed its probe on this GPU before training "
        f"({probes.describe()}): {outcome['error']}. Set `{key}: {alternative}` (or `{key}: auto`, which falls "
        f"back by itself where a probe fails) and run again; nothing was written. See {DOCS}."
    )


def prove_fast_paths(recipe, chosen: Choice, probes) -> Choice:
    """Probe each fast path `chosen` uses; the Choice the run trains with (or FastPathError for a failed path
    the recipe asked for). Attention first, then one compiled layer with the attention that passed."""
    attn, attn_reason, compile_layers, compile_reason = (chosen.attn_implementation, chosen.attn_reason,
                                                         chosen.compile, chosen.compile_reason)
    record = {}
    if attn == "flex_attention":
        outcome = record["flex_attention"] = _probe(
            probes.flex_attention, "flex_attention forward and backward (document mask)", probes)
        if not outcome["ok"]:
            if recipe.attn_implementation != "flex_attention":  # auto
                attn, attn_reason = "sdpa", (f"auto chose flex_attention ({attn_reason}), but it failed its probe "
                                             f"on this device ({outcome['seconds']:.1f} s): {outcome['error']}; "
                                             "sdpa instead")
            elif outcome["unavailable"]:  # set in the recipe, and the stand-in could not be built: go ahead, say so
                attn_reason = f"{attn_reason}; not probed: {outcome['error']}"
            else:
                raise _refuse("attn_implementation", "flex_attention", "sdpa", "flex_attention", outcome, probes)
    else:
        agree(None)  # every process gathers the same number of times
    if compile_layers:
        outcome = record["compile"] = _probe(
            lambda: probes.compiled_layer(attn),
            f"one compiled decoder layer forward and backward (attention {attn}; compile time included)", probes)
        if not outcome["ok"]:
            if recipe.compile is not True:  # auto
                compile_layers, compile_reason = False, (f"{compile_reason}, but a compiled decoder layer failed "
                                                         f"its probe on this device ({outcome['seconds']:.1f} s): "
                                                         f"{outcome['error']}; eager instead")
            elif outcome["unavailable"]:
                compile_reason = f"{compile_reason}; not probed: {outcome['error']}"
            else:
                raise _refuse("compile", "true", "false", "a compiled decoder layer", outcome, probes)
    else:
        agree(None)
    return Choice(attn, attn_reason, compile_layers, compile_reason, record)


def say(message: str, probe: dict | None) -> None:
    """The run's attention or compile line: a warning pointing at the docs when its probe failed, else info."""
    if probe is not None and not probe["ok"]:
        log.warning(f"{message}. See {DOCS}.")
    else:
        log.info(message)


# --- a kernel failure while training ------------------------------------------------------------------------


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _places(exc: BaseException) -> str:
    """Every file a traceback of `exc` (and its causes) passed through, the exception types' modules and their
    messages, lower-cased: what failed_fast_path matches against."""
    import traceback

    parts = []
    for link in _chain(exc):
        parts += [frame.filename for frame in traceback.extract_tb(link.__traceback__)]
        parts += [type(link).__module__, str(link)]
    return "\n".join(parts).lower()


def failed_fast_path(exc: BaseException, settings) -> tuple[str, str, str] | None:
    """(what failed, the recipe key it is, the setting that avoids it) when `exc` came from a fast path the run
    uses; None for anything else (a CUDA out-of-memory is not a kernel failure: it has its own remedies)."""
    import torch

    if isinstance(exc, (FinetuneError, torch.OutOfMemoryError)):
        return None
    places = _places(exc)
    if settings.attn_implementation == "flex_attention" and "flex_attention" in places:
        return "flex_attention", "attn_implementation: flex_attention", "attn_implementation: sdpa"
    if settings.attn_implementation == "flash_attention_2" and "flash_attn" in places:
        return "flash-attn", "attn_implementation: flash_attention_2", "attn_implementation: sdpa"
    if settings.compile and any(part in places for part in ("torch/_dynamo", "torch/_inductor", "triton")):
        return "a compiled decoder layer", "compile: true", "compile: false"
    return None


@contextmanager
def kernel_failures(settings, layout, step):
    """Turn a fast path's kernel failure inside the block into one FastPathError naming the key to set and the
    newest complete checkpoint; `step()` is the number of the step in progress. Anything else passes through
    unchanged."""
    from finetune.train.checkpoints import last_good_message

    try:
        yield
    except Exception as exc:
        failed = failed_fast_path(exc, settings)
        if failed is None:
            raise
        what, current, alternative = failed
        raise FastPathError(
            f"training stopped in step {step()}: {what} failed on {settings.device} ({error_text(exc)}). It is the "
            f"fast path `{current}`; set `{alternative}` in the recipe (or `finetune train recipe.yml --set "
            f"{alternative.replace(': ', '=')}`) and run again (a checkpoint does not depend on this "
            f"setting, so the run resumes). {last_good_message(layout)} See {DOCS}."
        ) from exc
