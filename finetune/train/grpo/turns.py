"""How an episode's turns are sampled: the `sampler` that episodes.py's loop asks for each turn.

    ids = sampler.first(prompts, group, limit)          # turn 1: `group` rows per prompt, rollout n = row n
    ids = sampler.next(rows, appended, limits, turn)    # the rollouts `rows` go on: `appended[i]` (their tool
                                                        # results) after what they have, each up to `limits[i]`

Two samplers, which give the same tokens (tests/test_agent_turns.py holds them equal on a tiny model with LoRA live):
- `CachedTurns`, the run's: generation.Episodes. Turn 1 prefills each prompt once and holds its KV cache G times (it
  is generate_completions); after it, the rollouts that go on are kept, their tool-result ids run through the model
  after their cache, and the next turn is sampled from there: the prompt and the earlier turns are never run again.
  A model whose cache keeps recurrent (linear attention) states cannot be continued over the padding between turns;
  its later turns are sampled as `Reprefill` samples them. Nor can a sliding window once the cache's columns (the
  padding between turns included) could pass it: the window would hold padding in place of real tokens, and the
  turns from there on are sampled as `Reprefill` samples them.
- `Reprefill`: each later turn sampled from scratch on the rollouts' whole ids (prompt + episode so far), by a
  `generate(prompts, num_generations, max_new_tokens, turn) -> ids` (a scripted policy in the tests).

Both seed turn t of a step's episodes with turn_seed(step seed, t), so a resumed run replays its episodes. Each row
of a turn draws its tokens in one batch with the others (the draw takes one set of random numbers for the whole
batch), so the same rollouts going on in the same order draw the same tokens on both paths.
"""

from __future__ import annotations


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one turn of a step's episodes: the step's seed for the first (the same draw as a run
    without tools), a function of (step seed, turn) after it, so a resumed run replays its episodes."""
    return (seed + turn * 1_000_033) % (2**63 - 1)


class Reprefill:
    """Every turn sampled by `generate` from the rollouts' whole ids: the prefix is run again each turn."""

    def __init__(self, generate):
        self.generate = generate
        self.tokens: dict[int, list[int]] = {}  # rollout -> its ids so far, prompt first

    def first(self, prompts: list[list[int]], group: int, limit: int) -> list[list[int]]:
        ids = [list(t) for t in self.generate([list(p) for p in prompts], group, limit, 0)]
        self.tokens = {n: list(prompts[n // group]) + t for n, t in enumerate(ids)}
        return ids

    def next(self, rows: list[int], appended: list[list[int]], limits: list[int], turn: int) -> list[list[int]]:
        contexts = [self.tokens[n] + list(a) for n, a in zip(rows, appended)]
        drawn = self.generate(contexts, 1, max(1, *limits), turn)  # one batch, its longest budget; each cut to its own
        ids = [list(t)[:max(limit, 0)] for t, limit in zip(drawn, limits)]
        self.tokens = {n: c + t for n, c, t in zip(rows, contexts, ids)}
        return ids


class CachedTurns:
    """The run's sampler: generation.Episodes, each turn continued from the rollouts' KV cache (see the module
    docstring). `sampling`: generate_completions' keyword arguments (eos_ids, pad_id, temperature, top_p, top_k)."""

    def __init__(self, model, seed: int, **sampling):
        self.model, self.seed, self.sampling = model, seed, sampling
        self.episodes = None
        self.rows: list[int] = []  # the rollout each of the Episodes' rows is
        self.fallback: Reprefill | None = None  # a recurrent cache, or past a sliding window: turns re-prefilled

    def first(self, prompts: list[list[int]], group: int, limit: int) -> list[list[int]]:
        from finetune.train.grpo.generation import Episodes

        kwargs = dict(self.sampling)
        self.episodes = Episodes(self.model, prompts, group, pad_id=kwargs.pop("pad_id"))
        ids = self.episodes.sample(limit, seed=turn_seed(self.seed, 0), **kwargs).ids
        self.rows = list(range(len(ids)))
        if not self.episodes.continuable:
            self._reprefill_from_here()
        return ids

    def _reprefill_from_here(self) -> None:
        """The later turns sampled from the rollouts' whole ids (Reprefill), the cache dropped."""
        self.fallback = Reprefill(self._generate)
        self.fallback.tokens = {n: list(t) for n, t in zip(self.rows, self.episodes.tokens)}
        self.episodes = None

    def next(self, rows: list[int], appended: list[list[int]], limits: list[int], turn: int) -> list[list[int]]:
        if self.fallback is None and not self.episodes.exact_for(1 + max(map(len, appended)) + max(limits)):
            self._reprefill_from_here()
        if self.fallback is not None:
            return self.fallback.next(rows, appended, limits, turn)
        kwargs = {k: v for k, v in self.sampling.items() if k != "pad_id"}
        where = {n: i for i, n in enumerate(self.rows)}
        self.episodes.keep([where[n] for n in rows])
        self.rows = list(rows)
        self.episodes.append([list(a) for a in appended])
        drawn = self.episodes.sample([max(1, limit) for limit in limits], seed=turn_seed(self.seed, turn), **kwargs)
        return [list(t)[:max(limit, 0)] for t, limit in zip(drawn.ids, limits)]

    def _generate(self, prompts, num_generations, max_new_tokens, turn):
        from finetune.train.grpo.generation import generate_completions

        return generate_completions(self.model, prompts, num_generations, max_new_tokens,
                                    seed=turn_seed(self.seed, turn), **self.sampling).ids
