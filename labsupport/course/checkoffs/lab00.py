"""Lab 00 checkoffs: the units every later number is written in (Lecture 2's 512 KiB per token)."""
from __future__ import annotations

from labsupport.course.checkoff import Mismatch, call, expect_close, function, value

value(
    "0.1", "512 KiB in bytes",
    expected=lambda: 512 * 2**10,
    hint="KiB is the binary kilobyte, 2**10 = 1,024 bytes; kB (and the GB on a GPU's box) is decimal, "
         "10**3 bytes. The lecture writes the 7B model's KV per token in KiB: multiply it out exactly, in Python, "
         "not in your head.",
    mistakes=[(512_000, "512,000 is 512 decimal kB; the lecture's unit is KiB.")],
    unit=" B",
)

# (layers, KV heads, head dim, bytes per element): the lecture's MHA 7B and its GQA-8 variant,
# Llama 3 70B's GQA, fp32 and fp8 caches, and shapes small enough to check by hand.
_SHAPES = [(32, 32, 128, 2), (32, 8, 128, 2), (80, 8, 128, 2), (32, 32, 128, 4), (32, 32, 128, 1),
           (1, 1, 1, 1), (2, 3, 5, 4), (24, 16, 64, 2)]


def _shape_cases(rng):
    hidden = [(rng.randint(1, 128), rng.randint(1, 96), rng.choice((8, 40, 64, 80, 96, 112, 128, 256)),
               rng.choice((1, 2, 4, 8))) for _ in range(6)]
    # K and V, every layer and KV head
    return [(shape, 2 * shape[0] * shape[1] * shape[2] * shape[3]) for shape in _SHAPES + hidden]


@function(
    "0.2", "KV bytes per token",
    hint="For every token the cache keeps, each layer stores one key vector and one value vector per KV head; "
         "each vector has head_dim elements of dtype_bytes bytes. Multiply the four counts you need — and "
         "remember there are two tensors, K and V.",
    cases=_shape_cases,
    forbid=("labsupport.ledger.kv_bytes_per_token", "labsupport.specs.ModelSpec"),
    derive="multiply the four counts and the two tensors yourself rather than asking labsupport's ModelSpec or ledger",
)
def _kv_bytes_per_token(fn, case):
    (layers, kv_heads, head_dim, dtype_bytes), want = case
    got = call(fn, layers, kv_heads, head_dim, dtype_bytes)
    if isinstance(got, float) and not got.is_integer():
        raise Mismatch(f"kv_bytes_per_token({layers}, {kv_heads}, {head_dim}, {dtype_bytes}) returned {got}: "
                       "a count of bytes is a whole number.")
    expect_close(got, want, f"kv_bytes_per_token(num_layers={layers}, num_kv_heads={kv_heads}, "
                            f"head_dim={head_dim}, dtype_bytes={dtype_bytes})")
