"""The multi-turn row of benchmarks/bench_grpo_vs_trl.py (`--agents`): what differs from the single-turn bench.

- the model: SmolLM2-135M-Instruct with an SFT adapter that taught it the calculator's call format (a finetune LoRA
  run folder, made by benchmarks/bench_agents_learning.py: seed 0's `sft`), merged into the weights once and saved
  in fp32 with the `chatml_tools` template as the tokenizer's own, so that both sides start from the same weights
  and render the same template; each side then trains a fresh LoRA r 16 on it, as in the single-turn bench;
- the environment: a calculator class with TRL's environment_factory contract (reset(**row), a typed and documented
  `calculate(expression: str) -> str`), the same file on both sides: finetune gets `environment: FILE.py:Calculator`,
  TRL `environment_factory=Calculator` imported from that file;
- the questions: two-digit + - * arithmetic, as the SFT transcripts were; the reward: 1 when the episode's last
  assistant turn ends on the right number (the same function on both sides, TRL's contract: `completions` as each
  episode's messages);
- TRL reads the calls with its Qwen3 response template (`<tool_call>` JSON, the Hermes format `chatml_tools` writes;
  TRL only sets one itself for templates it knows), finetune with its Hermes parser;
- 96 completion tokens an episode (the notebook's), at most 2 tool-calling rounds (`max_tool_calling_iterations`,
  TRL's name on both sides).

What is measured: the "generation" phase is the whole episodes (every turn and the tool calls between them:
finetune's generation_s, TRL's `_generate`); the tokens are the model's (tool results left out; TRL's
completions/mean_length, which takes its tool mask); each side's tool calls per episode (`tools/call_frequency`,
both sides' name) are printed, so a reader sees that both really called the tool.

    python benchmarks/bench_grpo_vs_trl.py --agents [--sft DIR] [--max-tool-calling-iterations 2] [--steps N]
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CALCULATOR_PY = '''
import re


class Calculator:
    def reset(self, **kwargs):  # called with the record's columns before each episode
        self.calls = 0

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Numbers joined by + - * and parentheses, e.g. "37 * 48".
        """
        self.calls += 1
        if not re.fullmatch(r"[0-9+*() -]+", expression):
            raise ValueError("only numbers, + - * and parentheses")
        return str(eval(expression))
'''

REWARDS_PY = '''
import re


def correct_answer(completions, answer, **kwargs):
    """1 when the episode's last assistant turn ends on the right number."""
    out = []
    for episode, expected in zip(completions, answer):
        last = episode[-1]["content"] if episode[-1]["role"] == "assistant" else ""
        numbers = re.findall(r"-?[0-9]+", last or "")
        out.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return out
'''


def write_files(folder: Path) -> tuple[Path, Path]:
    """(rewards.py, calculator.py) in the folder."""
    (folder / "rewards.py").write_text(REWARDS_PY)
    (folder / "calculator.py").write_text(CALCULATOR_PY)
    return folder / "rewards.py", folder / "calculator.py"


def make_questions(path: Path, n: int, seed: int = 20261128) -> list[dict]:
    rng = random.Random(seed)
    records = []
    with path.open("w") as fh:
        for _ in range(n):
            a, b, op = rng.randint(12, 99), rng.randint(12, 99), rng.choice("+-*")
            records.append({"prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                            "answer": str(eval(f"{a} {op} {b}"))})
            fh.write(json.dumps(records[-1]) + "\n")
    return records


def merged_model(sft: Path, folder: Path) -> str:
    """The SFT adapter merged into its base, fp32, the chatml_tools template the tokenizer's own."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.contract import CHATML_TOOLS_TEMPLATE

    if not (sft / "adapter_config.json").is_file():
        raise SystemExit(f"--sft {sft}: not a LoRA run folder; make one with python benchmarks/bench_agents_learning.py "
                         "--seeds 0 --workdir /tmp/agents_bench (its seed0/sft)")
    base_path = json.loads((sft / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    PeftModel.from_pretrained(base, str(sft)).merge_and_unload().save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(sft)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.save_pretrained(folder)
    return str(folder)


def finetune_keys(args) -> dict:
    """What a finetune recipe adds for the multi-turn row."""
    return {"environment": f"{args.environment}:Calculator", "chat_template": "chatml_tools",
            "max_tool_calling_iterations": args.max_tool_calling_iterations, "tool_timeout_s": 10}


def trl_environment(args, tokenizer) -> dict:
    """GRPOTrainer's keyword for the environment (the same class, imported from the same file), the tokenizer given
    the response template that reads `<tool_call>` JSON."""
    import importlib.util

    from trl.chat_template_utils import qwen3_template

    tokenizer.response_template = qwen3_template
    spec = importlib.util.spec_from_file_location("bench_calculator", args.environment)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"environment_factory": module.Calculator}
