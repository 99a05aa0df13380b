"""The argument checks of the paged-attention kernels (§10.3 step 3), apart from the kernels.

`labsupport.kernels` reads like a Triton tutorial — kernel, launcher, reference — because every check
of what a caller passes lives here: each runs before a launch, each message names the bad value and
what was expected, and nothing is launched or written when one fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_BLOCK_SIZE = 256
MAX_HEAD_DIM = 256
MAX_SPLITS = 256
# Grid axes 1 and 2 are limited to 65,535 programs on CUDA.
_MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Layout:
    batch: int
    num_kv_heads: int
    head_dim: int
    block_size: int  # tokens per block (paged) or S_max (contiguous)
    num_blocks: int
    num_q_heads: int = 0

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _require_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_common(tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        _require_tensor(name, t)
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first_device = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first_device:
            raise ValueError(f"all tensors must be on one device: {first_name} is on {first_device}, "
                             f"{name} is on {device}")
    if first_device.type == "meta":
        raise ValueError(f"{first_name} and the others are meta tensors (shapes with no data): the kernels read "
                         f"data; make them on 'cpu' or 'cuda'")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (got strides {tuple(t.stride())} for shape "
                             f"{tuple(t.shape)}); call .contiguous() first")


def _check_index_tensors(block_tables, seq_lens, batch: int | None = None) -> int:
    """Check the int32 block table [B, max_blocks] and seq_lens [B]; returns B (`batch` when the caller knows it)."""
    if block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32, got {block_tables.dtype}")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D [B, max_blocks], got shape {tuple(block_tables.shape)}")
    if batch is None:
        batch = block_tables.shape[0]
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [B={batch}, max_blocks], got shape {tuple(block_tables.shape)}")
    if seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32, got {seq_lens.dtype}")
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must be [B={batch}], got shape {tuple(seq_lens.shape)}")
    return batch


def _check_cache(name: str, cache: torch.Tensor) -> None:
    if cache.dim() != 4:
        raise ValueError(f"{name} must be [num_blocks, block_size, Hkv, D], got shape {tuple(cache.shape)}")
    if cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} dtype {cache.dtype} is not supported; use one of "
                         f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    if num_blocks < 1:
        raise ValueError(f"{name} has no blocks (shape {tuple(cache.shape)})")
    if not (_is_pow2(block_size) and block_size <= MAX_BLOCK_SIZE):
        raise ValueError(f"block_size (dim 1 of {name}) must be a power of two <= {MAX_BLOCK_SIZE}, got {block_size}")
    if num_kv_heads < 1 or num_kv_heads > _MAX_GRID_YZ:
        raise ValueError(f"Hkv (dim 2 of {name}) must be in 1..{_MAX_GRID_YZ}, got {num_kv_heads}")
    if not (_is_pow2(head_dim) and head_dim <= MAX_HEAD_DIM):
        raise ValueError(f"head dim (dim 3 of {name}) must be a power of two <= {MAX_HEAD_DIM}, got {head_dim}")


def _check_heads(num_q_heads: int, num_kv_heads: int) -> None:
    """GQA's grouping (§10.3 step 3): query head h reads KV head h // (Hq / Hkv), one grid row per query head."""
    if num_kv_heads < 1 or num_kv_heads > _MAX_GRID_YZ or num_q_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"Hq ({num_q_heads}) must be a positive multiple of Hkv ({num_kv_heads})")
    if num_q_heads > _MAX_GRID_YZ:
        raise ValueError(f"Hq must be <= {_MAX_GRID_YZ} (one grid row per query head in the split-K merge), "
                         f"got {num_q_heads}")


def _check_gpu_dtype(t: torch.Tensor, interpreting: bool) -> None:
    if t.device.type == "cuda" and t.dtype == torch.bfloat16 and not interpreting:
        major, minor = torch.cuda.get_device_capability(t.device)
        if major < 8:
            raise ValueError(f"bf16 needs an sm_80 (Ampere) or newer GPU; {torch.cuda.get_device_name(t.device)} "
                             f"is sm_{major}{minor}: use fp16 there")


