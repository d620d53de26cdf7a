"""Ingestion: raw files (HTML, CSV, SQL, record files) -> clean JSONL records. Never imports torch."""
