"""axolotl's preference tuning: method.py (`rl:` and its settings), records.py (its preference dataset types)."""
