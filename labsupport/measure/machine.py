"""Your own machine's side of §10.5's break-even: host<->device copy bandwidth (a host memcpy, labelled as
such, where there is no device) and the tiny model's prefill rate.  `labsupport.viz.engine` draws the personal
break-even from them.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

from labsupport import ledger
from labsupport.checks import positive_int as _positive_int
from labsupport.specs import MiB


@dataclass(frozen=True)
class Bandwidth:
    """A measured copy rate.  `is_link` is False for a host memcpy standing in where there is no device."""

    label: str
    nbytes: int
    seconds: tuple[float, ...]
    is_link: bool

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / statistics.median(self.seconds)


def measure_copy_bandwidth(nbytes: int = 64 * MiB, repeats: int = 5, device=None) -> list[Bandwidth]:
    """Host→device and device→host over pinned memory on CUDA; on a machine without one there is no
    link to measure, so a host-to-host memcpy of the same size stands in (and says so)."""
    import torch

    nbytes = _positive_int("nbytes", nbytes)
    repeats = _positive_int("repeats", repeats)
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = nbytes // 4
    if dev.type == "cuda":
        host = torch.empty(n, dtype=torch.float32, pin_memory=True).fill_(1.0)
        gpu_buf = torch.empty(n, dtype=torch.float32, device=dev)
        out = []
        for label, dst, src in (("host→device (pinned)", gpu_buf, host), ("device→host (pinned)", host, gpu_buf)):
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(dev)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t)
            out.append(Bandwidth(label, n * 4, tuple(times), True))
        return out
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return [Bandwidth("host memcpy (no device: a stand-in, not a link)", n * 4, tuple(times), False)]


@dataclass(frozen=True)
class PrefillRate:
    """Measured prefill times of a model through a fresh paged cache, one per length (median of repeats)."""

    lengths: tuple[int, ...]
    seconds: tuple[float, ...]
    flops: tuple[float, ...]
    kv_bytes_per_token: int

    @property
    def flop_rates(self) -> tuple[float, ...]:
        return tuple(f / s for f, s in zip(self.flops, self.seconds))

    @property
    def tokens_per_s(self) -> tuple[float, ...]:
        return tuple(n / s for n, s in zip(self.lengths, self.seconds))

    def breakeven(self) -> tuple[float, ...]:
        """Personal W*(S): the KV round trip over the measured recompute time, 2 S kv / t(S)."""
        return tuple(2 * n * self.kv_bytes_per_token / s for n, s in zip(self.lengths, self.seconds))


def measure_prefill_rate(model, lengths: Sequence[int] = (64, 128, 256, 512), repeats: int = 3,
                         block_size: int = 16, seed: int = 0) -> PrefillRate:
    """Time the model's prefill (what a recompute redoes) at each length; FLOPs from the ledger's formula."""
    import torch

    from labsupport.kvcache import PagedKVCache

    lengths = tuple(_positive_int("length", n) for n in lengths)
    repeats = _positive_int("repeats", repeats)
    c = model.cfg
    g = torch.Generator().manual_seed(seed)
    spec = model.spec()
    secs = []
    for n in lengths:
        ids = torch.randint(0, c.vocab_size, (n,), generator=g).tolist()
        times = []
        for r in range(repeats + 1):  # the first run warms up
            cache = PagedKVCache(-(-n // block_size), block_size, c.num_layers, c.num_kv_heads, c.head_dim,
                                 dtype=model.dtype, device=model.device)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            t = time.perf_counter()
            model.forward_paged(cache, prefills=[(0, ids)])
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            if r:
                times.append(time.perf_counter() - t)
        secs.append(statistics.median(times))
    return PrefillRate(lengths, tuple(secs), tuple(ledger.prefill_flops(spec, n) for n in lengths),
                       spec.kv_bytes_per_token)
