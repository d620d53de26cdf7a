"""The recipe's `eval:` section: what `finetune eval` checks, and what runs when training ends."""

from __future__ import annotations

from pydantic import Field

from finetune.recipe.tags import Strict, affects


class EvalSpec(Strict):
    """`eval:`: the checks `finetune eval` runs, and that run when training ends when the recipe has this section
    (docs/evaluation.md). The command's options override these values for one evaluation."""

    heldout_loss: bool = Field(
        True,
        description=("Held-out loss and perplexity, base and tuned, on supervised tokens only, tokenized and masked "
                     "exactly as training does; preference runs: reward accuracy and margin on held-out pairs."),
        json_schema_extra=affects(),
    )
    data: str | None = Field(
        None,
        description=("A records file to evaluate on, of the run's record shape (relative to the recipe). Default: "
                     "the recipe's eval split (`val_set_size`)."),
        json_schema_extra=affects(),
    )
    generations: int = Field(
        4, ge=0,
        description=("Held-out prompts answered greedily by base and tuned, in the format the run trained with; "
                     "each answer is checked: did it end, is it empty, does it loop. 0: none."),
        json_schema_extra=affects(),
    )
    max_new_tokens: int = Field(
        64, gt=0, description="Longest generated answer, in tokens: an answer still going at this length never ended.",
        json_schema_extra=affects(),
    )
    tasks: list[str] = Field(
        [],
        description=("lm-evaluation-harness tasks to run on base and tuned (needs the `eval` extra: "
                     "`pip install finetune[eval]`), e.g. [tiny_facts], the example task finetune ships. "
                     "Empty: no benchmarks."),
        json_schema_extra=affects(),
    )
    tasks_dir: str | None = Field(
        None,
        description=("A folder of local lm-eval tasks (task YAML files and their local data files). With `tasks` "
                     "empty, every task in it runs."),
        json_schema_extra=affects(),
    )
    task_limit: int | None = Field(
        None, gt=0, description="Examples per lm-eval task (default: all): a quick look, not a score to quote.",
        json_schema_extra=affects(),
    )
    apply_chat_template: bool = Field(
        False,
        description=("lm-eval: wrap each task's prompts in the tokenizer's chat template (the report says which). "
                     "Off: plain text, as most published scores are."),
        json_schema_extra=affects(),
    )
    gguf: str | None = Field(
        None,
        description=("A GGUF file to evaluate beside the merged model (export drift as a number). Default: the "
                     "GGUF `finetune export` wrote into the output folder, if any."),
        json_schema_extra=affects(),
    )


class EvalKeys(Strict):
    """After training."""

    eval: EvalSpec | None = Field(
        None,
        description=(
            "Evaluate when training ends (held-out loss, generation checks, lm-eval tasks; docs/evaluation.md), "
            "results in run.json and output_dir/eval/. Absent: nothing runs. `eval: {}` runs the default checks."
        ),
        json_schema_extra=affects(),
    )
