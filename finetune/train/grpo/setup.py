"""What run.py asks of a GRPO run: the prompts' dataset and collator, the sampler, the trainer's arguments, and what
run.json records."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.log import get_logger

log = get_logger(__name__)

SAMPLES_FILE = "completions.jsonl"  # in output_dir: prompts, their completions, rewards and advantages per log


class PromptCollator:
    """Prompt rows -> lists (index, prompt ids, record); the trainer generates, so nothing is padded here."""

    def __call__(self, rows: list[dict]) -> dict:
        return {"index": [r["index"] for r in rows], "prompt_ids": [r["prompt_ids"] for r in rows],
                "record": [r["record"] for r in rows]}


def with_index(dataset):
    """The prompts' dataset with each row's position, which the trainer uses to find each prompt's group."""
    return dataset.add_column("index", list(range(len(dataset))))


def step_shape(recipe, world_size: int):
    from finetune.recipe.methods import method_setting
    from finetune.train.grpo.sampler import StepShape

    return StepShape(group=method_setting(recipe, "num_generations"), micro_batch=recipe.micro_batch_size,
                     accumulation=recipe.gradient_accumulation_steps, processes=world_size,
                     iterations=method_setting(recipe, "num_iterations"))


def completion_slots(recipe, prompts: int, world_size: int) -> int:
    """What the Trainer iterates in an epoch: completion slots (G per prompt, mu times), whole steps only."""
    from finetune.errors import DataError
    from finetune.train.grpo.sampler import GroupSampler

    shape = step_shape(recipe, world_size)
    if prompts < shape.prompts_per_step:
        raise DataError(f"{prompts} training prompts, but one optimizer step takes {shape.prompts_per_step} (micro_batch_size "
                        f"{recipe.micro_batch_size} x gradient_accumulation_steps {recipe.gradient_accumulation_steps} x "
                        f"{world_size} process(es) / num_generations {shape.group}); add prompts or make the step smaller")
    return len(GroupSampler(prompts, shape, recipe.seed))


def grpo_settings(recipe, tokenizer, prepared, share_prompt: bool, packs: bool = True):
    """`packs`: the model's family trains on packed rows (finetune/model/families.py); where it does not (its
    packed examples would read each other), each completion is scored in a row of its own."""
    from finetune.recipe.methods import method_setting
    from finetune.train.grpo.step import GRPOSettings

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    first = prepared.train[0]["record"]
    return GRPOSettings(
        group=method_setting(recipe, "num_generations"),
        max_completion_length=method_setting(recipe, "max_completion_length"),
        temperature=method_setting(recipe, "temperature"), top_p=method_setting(recipe, "top_p"),
        top_k=method_setting(recipe, "top_k"), loss_type=method_setting(recipe, "loss_type"),
        epsilon=method_setting(recipe, "epsilon"), epsilon_high=method_setting(recipe, "epsilon_high"),
        beta=method_setting(recipe, "rl_beta"), iterations=method_setting(recipe, "num_iterations"),
        scale_rewards=method_setting(recipe, "scale_rewards"),
        mask_truncated=method_setting(recipe, "mask_truncated_completions"),
        micro_batch=recipe.micro_batch_size, seed=recipe.seed, pad_id=pad, eos_ids=eos_ids(tokenizer),
        chat=isinstance(json.loads(first)["prompt"], list), share_prompt=bool(share_prompt),
        capacity=scoring_capacity(recipe.sequence_len, packs))


def scoring_capacity(sequence_len: int, packs: bool) -> int:
    """Tokens per scoring row: sequence_len; 0 where the model's family does not pack (each completion alone)."""
    return sequence_len if packs else 0


