"""G completions per prompt, sampled from the model as it trains: the LoRA adapter live (no merge, no server).

One batched `generate` call: the prompts left-padded (a decoder continues from the last column, so every prompt
must end there), `num_return_sequences = G` (transformers repeats each prompt G times in a row, so completion n
belongs to prompt n // G: TRL's order), the KV cache on. While sampling:
- the model is in eval mode (no dropout while sampling), and every module's own training flag is restored after;
- the cache is used even under gradient checkpointing: transformers turns the cache off only for a checkpointed
  layer in training mode (modeling_layers.py), and `use_cache=True` in the generation config overrides a
  `config.use_cache = False` left by the packing guard;
- the model's own generation config is set aside: a checkpoint's generation_config.json (a repetition penalty,
  min_p, top_k 50 as transformers' default) would otherwise fill every knob left unset, and GRPO must sample
  from the distribution it scores (softmax(logits / temperature), cut by top_k / top_p);
- the RNG is forked and seeded: `generate` draws from the global torch RNG, so sampling runs inside
  `torch.random.fork_rng` with the CPU generator (and the model's CUDA device's) seeded with `seed`. The same seed
  and the same prompts give the same completions, and the training RNG stream (dropout, data order) is not
  consumed, so a resumed run replays a step exactly when the caller derives `seed` from (recipe seed, step,
  process). The tokens drawn depend on the whole batch, so "the same prompts" means the same batch.

Completions are cut after their first EOS, the EOS kept (TRL 1.16, GRPOTrainer: `completion_mask` covers the tokens
up to and including the first EOS); one with no EOS in `max_completion_length` tokens is truncated.
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
    import torch

    _check_arguments(prompt_ids, num_generations, max_completion_length, temperature, eos_ids)
    device = next(model.parameters()).device
    input_ids, attention_mask = _left_padded(prompt_ids, pad_id, device)
    config = _generation_config(num_generations, max_completion_length, temperature, top_p, top_k, eos_ids, pad_id)
    with _sampling_mode(model), _seeded_rng(seed, device), torch.no_grad():
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    generated = sequences[:, input_ids.shape[1]:].tolist()
    ids, truncated = [], []
    eos = set(eos_ids)
    for tokens in generated:
        end = next((t for t, token in enumerate(tokens) if token in eos), None)
        ids.append(tokens[:end + 1] if end is not None else tokens)  # unfinished: never padded
        truncated.append(end is None)
    return Completions(ids=ids, is_truncated=truncated, num_generations=num_generations)


def decode_completions(tokenizer, completions: Completions) -> list[str]:
    """The completions as text, special tokens (the EOS) dropped, as TRL hands them to reward functions."""
    return tokenizer.batch_decode(completions.ids, skip_special_tokens=True)


def _check_arguments(prompt_ids, num_generations, max_completion_length, temperature, eos_ids) -> None:
    if not prompt_ids or any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("every prompt needs at least one token: generation continues from the prompt's last one")
    if num_generations < 1 or max_completion_length < 1:
        raise ValueError(f"num_generations ({num_generations}) and max_completion_length "
                         f"({max_completion_length}) must be at least 1")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}): GRPO samples, it never decodes greedily")
    if not eos_ids:
        raise ValueError("eos_ids is empty: a completion could never end, every one would be truncated")


def _left_padded(prompt_ids: list[list[int]], pad_id: int, device):
    import torch

    width = max(len(ids) for ids in prompt_ids)
    ids = [[pad_id] * (width - len(p)) + list(p) for p in prompt_ids]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def _generation_config(num_generations, max_completion_length, temperature, top_p, top_k, eos_ids, pad_id):
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_completion_length, do_sample=True, num_return_sequences=num_generations,
        temperature=temperature, top_p=top_p, top_k=top_k or 0,  # 0: transformers adds no top-k warper
        eos_token_id=list(eos_ids), pad_token_id=pad_id, bos_token_id=None, use_cache=True,
    )


@contextlib.contextmanager
def _sampling_mode(model):
    """Eval mode and a blank generation config for the duration; each module's training flag restored after."""
    from transformers import GenerationConfig

    modes = [(module, module.training) for module in model.modules()]
    holder = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    saved = holder.generation_config
    holder.generation_config = GenerationConfig()
    model.eval()
    try:
        yield
    finally:
        holder.generation_config = saved
        for module, training in modes:
            module.training = training


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
