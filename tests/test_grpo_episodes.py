"""Multi-turn episodes held to TRL 1.16 as the oracle (finetune/train/grpo/episodes.py).

A scripted policy (fixed turns holding tool calls, instead of sampling) drives our episode loop and TRL's own
GRPOTrainer._tool_call_loop (run on an object made with GRPOTrainer.__new__ carrying the attributes it reads), with the
same tools, template and max_completion_length, for two template families (Qwen2.5's Hermes <tool_call> JSON,
Llama 3.2's JSON calls). The completion ids, the tool mask and the call / failure counts must be equal: the same
tokens sampled and written, the same rollback at the budget, the same {'error': ...} results. Our tools run in the
worker processes, TRL's in its own process.
"""

from __future__ import annotations

import types

import pytest

from agents_helpers import TOOLS_PY, ScriptedPolicy, call_text, family_tokenizer

MAX_LEN = 400  # max_completion_length: the echo call's result passes it and is rolled back (the tiny BPE: ~1 token a character)
CAP = 2  # max_tool_calling_iterations: the rollout that always calls tools is cut by it


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agents") / "tools.py"
    path.write_text(TOOLS_PY)
    return path


@pytest.fixture(scope="module")
def runner(tools_file):
    from finetune.train.grpo.tools import ToolRunner

    specs = [f"{tools_file}:{name}" for name in ("add", "boom", "echo")]
    with ToolRunner(None, specs, tools_file.parent, timeout_s=30) as tools:
        yield tools


@pytest.fixture(scope="module")
def schemas(tools_file):
    from finetune.agent_tools import schemas_in_worker

    return schemas_in_worker(None, [f"{tools_file}:{n}" for n in ("add", "boom", "echo")], tools_file.parent)["schemas"]


def script(family: str) -> list[list[str]]:
    """Five rollouts of two prompts (G = 2, then 3 of a second prompt... as rollouts: prompt-major, G = 1 here so
    each has its own prompt). Llama 3.2 writes one call per turn."""
    call = lambda name, args: call_text(family, name, args)  # noqa: E731
    two = (call("add", '{"a": 2, "b": 3}') + "\n" + call("boom", '{"x": 1}') if family == "hermes"
           else call("boom", '{"x": 1}'))
    return [
        [call("add", '{"a": 2, "b": 3}'), "the sum is 5"],  # one call, then an answer
        ["seven, no tools"],  # never calls
        [two, call("nope", '{"x": 0}'), "done"],  # a raising tool, then a tool that does not exist
        [call("echo", '{"text": "long ", "times": 150}'), "never sampled"],  # a result past the budget: rolled back
        [call("add", '{"a": 1, "b": 1}'), call("add", '{"a": 2, "b": 2}'), call("add", '{"a": 3, "b": 3}'), "x"],
    ]


def prompts(tokenizer, schemas):
    from finetune.data.tool_chat import prompt_ids

    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]
    return messages, [prompt_ids(tokenizer, m, schemas) for m in messages]


def trl_loop(tokenizer, messages, prompt_ids, turns, functions, schemas):
    """TRL 1.16's _tool_call_loop on the scripted first turns."""
    import copy

    from trl.chat_template_utils import add_response_schema, parse_response
    from trl.trainer.grpo_trainer import GRPOTrainer

    tokenizer = add_response_schema(copy.deepcopy(tokenizer))
    policy = ScriptedPolicy(tokenizer, prompt_ids, turns)
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.processing_class = trainer._tokenizer = tokenizer
    trainer._is_vlm, trainer.use_vllm, trainer.chat_template, trainer.chat_template_kwargs = False, False, None, {}
    trainer.max_completion_length, trainer.max_tool_calling_iterations = MAX_LEN, CAP
    trainer.model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=4096))
    trainer.environment_factories, trainer.tools = None, list(functions.values())
    trainer._sync_tool_dicts = [dict(functions) for _ in prompt_ids]
    trainer._async_tool_dicts = [{} for _ in prompt_ids]
    trainer._generate_single_turn = lambda ids, *args, **kwargs: (policy.next_turns(ids), None)
    first = policy.first_turns()
    completions = [[parse_response(tokenizer, ids, prefix=p, tools=schemas)] for ids, p in zip(first, prompt_ids)]
    mask, completions, ids, _, calls, failures, _ = GRPOTrainer._tool_call_loop(
        trainer, copy.deepcopy(messages), [list(p) for p in prompt_ids], first, completions, None, None, {})
    return ids, mask, calls, failures


