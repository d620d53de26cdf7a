"""The recipe's output keys: where a run writes, how often it logs, checkpoints and resumes, what stops it
(the non-finite guard), and the trackers."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import AliasChoices, Field, field_validator

from finetune.recipe.tags import Strict, affects


class OutputKeys(Strict):
    """What a run writes, and when."""

    output_dir: str = Field(
        "outputs", description="Where the adapter/model, checkpoints and run.json go.", json_schema_extra=affects(),
    )

    logging_steps: int = Field(
        10, gt=0, description="Log the training loss every N optimizer steps.", json_schema_extra=affects(),
    )

    eval_steps: int | None = Field(
        None, gt=0, description="Evaluate every N steps (with a val split). Default: at the end of each epoch.",
        json_schema_extra=affects(),
    )

    # Checkpoints: temporary (rotated) and exports (kept); see docs/checkpoints.md. The axolotl/HF names
    # save_steps / save_total_limit are accepted as aliases.
    checkpoint_interval: int | None = Field(
        None, gt=0, validation_alias=AliasChoices("checkpoint_interval", "save_steps"),
        description=(
            "Write a temporary, resumable checkpoint to output_dir/checkpoints every N optimizer steps "
            "(alias: save_steps). Default: at the end of each epoch."
        ),
        json_schema_extra=affects(),
    )

    max_checkpoints: int = Field(
        2, gt=0, validation_alias=AliasChoices("max_checkpoints", "save_total_limit"),
        description="Keep the newest N temporary checkpoints; older ones are deleted (alias: save_total_limit).",
        json_schema_extra=affects(),
    )

    export_interval: int | None = Field(
        None, gt=0,
        description=(
            "Write a permanent export (a complete, resumable, loadable checkpoint) to output_dir/exports every N "
            "optimizer steps. Exports are never deleted automatically. Default: none."
        ),
        json_schema_extra=affects(),
    )

    resume: Union[bool, str] = Field(
        "auto",
        description=(
            "`auto`: continue from the newest complete checkpoint or export in output_dir, if any (refused if it "
            "was written for other data or settings). A path: resume from that checkpoint. `false`: start fresh."
        ),
        json_schema_extra=affects(),
    )

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_true_is_auto(cls, value):
        return "auto" if value is True else value

    # affects nothing a checkpoint holds: resuming with `skip` after a NaN stopped the run is the intended fix
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop",
        description=(
            "A NaN/inf loss or gradient norm: `stop` the run with an error (the last good checkpoint is kept), "
            "or `skip` the optimizer update for that step."
        ),
        json_schema_extra=affects(),
    )

    max_skipped_steps: int = Field(
        10, gt=0, description="With `on_nonfinite: skip`: stop after this many non-finite steps in a row.",
        json_schema_extra=affects(),
    )

    loss_spike_factor: float | None = Field(
        3.0, gt=1.0,
        description="Warn when a logged loss exceeds this multiple of the median of recent logged losses (null: off).",
        json_schema_extra=affects(),
    )

    save_on_interrupt: bool = Field(
        True, description="Ctrl-C finishes the current step, saves a checkpoint, then exits (exit code 130).",
        json_schema_extra=affects(),
    )

    report_to: list[Literal["tensorboard", "wandb", "none"]] = Field(
        ["tensorboard"],
        description="Loggers. TensorBoard runs offline; wandb takes its key only from WANDB_API_KEY or ~/.netrc.",
        json_schema_extra=affects(),
    )

    wandb_project: str | None = Field(None, description="wandb project name.", json_schema_extra=affects())

    overwrite_output_dir: bool = Field(
        False,
        description=(
            "Write into an output_dir that holds files finetune did not write (your notes, another tool's model). "
            "Off: such a folder is refused before anything is written. A folder of an earlier finetune run needs "
            "no switch: it follows `resume`."
        ),
        json_schema_extra=affects(),
    )
