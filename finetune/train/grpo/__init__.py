"""GRPO: online RL with rewards a program checks (generation, rewards, advantages, loss).

    sampler.py     which prompts each step trains on: groups of G slots, mu repeats, whole groups per process
    step.py        one step's batch: generate -> rewards -> advantages -> old / reference log-probs -> micro batches
    generation.py  G completions per prompt through the model as it trains (adapter live, KV cache, seeded)
    scoring.py     completion log-probs in packed rows, each prompt held once
    rewards.py     the reward functions, run in worker processes with a timeout, failures counted, output capped
    reward_check.py  each reward run on a few records before a run (validate, preprocess), signatures checked
    advantages.py  group-relative advantages (TRL 1.16's, NaN-aware)
    loss.py        the clipped surrogate loss, normalized once per optimizer step (held equal to TRL 1.16's)
    trainer.py     GRPOTrainer: the HF Trainer through get_batch_samples / compute_loss / log
    setup.py       what run.py asks of a GRPO run
"""
