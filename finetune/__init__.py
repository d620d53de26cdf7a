"""finetune: fine-tune causal language models from one YAML recipe.

Nothing heavy is imported here: `finetune --help` and `finetune validate` stay instant.
"""

__version__ = "0.1.0"
