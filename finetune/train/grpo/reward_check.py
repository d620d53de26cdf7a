"""Each reward function run on a few records before a run: `finetune validate` and `finetune preprocess` print the
result and exit 2 on a problem, so a broken reward shows before a model loads, not steps into a run.

    results = sample_check(recipe.rewards, records, "a sample completion.", base_dir=Path.cwd(), encode=...)
    print("\n".join(line for r in results for line in r.lines()))

A function runs exactly as training runs it (finetune/train/grpo/rewards.py): in a worker process, with its own
`timeout_s`, called with TRL's keyword arguments and the records' columns. Its signature is checked against those
columns first, the message naming the function's file and line. A problem is whatever training would count as a
failure (it raises, exits, hangs past its timeout, ends its worker, returns None, a string, the wrong number of
values, a non-number), and a call that prints more than a run's log keeps of one call (OUTPUT_CAP bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import RewardError
from finetune.train.grpo.reward_worker import OUTPUT_CAP
from finetune.train.grpo.rewards import RewardRunner, as_spec, unique_names

SAMPLE_RECORDS = 3  # each function runs on this many records
SHOWN_OUTPUT = 300  # characters of what a call printed, shown under its line
# a record column that holds the reference answer: its text is the sample completion the rewards are tried on
ANSWER_COLUMNS = ("answer", "solution", "output", "target", "completion", "ground_truth")


@dataclass
class SampleResult:
    """One function on a few records: ok, its values (None where NaN), or the problem; what the call printed."""

    name: str
    function: str
    ok: bool
    values: list[float | None]
    error: str | None = None
    printed: tuple[str, int] | None = None  # (the first OUTPUT_CAP bytes, how many bytes) when it printed
    note: str | None = None  # a reward model: what it reads (it is not run here)

    def line(self) -> str:
        if self.note and self.ok:
            return f"reward {self.name}: {self.note}"
        if not self.ok:
            return f"reward {self.name}: FAILED: {self.error}"
        shown = ", ".join("None" if v is None else f"{v:g}" for v in self.values)
        note = " (None for every record: it applies to none of them)" if all(v is None for v in self.values) else ""
        return f"reward {self.name}: ok [{shown}]{note}"

    def lines(self) -> list[str]:
        """line(), then what the call printed (its start)."""
        if not self.printed:
            return [self.line()]
        text, size = self.printed
        start = text[:SHOWN_OUTPUT].rstrip()
        more = f" (the first {SHOWN_OUTPUT} characters)" if len(text) > SHOWN_OUTPUT or size > len(text) else ""
        return [self.line(), f"  it printed {size:,} bytes{more}:", *("    " + part for part in start.splitlines())]


def signature_problems(specs, columns: list[str], base_dir) -> dict[str, str]:
    """name -> the problem, for each function that cannot be loaded or cannot take the call with these columns
    (the records' columns other than `prompt`)."""
    from finetune.reward_functions import check_reward, load_reward

    specs = [as_spec(s) for s in specs]
    broken = {}
    for name, spec in zip(unique_names(specs), specs):
        if spec.function is None:  # a reward model: checked at load (finetune/reward_models.py)
            continue
        try:
            check_reward(load_reward(spec.function, base_dir), spec.function, list(columns))
        except RewardError as err:
            broken[name] = str(err)
    return broken


def check_signatures(recipe, record: dict) -> None:
    """Before a run's model loads: RewardError naming every function whose signature cannot take the call with the
    columns of the records (`record`: the first training prompt's), each located in its own file."""
    broken = signature_problems(recipe.rewards, [k for k in record if k != "prompt"], Path.cwd())
    if broken:
        raise RewardError("; ".join(broken.values()) + ". `finetune validate` runs each reward on a few records")


def sample_check(specs, records: list[dict], sample_completion, base_dir=None, encode=None,
                 n_records: int = SAMPLE_RECORDS) -> list[SampleResult]:
    """Run each reward function on the first `n_records` prompt records ({"prompt": ..., columns}) with a sample
    completion (a string, or a function of the record returning one; sent as [{"role": "assistant", ...}] for chat
    prompts). `encode(text) -> ids` gives completion_ids ([] without it). Specs are loaded and their signatures
    checked against the records' columns here first, so one broken function does not hide the others."""
    records = list(records)[:n_records]
    columns = {k: [r.get(k) for r in records] for k in (records[0] if records else {}) if k != "prompt"}
    texts = [sample_completion(r) if callable(sample_completion) else str(sample_completion) for r in records]
    completions = [[{"role": "assistant", "content": t}] if isinstance(r.get("prompt"), list) else t
                   for r, t in zip(records, texts)]
    ids = [list(encode(t)) if encode is not None else [] for t in texts]
    prompts = [r.get("prompt") for r in records]
    specs = [as_spec(s) for s in specs]
    names = unique_names(specs)
    problems = signature_problems(specs, list(columns), base_dir)
    broken = {n: SampleResult(n, s.function, False, [], problems[n]) for n, s in zip(names, specs) if n in problems}
    broken.update({n: _model_result(n, s, prompts) for n, s in zip(names, specs) if s.model})
    good = [s for n, s in zip(names, specs) if n not in broken]
    ran = {}
    if good:
        with RewardRunner(good, base_dir, workers=min(len(good), 2), counted_in=None) as runner:
            batch = runner.score(prompts, completions, ids, columns)
            ran = {spec.function: _result(name, spec, batch, i) for i, (name, spec) in
                   enumerate(zip(runner.names, runner.specs))}
    return [broken.get(n) or _renamed(ran[s.function], n) for n, s in zip(names, specs)]


def _model_result(name: str, spec, prompts: list) -> SampleResult:
    """A reward model is not run here (validate loads no model): its folder was checked when the recipe loaded; what
    it trained on must match the prompts."""
    from finetune.model.scorer import read_scoring

    scoring = read_scoring(spec.model)
    if scoring.conversational is False and any(isinstance(p, list) for p in prompts):
        return SampleResult(name, spec.model, False, [], "trained on plain-text pairs, but the prompts are "
                            "conversations: train it on conversational pairs, or give the run text prompts")
    return SampleResult(name, spec.model, True, [], None, None,
                        f"a reward model ({spec.model}), scored in the training process: {scoring.describe()}")


def _renamed(result: SampleResult, name: str) -> SampleResult:
    result.name = name  # the name among all the recipe's functions (a runner of fewer may shorten it)
    return result


def _result(name: str, spec, batch, index: int) -> SampleResult:
    printed = batch.printed.get(name)
    if name in batch.failures:
        kind, message = batch.failures[name]
        return SampleResult(name, spec.function, False, [], f"{kind}: {message}", printed)
    values = [None if math.isnan(v) else v for v in batch.values[index]]
    if printed and printed[1] > OUTPUT_CAP:
        return SampleResult(name, spec.function, False, values, (
            f"printed {printed[1]:,} bytes in one call; a run logs the first {OUTPUT_CAP:,} of each call and counts the "
            "rest in run.json: print less (or only when something is wrong)"), printed)
    return SampleResult(name, spec.function, True, values, None, printed)


def report_rewards(recipe, records: list[dict], encode, say=print) -> int:
    """Run every reward function on a few records with a sample completion (the records' answer column when they
    have one) and say what each gave; 2 when one has a problem, else 0."""
    answer = next((c for c in ANSWER_COLUMNS if records and c in records[0]), None)
    sample = (lambda r: str(r[answer])) if answer else "a sample completion."
    say(f"rewards on {min(SAMPLE_RECORDS, len(records))} records, each in a worker with its timeout_s, completion = "
        f"{'the record column `' + answer + '`' if answer else repr(sample)}:")
    results = sample_check(recipe.rewards, records, sample, base_dir=Path.cwd(), encode=encode)
    for result in results:
        for line in result.lines():
            say(f"  {line}")
    return 0 if all(r.ok for r in results) else 2


def validate_rewards(recipe, say=print) -> int:
    """`finetune validate` on a GRPO recipe: the first few prompt records of its datasets, an encoder for the
    completion ids, and report_rewards."""
    from finetune.data.grpo.prompts import first_records

    records = first_records(recipe, SAMPLE_RECORDS)
    return report_rewards(recipe, records, completion_encoder(recipe), say)


def completion_encoder(recipe):
    """text -> the ids the run's tokenizer gives it: the model's tokenizer.json read by `tokenizers` alone when there
    is one (validate then imports neither transformers nor torch, seconds saved; the recipe's added `tokens` are
    left out, which a sample completion does not need), else the recipe's tokenizer."""
    from finetune.model.loader import tokenizer_source

    path = Path(tokenizer_source(recipe)) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        return lambda text: fast.encode(text, add_special_tokens=False).ids
    from finetune.model.loader import load_tokenizer

    tokenizer = load_tokenizer(recipe)
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
