"""GRPO: online RL with rewards a program checks (generation, rewards, advantages, loss)."""
