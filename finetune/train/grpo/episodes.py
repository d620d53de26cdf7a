"""Multi-turn episodes, token in, token out: the model's turns, the tools' results between them, one sequence of
token ids and a mask per rollout. The loop is TRL 1.16's GRPOTrainer._tool_call_loop, step for step:

    turn 1      each rollout's prompt (its tools offered by the template) -> sampled ids
    then, while a rollout's last turn calls tools and max_tool_calling_iterations allows:
                run its calls (finetune/train/grpo/tools.py: workers, timeouts, failures as {'error': ...})
                suffix = the template's ids for those tool turns, up to the next assistant header
                         (finetune/data/tool_chat.py: rendered with and without them, as TRL computes them)
                if the episode would pass max_completion_length (or the model's positions), the results are rolled
                back and the episode ends as it stood (TRL's rule)
                else sample the next turn after prompt + episode + suffix (from the cache: only the suffix is
                run), cut to what is left of the budget

    ids   = turn 1 + suffix + turn 2 + suffix + ...        never decoded and re-tokenized: what was sampled is
    mask  = 1 ...   0 ...    1 ...    0 ...                what is scored; tool tokens (mask 0) get no loss,
                                                          no share of a dapo / dr_grpo normalizer, no length
A `sampler` samples the turns (turns.py): the run's continues each rollout from its KV cache (the tool results run
through the model after it, the prefix never again), seeded by step and turn; a test's is a script behind the same
`first` / `next`. `parse(ids, prefix, schemas) -> Turn` reads the calls (tool_calls.py). A malformed call counts as a
call and a failure, and ends its episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Episode:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # every completion token: sampled turns and tool results
    mask: list[int] = field(default_factory=list)  # 1 sampled by the model, 0 written for a tool result
    messages: list[dict] = field(default_factory=list)  # assistant and tool turns (TRL's completions entry)
    calls: int = 0
    failures: int = 0
    failure_kinds: list[str] = field(default_factory=list)
    rounds: int = 0  # tool-calling rounds run (turns = rounds + 1)
    cut_by_cap: bool = False  # still calling tools when max_tool_calling_iterations ended it
    rolled_back: bool = False  # its last results would have passed max_completion_length
    tool_seconds: float = 0.0
    truncated: bool = False  # its last token is not an end token (cut at max_completion_length)
    pending: list[int] = field(default_factory=list, repr=False)  # tool-result ids waiting for the next turn

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True)
class EpisodeSettings:
    max_completion_length: int
    max_iterations: int | None  # None: no cap
    max_response_tokens: int
    max_model_len: int
    eos_ids: tuple


@dataclass
class EpisodeBatch:
    """A step's episodes in the shape of generation.Completions (ids, is_truncated, num_generations, lengths), plus
    each one's mask and prompt (episodes of one prompt may have different prompts: reset() adds observations)."""

    episodes: list[Episode]
    num_generations: int

    @property
    def ids(self) -> list[list[int]]:
        return [e.ids for e in self.episodes]

    @property
    def masks(self) -> list[list[int]]:
        return [e.mask for e in self.episodes]

    @property
    def prompt_ids(self) -> list[list[int]]:
        return [e.prompt_ids for e in self.episodes]

    @property
    def is_truncated(self) -> list[bool]:
        return [e.truncated for e in self.episodes]

    @property
    def lengths(self) -> list[int]:
        """Tokens the model generated (tool results left out), as TRL's length metrics count them."""
        return [e.model_tokens for e in self.episodes]


def run_episodes(prompt_ids: list[list[int]], group: int, sampler, parse, call_tools, suffix_ids, count_tokens,
                 schemas: list[dict], settings: EpisodeSettings) -> EpisodeBatch:
    """Every rollout's episode. `prompt_ids`: one per rollout, prompt-major (G in a row); `sampler`: turns.py's
    (first / next); `call_tools(calls)` with calls [(rollout, name, arguments)] -> ToolOutcome each;
    `suffix_ids(tool_messages)`; `count_tokens(text)`."""
    episodes = [Episode(list(p)) for p in prompt_ids]
    first = sampler.first(*_first_prompts(prompt_ids, group), settings.max_completion_length)
    active = []
    for n, ids in enumerate(first):
        episodes[n].ids, episodes[n].mask = list(ids), [1] * len(ids)
        if _read_turn(episodes[n], ids, list(prompt_ids[n]), parse, schemas):
            active.append(n)
    rounds = 0
    while active and (settings.max_iterations is None or rounds < settings.max_iterations):
        active = _tool_round(episodes, active, call_tools, suffix_ids, count_tokens, settings)
        if not active:
            break
        rooms = [settings.max_completion_length - len(episodes[n].ids) - len(episodes[n].pending) for n in active]
        post = sampler.next(active, [episodes[n].pending for n in active], rooms, rounds + 1)
        still = []
        for n, room, ids in zip(active, rooms, post):
            episode = episodes[n]
            context = episode.prompt_ids + episode.ids + episode.pending
            ids = list(ids)[:max(room, 0)]
            episode.ids += episode.pending + ids
            episode.mask += [0] * len(episode.pending) + [1] * len(ids)
            episode.pending = []
            episode.rounds += 1
            if ids and _read_turn(episode, ids, context, parse, schemas):
                still.append(n)
        active, rounds = still, rounds + 1
    for n in active:  # the cap ended them while they were still calling tools
        episodes[n].cut_by_cap = True
    ends = set(settings.eos_ids)
    for episode in episodes:
        episode.truncated = not episode.ids or episode.ids[-1] not in ends
    return EpisodeBatch(episodes, group)