def _check_lengths_and_blocks(block_tables, seq_lens, block_size: int, num_blocks: int, min_len: int) -> None:
    """The data-dependent checks: one device->host sync when all is well, details only on error."""
    max_blocks = block_tables.shape[1]
    capacity = max_blocks * block_size
    lens = seq_lens.long()
    bad_len = (lens < min_len) | (lens > capacity)
    needed = (lens + block_size - 1) // block_size  # table entries each sequence actually uses
    used = torch.arange(max_blocks, device=lens.device)[None, :] < needed[:, None]
    ids = block_tables.long()
    bad_id = used & ((ids < 0) | (ids >= num_blocks))
    any_bad_len, any_bad_id = torch.stack([bad_len.any(), bad_id.any()]).tolist()
    if any_bad_len:
        b = int(bad_len.nonzero()[0, 0])
        n = int(lens[b])
        if n < min_len:
            raise ValueError(f"seq_lens[{b}] = {n}: every sequence needs at least {min_len} token(s)")
        raise ValueError(f"seq_lens[{b}] = {n} exceeds the block table's capacity "
                         f"{max_blocks} blocks x {block_size} tokens = {capacity} tokens")
    if any_bad_id:
        b, j = (int(x) for x in bad_id.nonzero()[0])
        raise ValueError(f"block_tables[{b}, {j}] = {int(ids[b, j])} is outside the pool [0, {num_blocks}) "
                         f"(sequence {b} has {int(lens[b])} tokens, so its entries 0..{int(needed[b]) - 1} are read)")


def _check_out(out, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, min_dim1: int | None = None):
    if out is None:
        return
    _require_tensor("out", out)
    ok_shape = tuple(out.shape) == shape if min_dim1 is None else (
        out.dim() == len(shape) and out.shape[0] == shape[0] and out.shape[1] >= min_dim1
        and tuple(out.shape[2:]) == shape[2:])
    if not ok_shape:
        want = shape if min_dim1 is None else f"[{shape[0]}, >= {min_dim1}, {', '.join(map(str, shape[2:]))}]"
        raise ValueError(f"out must have shape {want}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"out must be {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"out must be on {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def _check_scale_splits(scale, num_splits, head_dim: int) -> float:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in 1..{MAX_SPLITS}, got {num_splits!r}")
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be a finite non-zero number, got {scale!r}")
    return float(scale)


def _check_tile(tile_tokens) -> None:
    if tile_tokens is not None and (isinstance(tile_tokens, bool) or not isinstance(tile_tokens, int)
                                    or not _is_pow2(tile_tokens) or not 16 <= tile_tokens <= 256):
        raise ValueError(f"tile_tokens must be a power of two in 16..256, got {tile_tokens!r}")


def _validate_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, validate: bool, interpreting: bool) -> Layout:
    _check_common({"q": q, "k_cache": k_cache, "v_cache": v_cache,
                   "block_tables": block_tables, "seq_lens": seq_lens})
    _check_cache("k_cache", k_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    if q.dim() != 3:
        raise ValueError(f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    batch, num_q_heads, q_dim = q.shape
    if q_dim != head_dim:
        raise ValueError(f"q head dim {q_dim} does not match the cache's head dim {head_dim}")
    _check_heads(num_q_heads, num_kv_heads)
    if batch > 2**31 - 1:
        raise ValueError(f"batch {batch} is too large for one launch")
    _check_index_tensors(block_tables, seq_lens, batch)
    _check_gpu_dtype(q, interpreting)
    if validate and batch:
        _check_lengths_and_blocks(block_tables, seq_lens, block_size, num_blocks, min_len=1)
    return Layout(batch, num_kv_heads, head_dim, block_size, num_blocks, num_q_heads)


# --- one check per launcher ----------------------------------------------------------------------

def check_gather(cache, block_tables, seq_lens, out, validate: bool) -> tuple[int, int, int, int]:
    """`paged_gather`'s arguments; returns the output's shape."""
    _check_common({"cache": cache, "block_tables": block_tables, "seq_lens": seq_lens})
    _check_cache("cache", cache)
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    batch = _check_index_tensors(block_tables, seq_lens)
    if batch > _MAX_GRID_YZ:
        raise ValueError(f"paged_gather launches one grid row per sequence: B must be <= {_MAX_GRID_YZ}, got {batch}")
    if validate and batch:
        _check_lengths_and_blocks(block_tables, seq_lens, block_size, num_blocks, min_len=0)
    if out is None:
        max_len = int(seq_lens.max()) if batch else 0
        return (batch, max_len, num_kv_heads, head_dim)
    out_shape = (batch, out.shape[1] if out.dim() == 4 else -1, num_kv_heads, head_dim)
    if validate and batch:
        _check_out(out, out_shape, cache.dtype, cache.device, min_dim1=int(seq_lens.max()))
    else:
        _check_out(out, out_shape, cache.dtype, cache.device)
    return out_shape


def check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, tile_tokens, out,
                          validate: bool, interpreting: bool) -> tuple[Layout, float]:
    """`paged_decode_attention`'s arguments; returns the layout and the scale to use."""
    layout = _validate_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, validate, interpreting)
    scale = _check_scale_splits(scale, num_splits, layout.head_dim)
    _check_tile(tile_tokens)
    _check_out(out, tuple(q.shape), q.dtype, q.device)
    return layout, scale


