"""The recipe schema: every setting, its default and its meaning, in one place.

Each field's description is the documentation: `finetune schema --markdown` renders docs/recipe.md from it,
one section per group. Key names follow axolotl's wherever the concept is the same, so an axolotl recipe
ports with few edits. The YAML keys are flat; the groups exist for the reader: each is a module of its own,
composed here into one flat `Recipe`. Loading, error reporting and overrides live in finetune/recipe/load.py.
"""

from __future__ import annotations

from finetune.recipe.adapter import AdapterKeys
from finetune.recipe.data import DataKeys
from finetune.recipe.distributed import DistributedKeys
from finetune.recipe.evaluation import EvalKeys
from finetune.recipe.grpo import GRPOKeys
from finetune.recipe.methods import MethodKeys
from finetune.recipe.model import ModelKeys
from finetune.recipe.moe import MoeKeys
from finetune.recipe.output import OutputKeys
from finetune.recipe.training import TrainingKeys
from finetune.recipe.vision import VisionKeys

# (title, group) in the order a recipe is read and docs/recipe.md lists them
GROUPS = (
    ("Model", ModelKeys),
    ("Vision-language models", VisionKeys),
    ("Adapter: LoRA and QLoRA", AdapterKeys),
    ("Mixture-of-experts", MoeKeys),
    ("Method", MethodKeys),
    ("GRPO: online RL with rewards a program checks", GRPOKeys),
    ("Data", DataKeys),
    ("Training", TrainingKeys),
    ("Scale-out: FSDP2", DistributedKeys),
    ("Output, checkpoints and tracking", OutputKeys),
    ("After training", EvalKeys),
)


# pydantic collects the fields of a model's bases from the last base to the first: the groups are listed in
# reverse so that the schema (and `finetune validate`'s printout) reads in GROUPS order. The bases only hold
# fields and their validators: there is no behaviour to inherit.
class Recipe(EvalKeys, OutputKeys, DistributedKeys, TrainingKeys, DataKeys, GRPOKeys, MethodKeys, MoeKeys,
             AdapterKeys, VisionKeys, ModelKeys):
    """A fine-tuning run, start to finish."""
