"""Deterministic random sub-streams and identifiers.

Every source of randomness in the simulator is its own PCG64 stream derived from the run's seed
and a name, so adding a fault to a scenario does not shift the noise of the rest of the fleet (two
scenarios run with the same seed share the same baseline, which makes A/B comparisons exact).
Names are turned into integers with CRC-32 and SHA-256, never Python's salted ``hash()``.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np


def _key(part: object) -> int:
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool):
        return int(part) & 0xFFFFFFFF
    return zlib.crc32(str(part).encode("utf-8"))


def substream(seed: int, *names: object) -> np.random.Generator:
    """A generator for one named purpose of one run: same seed and names, same numbers."""
    entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, *(_key(n) for n in names)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def stable_hex(*parts: object, n: int) -> str:
    """``n`` hex digits that depend only on ``parts`` (SHA-256 of their text)."""
    text = "/".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def gpu_uuid(seed: int, host: str, gpu: int) -> str:
    """A deterministic ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` for one simulated GPU."""
    h = stable_hex("gpu-uuid", seed, host, gpu, n=32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def comm_id(seed: int, job: str, name: str) -> str:
    """A deterministic NCCL communicator id, ``0x`` + 14 hex digits like the Inspector prints."""
    return "0x" + stable_hex("nccl-comm", seed, job, name, n=14)
