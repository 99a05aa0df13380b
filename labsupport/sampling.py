"""Sampling that never depends on batching or preemption (§10.5: preemption loses the cache, never tokens).

temperature 0 is greedy; otherwise a token is drawn by inverse CDF at a uniform number that depends
only on (request seed, branch, output position) — a counter-based generator with no state to carry —
so a swapped or recomputed sequence continues with exactly the tokens it would have produced, and
the n branches of one request (§10.4) diverge only because their branch numbers differ.
"""
from __future__ import annotations

from dataclasses import dataclass

from labsupport.checks import as_count, as_real, shown

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; otherwise softmax(logits / temperature) sampled with a counter-based
    uniform seeded by (seed, branch, output position).  seed None means the request id."""

    temperature: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        as_real("temperature", self.temperature, minimum=0)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {shown(self.seed)}")
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            raise ValueError(f"stop_token_ids must be a sequence of integer token ids, got {shown(stops)}")
        object.__setattr__(self, "stop_token_ids", tuple(as_count("stop token id", t, 0) for t in stops))


GREEDY = SamplingParams()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, branch: int, position: int) -> float:
    """A number in [0, 1) that depends only on its three arguments (no generator state to carry)."""
    x = _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ branch) ^ position)
    return (x >> 11) * (1.0 / (1 << 53))


def sample_token(logits, params: SamplingParams, seed: int, branch: int, position: int) -> int:
    """One token from a logits row [vocab]: argmax, or the inverse CDF at uniform(seed, branch, position)."""
    import torch

    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    u = uniform(seed, branch, position) * float(cdf[-1])
    return min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)), logits.numel() - 1)