def _first_prompts(prompt_ids, group: int) -> tuple[list[list[int]], int]:
    """(prompts, samples of each) for the first turn: each group's prompt G times when its rollouts' prompts are the
    same (no observation, or the same one), so it is prefilled once; else each rollout's own prompt once."""
    groups = [prompt_ids[i:i + group] for i in range(0, len(prompt_ids), group)]
    if all(all(list(p) == list(g[0]) for p in g) for g in groups):
        return [list(g[0]) for g in groups], group
    return [list(p) for p in prompt_ids], 1


def _read_turn(episode: Episode, ids, prefix, parse, schemas) -> bool:
    """Parse a sampled turn into the episode's messages; True when it calls tools."""
    turn = parse(list(ids), list(prefix), schemas)
    message = turn.message()
    if turn.malformed:
        message["malformed"] = turn.malformed
        episode.calls += 1
        episode.failures += 1
        episode.failure_kinds.append("malformed")
    episode.messages.append(message)
    return bool(turn.calls) and not turn.malformed


def _tool_round(episodes, active, call_tools, suffix_ids, count_tokens, settings) -> list[int]:
    """Run the active episodes' calls, add their results; the episodes that may go on (the others rolled back)."""
    from finetune.agent_tools import error_content

    calls = [(n, c["function"]["name"], c["function"]["arguments"]) for n in active
             for c in episodes[n].messages[-1]["tool_calls"]]
    outcomes = iter(call_tools(calls))
    kept = []
    for n in active:
        episode = episodes[n]
        results = []
        for call in episode.messages[-1]["tool_calls"]:
            outcome = next(outcomes)
            name = call["function"]["name"]
            episode.calls += 1
            episode.tool_seconds += outcome.seconds
            content, failed = (outcome.value, None) if outcome.ok else (None, outcome.kind)
            if content is not None and count_tokens(content) > settings.max_response_tokens:
                content, failed = None, "oversized"
                outcome_shown = (f"the result has more than max_tool_response_tokens {settings.max_response_tokens} "
                                 "tokens")
            else:
                outcome_shown = outcome.shown
            if failed:
                episode.failures += 1
                episode.failure_kinds.append(failed)
                content = error_content(outcome_shown)
            results.append({"role": "tool", "name": name, "content": content, **({"error": failed} if failed else {})})
        suffix = suffix_ids([{k: r[k] for k in ("role", "name", "content")} for r in results])
        used = len(episode.ids) + len(suffix)
        if used > settings.max_completion_length or len(episode.prompt_ids) + used >= settings.max_model_len:
            episode.rolled_back = True  # TRL's rule: the results never shown, the episode ends as it stood
            continue
        episode.messages += results
        episode.pending = suffix
        kept.append(n)
    return kept


def episode_metrics(batch: EpisodeBatch) -> dict[str, float]:
    """TRL's tools/call_frequency (calls per rollout) and tools/failure_frequency (failures per call), with the turns
    per episode, the share cut by the iteration cap and rolled back at the budget, and the seconds tools took."""
    episodes = batch.episodes
    calls = sum(e.calls for e in episodes)
    failures = sum(e.failures for e in episodes)
    n = max(len(episodes), 1)
    return {"tools/call_frequency": calls / n,
            "tools/failure_frequency": failures / calls if calls else 0.0,
            "tools/seconds": sum(e.tool_seconds for e in episodes),
            "episodes/turns": sum(e.rounds + 1 for e in episodes) / n,
            "episodes/cut_by_cap": sum(e.cut_by_cap for e in episodes) / n,
            "episodes/rolled_back": sum(e.rolled_back for e in episodes) / n,
            "episodes/tool_tokens": sum(len(e.ids) - e.model_tokens for e in episodes) / n}

