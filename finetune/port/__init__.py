"""Recipes from other tools, turned into finetune recipes (pure data and small functions; no torch)."""
