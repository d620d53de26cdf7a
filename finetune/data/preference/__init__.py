"""Preference records in the data stage: pairs.py (records -> prompt / chosen / rejected token ids), rows.py (rows
of pair ids into one token store, packed or not), collate.py (one collator for packed and unpacked pairs)."""
