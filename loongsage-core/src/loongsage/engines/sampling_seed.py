"""Per-request sampling seeds, and the uniform each sampled token is drawn with (torch-free).

A sampled token's randomness is a function of (the request's seed, the token's position in
the sequence) and of nothing else: not of the other requests sharing its decode batch, the
order they arrived in, the engine that ran it or how long that engine has been up. So a
request decoded alone, in a batch of 32, on another replica or after a restart samples the
same tokens from the same weights, and a partial rollout continued elsewhere (its prompt
then holds the tokens sampled so far) draws the same uniforms for its later positions.

* :func:`derive_seed` mixes any parts (the run's seed, the step, the prompt's source and
  index, the sample's index...) into a 63-bit seed with BLAKE2b, stable across processes and
  Python versions (``hash()`` is salted per process).
* :func:`token_uniform` is a counter-based generator: SplitMix64's finaliser (Steele, Lea &
  Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) applied to
  ``seed`` and ``position``, the same construction as the counter-based generators of Salmon
  et al. ("Parallel random numbers: as easy as 1, 2, 3", SC 2011) that cuRAND's Philox uses:
  no state to carry, any position reachable at once.

The seed travels as SGLang's ``sampling_params.sampling_seed`` (its deterministic-inference
field), so the same value reaches the SGLang engine where that backend is used.
"""

from __future__ import annotations

import hashlib

SEED_KEY = "sampling_seed"  # the sampling_params field (SGLang's name)
_MASK = (1 << 64) - 1


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (their ``repr`` joined): the same parts, the same seed."""
    digest = hashlib.blake2b("\x1f".join(repr(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def token_uniform(seed: int, position: int) -> float:
    """The uniform in [0, 1) of the token sampled at ``position`` under ``seed`` (53 bits)."""
    z = _mix64((seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK)
    return (_mix64(z ^ (position * 0xD1B54A32D192ED03 & _MASK)) >> 11) * (1.0 / (1 << 53))


def sample_seed(group_seed: int, index: int) -> int:
    """The seed of a group's ``index``-th sample (trajectory) from the group's seed."""
    return derive_seed(group_seed, index)
