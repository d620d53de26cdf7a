"""GRPO: online RL with verifiable rewards (generation, rewards, advantages, loss)."""
