"""Lab 00 checkoffs: the units every later number is written in (Lecture 2's 512 KiB per token)."""
from __future__ import annotations

from labsupport.course.registry import case, function, givens, value

# The fallbacks (registry.Givens: for a draw that never differs) differ from every catalogue card's KV_KIB (specs.py's
# models hold 512, 320, 128 or 56 KiB a token), so that they serve whatever card course.toml names.
G = givens(hidden=lambda rng: dict(KV_KIB=rng.choice((64, 96, 128, 160, 192, 256, 320, 640, 1024, 1280))),
           fallbacks=(dict(KV_KIB=192), dict(KV_KIB=640)))

value(
    "0.1", "KV per token in bytes",
    expected=lambda g: g.KV_KIB * 2**10,
    hint="KiB is the binary kilobyte, 2**10 = 1,024 bytes; kB (and the GB on a GPU's box) is decimal, "
         "10**3 bytes. Multiply KV_KIB out exactly, in Python, not in your head.",
    mistakes=[(G.KV_KIB * 1000, "That reads KiB as the decimal kB, 1,000 bytes; a KiB is 2**10 = 1,024 bytes."),
              (G.KV_KIB * 2**20, "That is KV_KIB MiB (2**20 bytes each); the unit here is KiB, 2**10 bytes."),
              (G.KV_KIB * 2**10 * 8, "That is bits; the checkoff wants bytes.")],
    unit=" B",
)

# (layers, KV heads, head dim, bytes per element): the lecture's models, fp32 and fp8, and hand-sized shapes
_SHAPES = [(32, 32, 128, 2), (32, 8, 128, 2), (80, 8, 128, 2), (32, 32, 128, 4), (32, 32, 128, 1),
           (1, 1, 1, 1), (2, 3, 5, 4), (24, 16, 64, 2)]


def _slips(layers, kv_heads, head_dim, dtype_bytes) -> list[tuple[int, str]]:
    """What a wrong count left out, naming every reading a number fits (at 2 bytes an element two coincide)."""
    readings = [(layers * kv_heads * head_dim * dtype_bytes,
                 "one tensor's bytes: every layer keeps a key vector and a value vector, two tensors"),
                (2 * kv_heads * head_dim * dtype_bytes, "one layer's K and V: every layer keeps its own"),
                (2 * layers * kv_heads * head_dim,
                 "the elements without their bytes: each element is dtype_bytes bytes")]
    want = 2 * layers * kv_heads * head_dim * dtype_bytes
    counts = dict.fromkeys(count for count, _ in readings if count != want)
    return [(count, "That is " + "; or ".join(text for c, text in readings if c == count) + ".") for count in counts]


@function(
    "0.2", "KV bytes per token",
    hint="For every token the cache keeps, each layer stores one key vector and one value vector per KV head; "
         "each vector has head_dim elements of dtype_bytes bytes. Count them all, in bytes.",
    forbid=("labsupport.ledger.kv_bytes_per_token", "labsupport.specs.ModelSpec"),
    derive="multiply the four counts and the two tensors yourself rather than asking labsupport's ModelSpec or ledger",
    name="kv_bytes_per_token",
)
def _kv_bytes_per_token(rng):
    hidden = [(rng.randint(1, 128), rng.randint(1, 96), rng.choice((8, 40, 64, 80, 96, 112, 128, 256)),
               rng.choice((1, 2, 4, 8))) for _ in range(6)]
    for layers, kv_heads, head_dim, dtype_bytes in _SHAPES + hidden:
        yield case(layers, kv_heads, head_dim, dtype_bytes, want=2 * layers * kv_heads * head_dim * dtype_bytes,
                   whole=True, mistakes=_slips(layers, kv_heads, head_dim, dtype_bytes),
                   what=f"kv_bytes_per_token(num_layers={layers}, num_kv_heads={kv_heads}, head_dim={head_dim}, "
                        f"dtype_bytes={dtype_bytes})")
