"""GRPO with tools and an environment end to end on the tiny model: TRL's counter environment (IncrementEnv, its
get_reward the only reward) and tools that raise, hang, return a megabyte, call sys.exit, end their process, do not
exist, or are called with broken JSON, and a turn that never calls: each is counted, and the run goes on. The turns
are scripted (generation replaced by fixed tool calls: a random tiny model never writes one), everything else is the
run's own: the workers, the template, the tool mask, the rewards, the metrics, completions.jsonl and run.json. Then
`finetune validate` on agents: what the tools offer, and one message per problem naming the fix."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from agents_helpers import TOOLS_PY, long_context_copy
from conftest import write_jsonl

TOOLS = ["increment", "boom", "hang", "huge", "leave", "vanish", "echo"]
# rollout n of a step calls CALLS[n] (8 rollouts: 2 prompts x G 4); the last writes no call at all
CALLS = [("increment", '{"step": 3}'), ("boom", '{"x": 1}'), ("hang", '{"x": 1}'), ("huge", '{"x": 1}'),
         ("leave", '{"x": 1}'), ("vanish", '{"x": 1}'), ("echo", '{"text": "the cat ", "times": 40}'), None]
MALFORMED = '<tool_call>\n{"name": "increment", "arguments": {"step": 3</tool_call>'


@pytest.fixture(scope="module")
def long_context_model(tiny_model_dir, tmp_path_factory):
    return long_context_copy(tiny_model_dir, tmp_path_factory.mktemp("tiny_long") / "model")


def agents_recipe(root, base_model, **overrides) -> dict:
    (root / "tools.py").write_text(TOOLS_PY)
    write_jsonl(root / "prompts.jsonl", [{"prompt": [{"role": "user", "content": f"count {i}"}], "target": 3}
                                         for i in range(8)])
    recipe = {"base_model": str(base_model), "method": "grpo", "datasets": [{"path": "prompts.jsonl"}],
              "environment": "tools.py:IncrementEnv", "tools": [f"tools.py:{t}" for t in TOOLS if t != "increment"],
              "chat_template": "chatml_tools", "tool_timeout_s": 1, "max_tool_response_tokens": 64,
              "max_tool_calling_iterations": 2, "num_generations": 4, "max_completion_length": 320,
              "sequence_len": 4096, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 2,
              "learning_rate": 1e-3, "logging_steps": 1, "output_dir": "out", "cache_dir": "cache",
              "report_to": ["none"], "adapter": "lora", "lora_dropout": 0.0, "max_checkpoints": 1, "precision": "fp32"}
    recipe.update(overrides)
    (root / "recipe.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return recipe


class Script:
    """Generation replaced: each step's rollout n calls CALLS[n] in its first turn (the second step's rollout 7 writes
    a malformed call instead of none); every later turn answers and ends."""

    def __init__(self, tokenizer):
        self.tokenizer, self.first_turns = tokenizer, 0

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]

    def __call__(self, prompt_ids, num_generations, max_completion_length, turn):
        if turn == 0:  # a step's first turn: G samples of each prompt
            texts = []
            for n in range(len(prompt_ids) * num_generations):
                call = CALLS[n]
                texts.append(MALFORMED if call is None and self.first_turns else
                             "the count is 3, no tools" if call is None else
                             f'<tool_call>\n{{"name": "{call[0]}", "arguments": {call[1]}}}\n</tool_call>')
            self.first_turns += 1
        else:
            texts = ["done"] * len(prompt_ids)
        return [self.ids(t)[:max_completion_length] for t in texts]


@pytest.fixture(scope="module")
def agent_run(long_context_model, tmp_path_factory):
    from transformers import AutoTokenizer

    from finetune.recipe import load_recipe
    from finetune.train.grpo import agents
    from finetune.train.grpo.turns import Reprefill
    from finetune.train.run import run_training

    root = tmp_path_factory.mktemp("agent_run")
    agents_recipe(root, long_context_model)
    script = Script(AutoTokenizer.from_pretrained(long_context_model))
    with pytest.MonkeyPatch.context() as patch:  # the run's sampler of turns replaced by the script
        patch.setattr(agents, "turn_sampler", lambda model, seed, settings: Reprefill(script))
        summary = run_training(load_recipe(root / "recipe.yml"))
    return root, summary


def test_trl_counter_environment_and_broken_tools_run_and_are_counted(agent_run):
    root, summary = agent_run
    record = json.loads((root / "out" / "run.json").read_text())
    grpo = record["grpo"]
    failures = grpo["agents"]["failures"]
    for kind in ("exception", "timeout", "oversized", "died"):
        assert failures.get(kind), (kind, failures)
    assert grpo["agents"]["workers_replaced"] == 4  # a hang and a death a step, each replaced
    # the environments of the replaced workers' other rollouts rebuilt by replay (IncrementEnv is deterministic)
    assert grpo["agents"]["environments_replayed"]["rebuilt"] >= 4 and "lost" not in grpo["agents"]["environments_replayed"]
    assert grpo["reward_failures"]["IncrementEnv"]["calls_with_a_value"] == 2  # the environment's get_reward
    history = [e for e in record["log_history"] if "reward" in e]
    assert len(history) == 2
    first = history[0]
    # 7 calls among 8 rollouts; boom, hang, huge, leave, vanish and echo's 600-token result fail
    assert first["tools/call_frequency"] == pytest.approx(7 / 8)
    assert first["tools/failure_frequency"] == pytest.approx(6 / 7)
    assert history[1]["tools/call_frequency"] == pytest.approx(8 / 8)  # the malformed call counts as one, failed
    assert history[1]["tools/failure_frequency"] == pytest.approx(7 / 8)
    assert first["episodes/turns"] == pytest.approx((7 * 2 + 1) / 8)
    assert "rewards/IncrementEnv/mean" in first and first["reward"] > 0  # rollout 0 reached its target
    assert first["episodes/tool_tokens"] > 0  # tool-result tokens: in the episodes, out of the lengths


def test_completions_keep_each_episode_turn_by_turn(agent_run):
    root, _ = agent_run
    entries = [json.loads(line) for line in (root / "out" / "completions.jsonl").read_text().splitlines()]
    episodes = entries[0]["episodes"]
    turns = episodes[0]["turns"]
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
    assert turns[0]["tool_calls"][0]["function"] == {"name": "increment", "arguments": {"step": 3}}
    assert turns[1] == {"role": "tool", "name": "increment", "content": "3"}
    assert episodes[1]["turns"][1]["error"] == "exception" and "no luck" in episodes[1]["turns"][1]["content"]
    assert episodes[2]["turns"][1]["error"] == "timeout"
    malformed = [e for entry in entries for e in entry["episodes"] if e["turns"][0].get("malformed")]
    assert len(malformed) == 1 and malformed[0]["failures"] == 1


def test_the_training_process_never_imported_the_tools(agent_run):
    root, _ = agent_run
    path = str(root / "tools.py")
    assert not [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == path]


# --- validate ----------------------------------------------------------------------------------------------------
def test_validate_says_what_the_tools_offer(long_context_model, tmp_path, capsys):
    from finetune.cli import main

    agents_recipe(tmp_path, long_context_model)
    code = main(["validate", str(tmp_path / "recipe.yml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "agents: 7 tools offered (boom, hang, huge, leave, vanish, echo, increment); environment IncrementEnv" in out


def test_a_template_without_tool_calls_is_refused_naming_the_fix(tiny_tokenizer):
    from finetune.agent_tools import ToolError
    from finetune.train.grpo.agent_check import check_prompts, check_tokenizer

    with pytest.raises(ToolError, match=r"drops the tool calls of an assistant turn; set `chat_template: chatml_tools`"):
        check_tokenizer(tiny_tokenizer, {})
    with pytest.raises(ToolError, match=r"need conversation prompts \(1 of the first 2"):
        check_prompts([{"prompt": "plain"}, {"prompt": [{"role": "user", "content": "x"}]}])


def test_a_tool_without_a_docstring_and_a_run_without_a_reward_are_refused(tmp_path):
    """What the spawned process runs (describe), run here: the tool named with its file and line; then the recipe
    without a reward."""
    from finetune.agent_tools import ToolError, describe
    from finetune.recipe import load_recipe
    from finetune.train.grpo.agent_check import reward_problem

    (tmp_path / "t.py").write_text(TOOLS_PY + "\n\ndef bare(x: int):\n    return x\n\n\nclass Quiet:\n"
                                   "    def reset(self, **kwargs):\n        pass\n\n    def act(self, x: int) -> str:\n"
                                   "        \"\"\"Act.\n\n        Args:\n            x: How much.\n        \"\"\"\n"
                                   "        return str(x)\n")
    with pytest.raises(ToolError, match=r"tool `t.py:bare` \(.*t.py line \d+\): .*docstring"):
        describe("t.py:Quiet", ["t.py:bare"], tmp_path)
    info = describe("t.py:Quiet", [], tmp_path)
    assert info["tools"] == ["act"] and info["environment"] == "Quiet" and not info["environment_reward"]
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    base = {"base_model": "x", "method": "grpo", "datasets": [{"path": "p.jsonl"}], "num_generations": 2,
            "micro_batch_size": 2, "sequence_len": 512, "environment": "t.py:Quiet"}
    (tmp_path / "r.yml").write_text(yaml.safe_dump(base))
    assert "has no get_reward(): nothing scores an episode" in reward_problem(load_recipe(tmp_path / "r.yml"), info)


def test_the_runs_page_shows_each_episode_turn_by_turn(agent_run):
    from finetune.runs.read import read_run

    root, _ = agent_run
    samples = [s for s in read_run(root / "out", "agents")["samples"] if s["source"] == "grpo"]
    turns = samples[0]["answers"][1]["turns"]  # the rollout whose tool raised
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
    assert turns[0]["text"] == '-> boom({"x": 1})'
    assert turns[1]["label"] == "tool boom failed: exception" and turns[1]["error"] is True
    malformed = [t for s in samples for a in s["answers"] for t in a.get("turns", []) if "malformed" in t["label"]]
    assert len(malformed) == 1 and malformed[0]["error"] is True