def eos_ids(tokenizer) -> tuple:
    """The tokens that end a completion: EOS, and a chat template's end of turn when it differs."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        found = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if found is not None:
            ids.add(found)
    return tuple(sorted(i for i in ids if i is not None))


def grpo_trainer_kwargs(recipe, prepared, tokenizer, world_size: int, share_prompt: bool, packs: bool = True,
                        device=None, precision: str = "fp32") -> dict:
    from finetune.train.grpo.reward_models import RewardSet
    from finetune.train.grpo.sampler import GroupSampler

    # FILE specs are absolute (finetune/recipe/load.py); package.module specs import from the current folder; reward
    # models load on the training device, in the run's precision
    runner = RewardSet(recipe.rewards, base_dir=Path.cwd(), device=device, dtype=precision)
    if not packs:
        log.info("GRPO scoring: each completion in a row of its own (this model family's packed rows are not "
                 "isolated: docs/models.md)")
    return {"grpo": grpo_settings(recipe, tokenizer, prepared, share_prompt and packs, packs), "rewards": runner,
            "sampler": GroupSampler(len(prepared.train), step_shape(recipe, world_size), recipe.seed),
            "samples_path": Path(recipe.output_dir) / SAMPLES_FILE}


def grpo_record(recipe, trainer) -> dict:
    """What run.json records of a GRPO run: the settings, the reward functions' failures, the last metrics."""
    from finetune.recipe.methods import method_settings

    history = trainer.state.log_history
    last = next((e for e in reversed(history) if "reward" in e), {})
    loop = next((e["train_runtime"] for e in reversed(trainer.state.log_history) if "train_runtime" in e), None)
    tokens = trainer.generated_tokens
    return {"settings": method_settings(recipe), "generated_completions": trainer.generated_completions,
            "generated_tokens": tokens, "generation_s": round(trainer.generation_seconds, 3),
            # the training loop's seconds (generation, rewards, scoring, updates) per completion token generated
            "seconds_per_generated_token": (loop / tokens) if loop and tokens else float("nan"),
            "shared_prompt": trainer.grpo.share_prompt,
            "reward_failures": trainer.rewards.failure_summary(),
            "last_metrics": {k: v for k, v in last.items() if k.startswith(("reward", "completions/", "frac_", "kl",
                                                                             "entropy", "clip_ratio"))},
            "samples": str(Path(recipe.output_dir) / SAMPLES_FILE)}


def done_grpo(summary: dict, output_dir) -> dict:
    """The run's closing lines: generation speed, then `done:` with the reward (the verdict's first and last thirds)
    and the functions that failed. A run in which no function ever gave a value raises RewardError (exit 2), its
    run.json and diagnosis written: however short, it learned nothing."""
    from finetune.errors import RewardError

    grpo, curves = summary["grpo"], summary.get("curves") or {}
    log.info(f"generation: {grpo['generated_tokens']:,} completion tokens in {grpo['generation_s']:.1f} s; "
             f"{grpo['seconds_per_generated_token']:.4f} s per generated token, whole loop")
    if curves.get("verdict") == "no reward":
        raise RewardError(f"the run ended after {summary['steps']} steps without a single reward: "
                          f"{curves['reason']}. run.json and diagnosis.json are in {output_dir}; the model saved "
                          "there learned nothing from a reward")
    log.info(f"done: {summary['steps']} steps, {reward_words(summary)}; saved to {output_dir}")
    return summary


def reward_words(summary: dict) -> str:
    """`reward 0.21 -> 0.48 (means of the first and last third of 12 logged steps)`, then each function that failed
    (`boom` failed 3 of 12 calls: exception), and those that never gave a value."""
    curves = summary.get("curves") or {}
    if "reward_first" in curves:
        words = (f"reward {curves['reward_first']:.4f} -> {curves['reward_last']:.4f} (means of the first and last "
                 f"third of {curves['logged_steps']} logged steps)")
    else:
        words = "reward - (none was logged)"
    never = curves.get("never_valued") or []
    if never:
        words += f"; {len(never)} of {len(summary['grpo']['reward_failures'])} reward functions never gave a value: "
        words += ", ".join(f"`{n}`" for n in never)
    failed = [f"`{name}` failed {sum(entry['failures'].values())} of {entry['calls']} calls "
              f"({', '.join(entry['failures'])})" for name, entry in summary["grpo"]["reward_failures"].items()
              if entry["failures"] and name not in never]
    return words + (f"; {'; '.join(failed)}" if failed else "")


def probe_grpo(model) -> bool:
    """Prove on the model, before anything is written, that scoring a prompt's completions in one packed row (the
    prompt held once) gives the log-probs of scoring each completion alone; False: each completion keeps its own
    copy of the prompt (still packed, never leaking)."""
    from finetune.train.grpo.scoring import check_shared_scoring

    shared = check_shared_scoring(model)
    log.info("GRPO scoring: " + ("each prompt held once, its completions after it (checked equal to scoring each "
                                 "alone)" if shared else "a prompt per completion (sharing did not check out on this "
                                 "model's attention path)"))
    return shared


def report_grpo_step(recipe, prepared, numbers: dict) -> None:
    """The numbers printed before the first step: what one optimizer step generates and trains on."""
    from finetune.recipe.methods import method_setting

    shape = step_shape(recipe, numbers["world_size"])
    completions = shape.prompts_per_step * shape.group
    mu = f", each generation used for {shape.iterations} optimizer steps" if shape.iterations > 1 else ""
    log.info(f"prompts: {prepared.stats['train']['examples']:,} train; each optimizer step: {shape.prompts_per_step} "
             f"prompt(s) x {shape.group} completions = {completions} completions of at most "
             f"{method_setting(recipe, 'max_completion_length')} tokens{mu}; {numbers['total_steps']} optimizer steps")
