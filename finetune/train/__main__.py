"""`python -m finetune.train recipe.yml` and `accelerate launch -m finetune.train recipe.yml`:
the same as `finetune train recipe.yml`."""

import sys

from finetune.cli import run_verb

if __name__ == "__main__":
    sys.exit(run_verb("finetune.commands.train", "python -m finetune.train", sys.argv[1:]))
