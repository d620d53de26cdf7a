"""G completions per prompt, sampled from the model as it trains: the LoRA adapter live (no merge, no server).

Each prompt is run through the model once and its KV cache held G times (finetune/train/grpo/decoding.py), then
every row is sampled with the cache, one batched decoding step at a time: the completions are token for token
those of transformers' `generate(do_sample=True, num_return_sequences=G)` on the left-padded prompts at the same
seed (tests/test_grpo_rollout.py holds them equal), with the prompts' prefill done once instead of G times and
without `generate`'s per-step machinery. Completion n belongs to prompt n // G (TRL's order). While sampling:
- the model is in eval mode (no dropout while sampling), and every module's own training flag is restored after;
- the cache is used even under gradient checkpointing: transformers turns the cache off only for a checkpointed
  layer in training mode (modeling_layers.py), and every call passes `use_cache=True`, over a
  `config.use_cache = False` left by the packing guard;
- what is drawn is softmax(logits / temperature), cut by top_k / top_p (transformers' own warpers, in
  `generate`'s order), and nothing else: a checkpoint's generation_config.json (a repetition penalty, min_p) is
  never read, since GRPO must sample from the distribution it scores;
- the RNG is forked and seeded: the draw uses the global torch RNG, so sampling runs inside
  `torch.random.fork_rng` with the CPU generator (and the model's CUDA device's) seeded with `seed`. The same seed
  and the same prompts give the same completions, and the training RNG stream (dropout, data order) is not
  consumed, so a resumed run replays a step exactly when the caller derives `seed` from (recipe seed, step,
  process). The tokens drawn depend on the whole batch, so "the same prompts" means the same batch.

Completions are cut after their first EOS, the EOS kept (TRL 1.16, GRPOTrainer: `completion_mask` covers the tokens
up to and including the first EOS); one with no EOS in `max_completion_length` tokens is truncated.

Episodes of several turns (a tool's result between two of the model's turns) keep the batch and its cache alive:
`Episodes` samples a turn, appends each row's tool-result ids after what it sampled and samples the next turn
from the cache, never re-running the prefix (token in, token out: nothing is decoded and re-encoded). The agents'
episodes sample their turns so (turns.py, CachedTurns).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Completions:
    """Sampled completions, prompt-major: prompt i's G completions are `ids[i * G:(i + 1) * G]`."""

    ids: list[list[int]]  # each cut after its first EOS (kept)
    is_truncated: list[bool]  # no EOS within max_completion_length tokens
    num_generations: int

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.ids]

    def prompt_index(self, n: int) -> int:
        return n // self.num_generations


def generate_completions(model, prompt_ids: list[list[int]], num_generations: int, max_completion_length: int, *,
                         seed: int, eos_ids: list[int], pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                         top_k: int | None = None) -> Completions:
    """Sample `num_generations` completions of at most `max_completion_length` tokens for every prompt.
    `model`: the causal LM or its peft wrapper, unwrapped from DDP / DeepSpeed by the caller; `top_k` None or 0:
    no top-k cut."""
    _check_prompts(prompt_ids, num_generations)
    _check_sampling([max_completion_length], temperature, eos_ids)
    episodes = Episodes(model, prompt_ids, num_generations, pad_id=pad_id)
    return episodes.sample(max_completion_length, seed=seed, eos_ids=eos_ids, temperature=temperature, top_p=top_p,
                           top_k=top_k)


