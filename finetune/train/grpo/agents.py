"""What a GRPO run with `environment` / `tools` holds, and one step's episodes (docs/grpo.md, "Agents").

    agents = Agents.start(recipe, tokenizer, base_dir)       # schemas from a worker, the template checked, workers up
    batch, env_reward = agents.run_step(model, records, seed, settings)
    agents.close()

Before the run: the tools' JSON schemas come from a spawned process (the training process never imports the user's
code), the chat template is checked to render tool calls, tool results and the tools, prefix-preserving
(finetune/data/tool_chat.py), and its tool calls must be readable (tool_calls.py). Each step: every rollout's
environment is reset with its record (one instance per rollout, in the workers), its observation appended to the
prompt's last message (TRL 1.16), the prompt rendered with the tools offered, and the episodes run
(episodes.py); an environment with get_reward() then scores each rollout, an extra reward of weight 1 named after
its class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from finetune.log import get_logger

log = get_logger(__name__)

# An upper bound of characters per token for the worker's first cut of a result: no tokenizer's tokens average more,
# and the worker never sends a megabyte down the pipe to learn that it is too long.
CHARS_PER_TOKEN = 32


@dataclass
class Agents:
    runner: object  # tools.ToolRunner
    schemas: list[dict]
    environment: str | None  # the class name: the name of its reward
    environment_reward: bool
    parser: object
    tokenizer: object
    max_iterations: int | None
    max_response_tokens: int

    @classmethod
    def start(cls, recipe, tokenizer, base_dir) -> Agents:
        from finetune.recipe.methods import method_setting
        from finetune.train.grpo.agent_check import check_tokenizer, described
        from finetune.train.grpo.tools import ToolRunner

        info = described(recipe, base_dir)
        parser = check_tokenizer(tokenizer, info)
        runner = ToolRunner(recipe.environment, recipe.tools, base_dir, method_setting(recipe, "tool_timeout_s"))
        log.info(f"agents: {len(info['schemas'])} tools ({', '.join(info['tools'])})"
                 + (f", environment {info['environment']}" + (" (its get_reward() an extra reward)"
                                                              if info["environment_reward"] else "")
                    if info["environment"] else "") + f"; {len(runner.worker_pids())} tool workers")
        return cls(runner, info["schemas"], info["environment"], info["environment_reward"], parser, tokenizer,
                   method_setting(recipe, "max_tool_calling_iterations"),
                   method_setting(recipe, "max_tool_response_tokens"))

    def check_room(self, records: list[dict], room: int) -> None:
        """Warn when prompts rendered with the tools' schemas outgrow what sequence_len - max_completion_length left
        them (the data stage measured them without the tools)."""
        from finetune.data.tool_chat import prompt_ids

        longest = max(len(prompt_ids(self.tokenizer, r["prompt"], self.schemas)) for r in records)
        if longest > room:
            log.warning(f"agents: prompts with the tools' schemas take up to {longest} tokens (the first "
                        f"{len(records)} measured), over the {room} that sequence_len - max_completion_length leaves "
                        "them; their rows are scored alone and take more memory: raise sequence_len")

    @property
    def external_rewards(self) -> tuple[str, ...]:
        return (self.environment,) if self.environment_reward else ()

    def close(self) -> None:
        self.runner.close()

    def prompts(self, records: list[dict]) -> list[list[int]]:
        """Each rollout's prompt ids: its environment reset with the record (the observation appended to the last
        message, as TRL 1.16 does), rendered with the tools offered."""
        from finetune.data.tool_chat import prompt_ids

        outcomes = self.runner.reset(list(enumerate(records))) if self.environment else [None] * len(records)
        out = []
        for record, outcome in zip(records, outcomes):
            messages = [dict(m) for m in record["prompt"]]
            if outcome is not None and not outcome.ok:
                log.warning(f"environment {self.environment}: reset() failed ({outcome.kind}): {outcome.value}; the "
                            "rollout starts from the record's prompt alone")
            elif outcome is not None and outcome.value:
                messages[-1]["content"] = messages[-1]["content"] + outcome.value
            out.append(prompt_ids(self.tokenizer, messages, self.schemas))
        return out

    def run_step(self, model, records: list[dict], seed: int, settings, max_model_len: int):
        """(EpisodeBatch, {environment: its reward outcome} or {}) for a step's rollouts (records: one per rollout,
        prompt-major)."""
        from finetune.data.tool_chat import tool_suffix_ids
        from finetune.train.grpo.episodes import EpisodeSettings, run_episodes

        sampler = turn_sampler(model, seed, settings)
        cap = self.max_response_tokens * CHARS_PER_TOKEN
        batch = run_episodes(
            self.prompts(records), settings.group, sampler, self.parser,
            lambda calls: self.runner.call(calls, cap),
            lambda messages: tool_suffix_ids(self.tokenizer, messages, settings.eos_ids),
            lambda text: len(self.tokenizer(text, add_special_tokens=False)["input_ids"]), self.schemas,
            EpisodeSettings(settings.max_completion_length, self.max_iterations, self.max_response_tokens,
                            max_model_len, tuple(settings.eos_ids)))
        return batch, self._environment_rewards(len(records))

    def _environment_rewards(self, n: int) -> dict:
        if not self.environment_reward:
            return {}
        outcomes = self.runner.rewards(list(range(n)))
        values = [o.value if o.ok else math.nan for o in outcomes]
        failed = [o for o in outcomes if not o.ok]
        if len(failed) == n:
            return {self.environment: ("failed", failed[0].kind, f"get_reward(): {failed[0].value}")}
        return {self.environment: ("ok", values)}

    def summary(self) -> dict:
        """For run.json: the tools offered, and the workers' failures by kind with the first message of each."""
        return {"tools": [s["function"]["name"] for s in self.schemas], "environment": self.environment,
                "failures": dict(self.runner.failures), "first_messages": dict(self.runner.first_messages),
                "workers_replaced": self.runner.replaced, "environments_replayed": dict(self.runner.replayed)}


def turn_sampler(model, seed: int, settings):
    """The step's sampler of turns (turns.py): each rollout continued from its KV cache across turns."""
    from finetune.train.grpo.turns import CachedTurns

    return CachedTurns(model, seed, eos_ids=list(settings.eos_ids), pad_id=settings.pad_id,
                       temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