def our_loop(tokenizer, prompt_ids, turns, runner, schemas, parser):
    from finetune.data.tool_chat import tool_suffix_ids
    from finetune.train.grpo.episodes import EpisodeSettings, run_episodes
    from finetune.train.grpo.turns import Reprefill

    policy = ScriptedPolicy(tokenizer, prompt_ids, turns)
    eos = (tokenizer.eos_token_id,)
    return run_episodes(prompt_ids, 1, Reprefill(policy.generate), parser, lambda calls: runner.call(calls, 1 << 20),
                        lambda messages: tool_suffix_ids(tokenizer, messages, eos),
                        lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]), schemas,
                        EpisodeSettings(MAX_LEN, CAP, 10_000, 4096, eos))


@pytest.mark.parametrize("family,parser_kind", [("hermes", "family"), ("hermes", "response_template"),
                                                ("llama3", "family")])
def test_episodes_equal_trl_tool_call_loop(family, parser_kind, tools_file, runner, schemas):
    pytest.importorskip("trl", minversion="1.16")
    import importlib.util

    from finetune.train.grpo.tool_calls import call_parser
    from trl.chat_template_utils import add_response_schema

    spec = importlib.util.spec_from_file_location("agent_tools_for_trl", tools_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions = {name: getattr(module, name) for name in ("add", "boom", "echo")}
    tokenizer = family_tokenizer(family)
    messages, prompt_ids = prompts(tokenizer, schemas)
    turns = script(family)
    ours_tokenizer = add_response_schema(family_tokenizer(family)) if parser_kind == "response_template" else tokenizer
    batch = our_loop(ours_tokenizer, prompt_ids, turns, runner, schemas, call_parser(ours_tokenizer))
    ids, mask, calls, failures = trl_loop(tokenizer, messages, prompt_ids, turns, functions, schemas)

    assert batch.ids == ids
    assert batch.masks == mask
    assert sum(e.calls for e in batch.episodes) == calls
    assert sum(e.failures for e in batch.episodes) == failures
    episodes = batch.episodes
    assert [e.rounds for e in episodes] == [1, 0, 2, 0, 2]
    assert episodes[3].rolled_back and not any(e.rolled_back for i, e in enumerate(episodes) if i != 3)
    assert [e.cut_by_cap for e in episodes] == [False, False, False, False, True]
    assert 0 in batch.masks[0] and set(batch.masks[1]) == {1}  # tool tokens masked; a rollout without calls: none
    errors = [m for m in episodes[2].messages if m.get("error")]
    assert [m["error"] for m in errors] == ["exception", "unknown_tool"]
    assert errors[0]["content"] == str({"error": "no luck"})  # the model reads what TRL shows it
    assert errors[1]["content"] == str({"error": "Tool nope not found."})


# --- the loss on episodes ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def episodes(runner, schemas):
    """The Hermes script's episodes (our loop, held equal to TRL's above), their prompts, and a tiny LoRA model."""
    from finetune.train.grpo.tool_calls import call_parser

    tokenizer = family_tokenizer("hermes")
    _, prompt_ids = prompts(tokenizer, schemas)
    batch = our_loop(tokenizer, prompt_ids, script("hermes"), runner, schemas, call_parser(tokenizer))
    return batch, tokenizer


def _settings(loss_type, share_prompt=True):
    return types.SimpleNamespace(group=1, micro_batch=5, pad_id=0, eos_ids=(), mask_truncated=False,
                                 share_prompt=share_prompt, capacity=8192, temperature=1.0, loss_type=loss_type)


def _our_loss(model, batch, advantages, loss_type, rows_hook=None):
    """Our path: micro batches with the tool mask, packed scoring (rows_hook may alter the rows), the step's loss."""
    from finetune.train.grpo import scoring
    from finetune.train.grpo.loss import grpo_loss, step_normalizer
    from finetune.train.grpo.step import micro_batches

    settings = _settings(loss_type)
    (micro,) = micro_batches(batch.prompt_ids, batch, advantages, settings)
    pack = scoring.pack_scoring_rows
    if rows_hook is not None:
        scoring.pack_scoring_rows = lambda *a, **k: rows_hook(pack(*a, **k))
    try:
        logps, _ = scoring.score_batch(model, micro, settings)
    finally:
        scoring.pack_scoring_rows = pack
    normalizer = step_normalizer(loss_type, [micro["completion_mask"]], 5, MAX_LEN)
    return grpo_loss(logps, advantages, micro["completion_mask"], loss_type=loss_type, normalizer=normalizer,
                     epsilon_low=0.2, epsilon_high=0.28, beta=0.0).loss, micro["completion_mask"]


def _grads(model, compute):
    model.zero_grad()
    loss = compute()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_episode_loss_and_gradients_equal_trl(episodes, tiny_model_dir, loss_type):
    """Our scoring and loss on the episodes = TRL 1.16's _compute_loss with its tool_mask on the same rollouts scored
    the padded way (each after its own prompt, full logits: test_grpo_scoring holds that equal to TRL's scoring)."""
    pytest.importorskip("trl", minversion="1.16")
    import torch
    from test_grpo_loss import _trl_loss
    from test_grpo_scoring import _lora_model
    from trl.trainer import grpo_trainer

    from finetune.train.grpo.scoring import padded_completion_logps

    batch, _ = episodes
    model = _lora_model(tiny_model_dir).eval()  # no dropout: both paths see the same function
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3])
    ours, our_grads = _grads(model, lambda: _our_loss(model, batch, advantages, loss_type)[0])
    width = max(len(ids) for ids in batch.ids)
    tool_mask = torch.tensor([m + [1] * (width - len(m)) for m in batch.masks])  # TRL pads its tool_mask with 1

    def theirs():
        scores = padded_completion_logps(model, batch.prompt_ids, batch.ids)
        mask = scores.mask.long()
        step = {"logps": scores.logps, "entropies": scores.entropies, "mask": mask, "advantages": advantages,
                "ref": scores.logps.detach()}
        return _trl_loss(grpo_trainer, loss_type, step, beta=0.0, two_updates=False, tool_mask=tool_mask,
                         items_in_batch=(mask * tool_mask).sum(), max_len=MAX_LEN)[0]

    their_loss, their_grads = _grads(model, theirs)
    assert abs(ours.item()) > 1e-4
    assert ours.item() == pytest.approx(their_loss.item(), abs=1e-5)
    scale = max(g.abs().max().item() for g in their_grads)
    assert scale > 1e-5
    for mine, their in zip(our_grads, their_grads):
        torch.testing.assert_close(mine / scale, their / scale, atol=1e-5, rtol=0)


