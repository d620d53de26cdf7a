"""Shared by the agents tests: tools and TRL's counter environment as files, tokenizers in two tool-call families,
and a scripted policy (fixed turns instead of sampling) that drives our episode loop and TRL 1.16's alike."""

from __future__ import annotations

import json
import pathlib
import shutil

from tiny import build_tokenizer

# Tools and environments as a user writes them for TRL: type hints and a docstring with Args:.
TOOLS_PY = '''
import os
import sys
import time


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError("no luck")


def echo(text: str, times: int) -> str:
    """Repeat a text.

    Args:
        text: What to repeat.
        times: How many times.
    """
    return text * times


def hang(x: int) -> str:
    """Never returns.

    Args:
        x: Anything.
    """
    time.sleep(600)


def huge(x: int) -> str:
    """A megabyte of text.

    Args:
        x: Anything.
    """
    return "a" * (1 << 20)


def leave(x: int) -> str:
    """Calls sys.exit.

    Args:
        x: Anything.
    """
    sys.exit(3)


def vanish(x: int) -> str:
    """Ends its process.

    Args:
        x: Anything.
    """
    os._exit(3)


class IncrementEnv:
    """TRL 1.16's documented environment_factory example, unchanged."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = kwargs.get("target", 3)
        return f" Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter
'''

LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]


def trl_template(name: str) -> str:
    import trl

    return (pathlib.Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def family_tokenizer(family: str):
    """The tiny tokenizer with a real tool-calling template (TRL's copies of Qwen2.5's and Llama 3.2's), its EOS the
    template's end of turn, as those models ship it."""
    tokenizer = build_tokenizer()
    if family == "hermes":
        tokenizer.chat_template = trl_template("qwen2_5")
        tokenizer.eos_token = "<|im_end|>"
    else:
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_TOKENS})
        tokenizer.chat_template = trl_template("llama3_2")
        tokenizer.eos_token = "<|eot_id|>"
    return tokenizer


def call_text(family: str, name: str, arguments: str) -> str:
    if family == "hermes":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
    return f'{{"name": "{name}", "parameters": {arguments}}}'


class ScriptedPolicy:
    """Each rollout's turns, fixed: `turns[n]` its texts in order (the end token added). Serves our `generate` and
    TRL's `_generate_single_turn` the same way: a turn after the first is found from the context it continues."""

    def __init__(self, tokenizer, prompt_ids: list[list[int]], turns: list[list[str]]):
        self.eos = tokenizer.eos_token_id
        self.ids = [[tokenizer(t, add_special_tokens=False)["input_ids"] + [self.eos] for t in texts] for texts in turns]
        self.prompts = [list(p) for p in prompt_ids]
        self.served = [1] * len(turns)  # the first turn is served by first_turns()

    def first_turns(self) -> list[list[int]]:
        return [list(t[0]) for t in self.ids]

    def _rollout(self, context: list[int]) -> int:
        found = [n for n, (p, t) in enumerate(zip(self.prompts, self.ids)) if context[:len(p) + len(t[0])] == p + t[0]]
        assert len(found) == 1, f"the script cannot tell which rollout continues this context ({found})"
        return found[0]

    def next_turns(self, contexts: list[list[int]]) -> list[list[int]]:
        out = []
        for context in contexts:
            n = self._rollout(list(context))
            out.append(list(self.ids[n][self.served[n]]))
            self.served[n] += 1
        return out

    def generate(self, prompts, num_generations, max_new_tokens, turn):
        """Our episode loop's generate: the first turns by rollout, then by context."""
        if turn == 0:
            return self.first_turns()
        return [ids[:max_new_tokens] for ids in self.next_turns(prompts)]


def long_context_copy(model_dir, folder) -> pathlib.Path:
    """The tiny model with room for a prompt that carries tools' schemas (~1,500 tokens of the tiny BPE, whose
    vocabulary has few JSON pieces): its config's max_position_embeddings raised (rotary positions need no weights)."""
    folder = pathlib.Path(folder)
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return folder