def check_contiguous_attention(q, k, v, seq_lens, scale, num_splits, tile_tokens, out, validate: bool,
                               interpreting: bool) -> tuple[Layout, float]:
    """`contiguous_decode_attention`'s arguments; returns the layout (S_max as its block) and the scale."""
    _check_common({"q": q, "k": k, "v": v, "seq_lens": seq_lens})
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"k and v must both be [B, S_max, Hkv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(f"q must be [B={k.shape[0]}, Hq, D], got shape {tuple(q.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q, k, v must share one of {SUPPORTED_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, s_max, num_kv_heads, head_dim = k.shape
    num_q_heads = q.shape[1]
    if q.shape[2] != head_dim or not (_is_pow2(head_dim) and head_dim <= MAX_HEAD_DIM):
        raise ValueError(f"head dim must be a power of two <= {MAX_HEAD_DIM} shared by q and k; "
                         f"got q {q.shape[2]}, k {head_dim}")
    _check_heads(num_q_heads, num_kv_heads)
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be int32 [B={batch}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    _check_gpu_dtype(q, interpreting)
    if validate and batch:
        lens = seq_lens.long()
        bad = (lens < 1) | (lens > s_max)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"seq_lens[{b}] = {int(lens[b])} must be in 1..S_max={s_max}")
    scale = _check_scale_splits(scale, num_splits, head_dim)
    _check_tile(tile_tokens)
    _check_out(out, tuple(q.shape), q.dtype, q.device)
    return Layout(batch, num_kv_heads, head_dim, s_max, batch, num_q_heads), scale


def check_offsets(block_tables, seq_lens, block_size, stride_block, stride_slot) -> int:
    """`kv_token_offsets`'s arguments that need no data; returns B."""
    _check_common({"block_tables": block_tables, "seq_lens": seq_lens})
    batch = _check_index_tensors(block_tables, seq_lens)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not _is_pow2(block_size) \
            or block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be a power of two <= {MAX_BLOCK_SIZE}, got {block_size!r}")
    for name, stride in (("stride_block", stride_block), ("stride_slot", stride_slot)):
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"{name} must be a positive int, got {stride!r}")
    return batch


def check_offset_lengths(block_tables, seq_lens, block_size: int, batch: int, probe_tile: int) -> int:
    """`kv_token_offsets`'s lengths, read off the data; returns max(seq_lens)."""
    max_len = int(seq_lens.max()) if batch else 0
    if (batch and int(seq_lens.min()) < 0) or max_len > block_tables.shape[1] * block_size:
        raise ValueError(f"seq_lens must be in 0..{block_tables.shape[1] * block_size}")
    if batch > 2**31 - 1 or -(-max_len // probe_tile) > _MAX_GRID_YZ:
        raise ValueError(f"kv_token_offsets launches one program per {probe_tile} tokens on grid axis 1: "
                         f"max(seq_lens) must be <= {probe_tile * _MAX_GRID_YZ}, got {max_len}")
    return max_len
