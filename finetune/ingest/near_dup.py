"""Near-duplicate detection: MinHash over word 5-gram shingles with LSH banding.

64 hash functions in 16 bands of 4 rows: two records become candidates when one band matches, which
happens with probability 1 - (1 - J^4)^16 (about 0.92 at Jaccard J = 0.7, 0.999 at J = 0.85); a
candidate is a duplicate when its estimated Jaccard (share of equal MinHash values) reaches the threshold.
"""

from __future__ import annotations

import zlib

NUM_PERM = 64
BANDS = 16
ROWS = NUM_PERM // BANDS
SHINGLE_WORDS = 5
_PRIME = (1 << 61) - 1  # Mersenne prime: the universal-hash modulus


class NearDuplicateIndex:
    def __init__(self, threshold: float, seed: int = 1):
        import numpy as np

        self.np = np
        self.threshold = threshold
        rng = np.random.default_rng(seed)
        # a*x + b mod p with 32-bit x and a, b < 2^29 stays under 2^63: no overflow in uint64
        self.a = rng.integers(1, 1 << 29, NUM_PERM, dtype=np.uint64)
        self.b = rng.integers(0, 1 << 29, NUM_PERM, dtype=np.uint64)
        self.bands: list[dict[bytes, int]] = [{} for _ in range(BANDS)]
        self.signatures: list[bytes] = []

    def signature(self, text: str):
        np = self.np
        words = text.split()
        if len(words) < SHINGLE_WORDS:
            shingles = [" ".join(words)]
        else:
            shingles = [" ".join(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)]
        hashes = np.fromiter((zlib.crc32(s.encode()) for s in shingles), dtype=np.uint64, count=len(shingles))
        values = (hashes[:, None] * self.a[None, :] + self.b[None, :]) % _PRIME
        return values.min(axis=0).astype(np.uint32)

    def check_and_add(self, text: str) -> float | None:
        """The estimated similarity to an earlier near-duplicate (not added), or None (added)."""
        sig = self.signature(text)
        keys = [sig[i * ROWS : (i + 1) * ROWS].tobytes() for i in range(BANDS)]
        candidates = {self.bands[i][key] for i, key in enumerate(keys) if key in self.bands[i]}
        for idx in candidates:
            other = self.np.frombuffer(self.signatures[idx], dtype=self.np.uint32)
            similarity = float((other == sig).mean())
            if similarity >= self.threshold:
                return similarity
        idx = len(self.signatures)
        self.signatures.append(sig.tobytes())
        for i, key in enumerate(keys):
            self.bands[i].setdefault(key, idx)
        return None