def test_targets_at_masked_positions_change_nothing(episodes, tiny_model_dir):
    """Every target token at a tool-result position replaced by a random one: the same loss and gradients, to the
    bit. The tool tokens are context, never a target the model is pushed toward or away from."""
    import torch
    from test_grpo_scoring import _lora_model

    batch, _ = episodes
    model = _lora_model(tiny_model_dir).eval()  # no dropout: both paths see the same function
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3])
    masks = batch.masks
    gen = torch.Generator().manual_seed(0)
    changed = []

    def scramble(rows):
        for row in rows:
            for k, (position, token, n, j) in enumerate(row.targets):
                if masks[n][j] == 0:
                    row.targets[k] = (position, int(torch.randint(0, 500, (1,), generator=gen)), n, j)
                    changed.append(k)
        return rows

    loss, grads = _grads(model, lambda: _our_loss(model, batch, advantages, "dapo")[0])
    scrambled, scrambled_grads = _grads(model, lambda: _our_loss(model, batch, advantages, "dapo", scramble)[0])
    assert len(changed) > 50  # the tool results of three episodes
    assert torch.equal(loss, scrambled)
    for a, b in zip(grads, scrambled_grads):
        assert torch.equal(a, b)
    # the same scramble on the sampled tokens does change the gradients: the test can fail
    masks = [[1 - m for m in mask] for mask in batch.masks]
    _, other = _grads(model, lambda: _our_loss(model, batch, advantages, "dapo", scramble)[0])
    assert not all(torch.equal(a, b) for a, b in zip(grads, other))
