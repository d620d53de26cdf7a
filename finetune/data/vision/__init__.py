"""Vision-language data: images decoded for the processor (images.py)."""
