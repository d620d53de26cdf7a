"""GRPO's numbers for `finetune plan` and `finetune lr`: the steps a set of prompts makes, and the memory that
generation adds (pure math over counts and sizes).

Steps. micro_batch_size counts completions (as in TRL and axolotl), so (finetune/train/grpo/sampler.py lays the
prompts out this way, and the Trainer iterates the completion slots it lays out):

    prompts per step      = micro_batch_size x gradient_accumulation_steps x processes / G
    completions per step  = prompts per step x G
    generations per epoch = floor(prompts / prompts per step)   # whole steps only: the shuffled rest waits
    steps per epoch       = generations per epoch x mu          # each generation trains mu (num_iterations) steps
    total steps           = max_steps, else ceil(num_epochs x steps per epoch)   # as the Trainer counts them
    generations           = ceil(total steps / mu)

Memory. A step starts by generating: each process samples G completions for each of its prompts, all at once, and
holds their KV cache (keys and values of every layer, for every token so far) until the longest one ends:

    KV cache = 2 (K and V) x layers x kv_heads x head_dim x bytes x sequences x tokens
    sequences = G x prompts per process per step = micro_batch_size x gradient_accumulation_steps
    tokens    = sequence_len: the longest prompt (sequence_len - max_completion_length) + max_completion_length

Reward models (`rewards: [{model: ...}]`) stay loaded for the whole run, in the compute dtype, beside the policy; they
score a step's completions after generation, `batch_size` sequences of up to `max_length` tokens at a time, without
gradients, so a scoring pass holds about one layer's working set at once (held with neither the KV cache nor the
training activations):

    reward models  = their parameters x bytes
    scoring        = batch_size x max_length x (4 hidden + 3 intermediate) x bytes   (the largest reward model's)

Generation runs without gradients, before the step's scoring forward/backward passes, so the cache and the
scoring activations (micro_batch_size completions of prompt + completion tokens: an SFT micro batch of
sequence_len rows) are never held at the same time: the peak is the larger of the two (plan/memory.py). Not
counted: the no-grad passes that take the log-probs at generation time (mu > 1) and the reference's (rl_beta > 0),
which hold one layer's activations at a time, and the decoding step's logits (sequences x vocabulary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from finetune.errors import FinetuneError
from finetune.plan.shape import ModelShape


@dataclass(frozen=True)
class GRPOSteps:
    """What one run of GRPO takes, in prompts, completions, generations and optimizer steps."""

    prompts: int  # in the training split
    group: int  # G: completions per prompt
    iterations: int  # mu: optimizer steps per generation
    prompts_per_process: int  # per step
    prompts_per_step: int  # over every process
    steps_per_epoch: int
    total_steps: int

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group

    @property
    def generations_per_epoch(self) -> int:
        return self.steps_per_epoch // self.iterations

    @property
    def prompts_used_per_epoch(self) -> int:
        return self.generations_per_epoch * self.prompts_per_step

    @property
    def generations(self) -> int:
        """Generation rounds the run starts: one every mu steps (a last round may train fewer than mu steps)."""
        return math.ceil(self.total_steps / self.iterations)

    @property
    def completions(self) -> int:
        return self.generations * self.completions_per_step


def grpo_steps(prompts: int, micro_batch_size: int, gradient_accumulation_steps: int, processes: int, group: int,
               iterations: int, num_epochs: float, max_steps: int | None) -> GRPOSteps:
    """The step numbers of a GRPO run over `prompts` training prompts (the sampler's arithmetic, once)."""
    per_process, rest = divmod(micro_batch_size * gradient_accumulation_steps, group)
    if rest or per_process == 0:
        raise FinetuneError(
            f"micro_batch_size {micro_batch_size} x gradient_accumulation_steps {gradient_accumulation_steps} is not "
            f"a multiple of num_generations {group}: a step must hold whole groups of completions")
    per_step = per_process * processes
    if prompts < per_step:
        raise FinetuneError(
            f"{prompts} training prompts, but one optimizer step takes {per_step} (micro_batch_size {micro_batch_size}"
            f" x gradient_accumulation_steps {gradient_accumulation_steps} x {processes} process(es) / num_generations "
            f"{group}); add prompts or make the step smaller")
    per_epoch = prompts // per_step * iterations
    if max_steps is not None and max_steps > 0:
        total = max_steps
    elif num_epochs <= 0:
        raise FinetuneError(f"num_epochs must be positive, got {num_epochs}; or set max_steps")
    else:
        total = math.ceil(num_epochs * per_epoch)  # the Trainer's float expression (plan/steps.py)
    return GRPOSteps(prompts, group, iterations, per_process, per_step, per_epoch, total)


@dataclass(frozen=True)
class Generation:
    """What one process generates at the start of a step, for the KV cache's size."""

    sequences: int  # G x prompts per process per step (= micro_batch_size x gradient_accumulation_steps)
    prompt_tokens: int  # the longest prompt: sequence_len - max_completion_length
    completion_tokens: int  # max_completion_length
    bytes_per_value: int  # the compute dtype's: 2 (bf16 / fp16, autocast included), 4 (fp32)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def kv_cache_bytes(shape: ModelShape, generation: Generation) -> int:
    """Keys and values of every layer for every generated sequence at its longest."""
    head_dim = shape.hidden_size // shape.num_attention_heads
    # 2 (K and V) x layers x kv_heads x head_dim x bytes x sequences x tokens, e.g. Llama 3 8B in bf16 generating
    # 8 x 2 completions of 512 + 512 tokens: 2 x 32 x 8 x 128 x 2 x 16 x 1024 = 2.15 GB
    return (2 * shape.num_layers * shape.num_kv_heads * head_dim * generation.bytes_per_value
            * generation.sequences * generation.tokens)


def kv_cache_arithmetic(shape: ModelShape, generation: Generation, group: int) -> str:
    """The KV cache's product, factor by factor, as `finetune plan` prints it."""
    head_dim = shape.hidden_size // shape.num_attention_heads
    prompts = generation.sequences // group
    return (f"2 (K and V) x {shape.num_layers} layers x {shape.num_kv_heads} kv heads x {head_dim} head dim x "
            f"{generation.bytes_per_value} bytes x {generation.sequences} sequences (G {group} x {prompts} prompts) x "
            f"{generation.tokens} tokens ({generation.prompt_tokens} prompt + {generation.completion_tokens} "
            f"completion) = {kv_cache_bytes(shape, generation):,} bytes")


@dataclass(frozen=True)
class RewardModelLoad:
    """One reward model of a GRPO recipe, for its memory: its size and the tokens of one scoring pass."""

    params: int
    hidden_size: int
    intermediate_size: int
    tokens: int  # batch_size x max_length

    def weights_bytes(self, bytes_per_value: int) -> int:
        return self.params * bytes_per_value

    def scoring_bytes(self, bytes_per_value: int) -> int:
        # one decoder layer's working set for `tokens` at once, no grad: the residual stream, q/k/v/o and the MLP's
        # gate, up and down (attention scores: SDPA keeps none)
        return self.tokens * (4 * self.hidden_size + 3 * self.intermediate_size) * bytes_per_value