class Episodes:
    """G rows per prompt, sampled turn by turn with their KV cache kept: the multi-turn rollout (a tool's result
    between the model's turns) without re-running any prefix. Row n starts as prompt n // G.

        episodes = Episodes(model, prompt_ids, G, pad_id=pad)      # each prompt prefilled once, its cache G times
        turn = episodes.sample(256, seed=s, eos_ids=eos)           # = generate_completions(...) for the first turn
        episodes.keep([0, 3, 5])                                   # the rows that called a tool go on
        episodes.append([result_ids_0, result_ids_3, result_ids_5])  # after each row's last sampled token
        turn = episodes.sample([200, 180, 240], seed=s2, eos_ids=eos)  # each row's own remaining budget

    `append` puts the ids after everything the row has (its last turn's tokens, EOS included) and runs them
    through the model with the cache in one forward; the next `sample` continues from there, as sampling from
    the concatenated ids would (tests/test_grpo_rollout.py). `tokens[row]` is the row's every id, prompt first;
    `prompt_index[row]` its prompt (`keep` drops rows: read their tokens first). Each call puts the model in eval
    mode for its duration and computes no gradients. The cache lives as long as this object: drop it when the
    episodes end. `append` and `keep` need a model whose layers all use softmax attention (a recurrent, linear
    attention state cannot skip the padding between turns: ValueError); a sliding window counts the cache's
    columns, padding included, so past the window a continued row sees fewer tokens than a fresh one
    (`exact_for` says when it does not)."""

    def __init__(self, model, prompt_ids: list[list[int]], num_generations: int, *, pad_id: int):
        from finetune.train.grpo import decoding

        _check_prompts(prompt_ids, num_generations)
        self.model, self.pad_id, self.num_generations = model, pad_id, num_generations
        self.prompt_index = [n // num_generations for n in range(len(prompt_ids) * num_generations)]
        with _sampling_mode(model) as lm:
            self._state = decoding.prefill(lm, prompt_ids, num_generations, pad_id)

    @property
    def continuable(self) -> bool:
        """Whether `keep` and `append` can go on from this cache (every layer softmax attention)."""
        from finetune.train.grpo import decoding

        return decoding.attention_only(self._state.cache)

    def exact_for(self, columns: int) -> bool:
        """Whether `columns` more cache columns (appended ids, sampled tokens) continue every row exactly as a run of
        its whole ids would: always without a sliding window; with one, while all the columns fit in it."""
        from finetune.train.grpo import decoding

        window = decoding.sliding_window(self._state.cache)
        return window is None or self._state.valid.shape[1] + columns <= window

    @property
    def tokens(self) -> list[list[int]]:
        """Each row's ids: its prompt, then every token sampled or appended since, in order."""
        return self._state.tokens

    def sample(self, max_new_tokens: int | list[int], *, seed: int, eos_ids: list[int], temperature: float = 1.0,
               top_p: float = 1.0, top_k: int | None = None) -> Completions:
        """Every row's next turn: up to its first EOS (kept) or max_new_tokens (one for all, or one per row)."""
        from finetune.train.grpo import decoding

        limits = [max_new_tokens] * self._state.rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != self._state.rows:
            raise ValueError(f"max_new_tokens: one limit for each of the {self._state.rows} rows (got {len(limits)})")
        _check_sampling(limits, temperature, eos_ids)
        warpers = _warpers(temperature, top_p, top_k)
        with _sampling_mode(self.model) as lm, _seeded_rng(seed, self._state.valid.device), _decoding_kernels(lm):
            ids, truncated = decoding.sample(lm, self._state, limits, list(eos_ids), self.pad_id, warpers)
        return Completions(ids=ids, is_truncated=truncated, num_generations=self.num_generations)

    def append(self, ids: list[list[int]]) -> None:
        """Put `ids[row]` after each row's tokens (an empty list: nothing) and run them through the model."""
        from finetune.train.grpo import decoding

        if len(ids) != self._state.rows:
            raise ValueError(f"append: one list of ids for each of the {self._state.rows} rows (got {len(ids)})")
        with _sampling_mode(self.model) as lm:
            decoding.extend(lm, self._state, ids, self.pad_id)

    def keep(self, rows: list[int]) -> None:
        """Go on with these rows only (in this order); the others' cache is freed."""
        from finetune.train.grpo import decoding

        if not rows or any(not 0 <= r < self._state.rows for r in rows):
            raise ValueError(f"keep: rows between 0 and {self._state.rows - 1}, at least one (got {rows})")
        decoding.keep(self._state, list(rows))
        self.prompt_index = [self.prompt_index[r] for r in rows]


def decode_completions(tokenizer, completions: Completions) -> list[str]:
    """The completions as text, special tokens (the EOS) dropped, as TRL hands them to reward functions."""
    return tokenizer.batch_decode(completions.ids, skip_special_tokens=True)


def _check_prompts(prompt_ids, num_generations) -> None:
    if not prompt_ids or any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("every prompt needs at least one token: generation continues from the prompt's last one")
    if num_generations < 1:
        raise ValueError(f"num_generations ({num_generations}) must be at least 1")


def _check_sampling(limits: list[int], temperature, eos_ids) -> None:
    if not limits or min(limits) < 1:
        raise ValueError(f"max_completion_length / max_new_tokens ({limits}) must be at least 1")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}): GRPO samples, it never decodes greedily")
    if not eos_ids:
        raise ValueError("eos_ids is empty: a completion could never end, every one would be truncated")


def _warpers(temperature: float, top_p: float, top_k: int | None):
    """transformers' sampling warpers, those `generate` adds for these settings, in its order."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return warpers


@contextlib.contextmanager
def _sampling_mode(model):
    """Eval mode and no gradients for the duration, each module's training flag restored after; yields the causal
    LM (the LoRA layers live inside it under a peft wrapper)."""
    import torch

    from finetune.model import base_causal_lm

    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield base_causal_lm(model)
    finally:
        for module, training in modes:
            module.training = training


@contextlib.contextmanager
def _decoding_kernels(lm):
    """What `generate` does around its decoding steps (not the prefill): off the CPU, a mixture-of-experts model's
    `grouped_mm` experts run as `batched_mm` (faster for a few tokens), restored after."""
    get = getattr(lm, "get_experts_implementation", None)
    original = get() if callable(get) else {}
    switch = lm.device.type != "cpu" and "grouped_mm" in original.values()
    if switch:
        lm.set_experts_implementation({k: "batched_mm" if v == "grouped_mm" else v for k, v in original.items()})
    try:
        yield
    finally:
        if switch:
            lm.set_experts_implementation(original)


@contextlib.contextmanager
def _seeded_rng(seed: int, device):
    """Global RNG state seeded with `seed` inside, and as it was outside (the CPU one, and `device`'s on CUDA)."""
    import torch

    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield
