"""GRPO in the data stage: prompts.py (prompt records -> prompt token ids, each with its record for the rewards)."""
