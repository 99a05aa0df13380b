"""Triton kernels for a paged KV cache: gather through the block table, and decode attention.

Lecture 10, §10.3 step three ("the cost did not vanish, it moved into the kernel") and §10.7's
first row ("achieved bandwidth on an indirect access").  The pool layout is the paged cache's:
``k_cache``/``v_cache`` are ``[num_blocks, block_size, Hkv, D]`` and a sequence's logical block
``j`` lives in physical block ``block_tables[seq, j]``.

What is here
------------
``paged_gather``                      copy each sequence's tokens out of the pool into a contiguous
                                      ``[B, S, Hkv, D]`` buffer (bytes in = bytes out: the cleanest
                                      measurement of what the indirection costs).
``paged_decode_attention``            one decode token per sequence attends to its paged K/V:
                                      MHA and GQA, online softmax in fp32, optional split-K
                                      (flash-decoding) with a merge kernel.
``contiguous_decode_attention``       the *same* kernel body reading ``[B, S_max, Hkv, D]`` with plain
                                      strides instead of the block table: the honest baseline,
                                      because only the address computation differs.
``gather_then_attend``                the naive way: ``paged_gather`` K and V, then attend contiguously.
``paged_decode_attention_reference``  plain torch, fp32 softmax, written without the kernels.
``paged_decode_attention_torch``      the whole batch in a few torch calls (sequences of similar length
                                      together: one gather through the block table per pool, then torch's
                                      fused attention): what a model runs on a CPU, where the interpreted
                                      kernel is far too slow.
``kv_token_offset``                   the block-table lookup itself (a ``@triton.jit`` helper), and
``kv_token_offsets``                  a launcher that evaluates it for inspection.

Every argument check of these launchers lives in ``labsupport.kernel_args``: here, each kernel is
followed by its launcher and, last, the plain-torch references the tests compare against.

The block-table indexing, line by line (``kv_token_offset``)
-------------------------------------------------------------
Every kernel here finds a token's keys the same way; it is the one line §10.3 adds to attention::

    logical_block  = token // BLOCK_SIZE                                        # (1)
    physical_block = tl.load(table_row + logical_block, mask=valid, other=0)    # (2)
    slot           = token % BLOCK_SIZE                                         # (3)
    offset         = physical_block.to(tl.int64) * stride_block + slot.to(tl.int64) * stride_slot  # (4)

(1) A sequence's tokens are numbered 0..seq_len-1 in *logical* order.  Token ``t`` is in the
    sequence's ``t // BLOCK_SIZE``-th block — the index into its block table.
(2) The block table maps that logical block to a *physical* block of the shared pool.  This load
    is the indirection: the address of the keys depends on data read from memory, so the kernel
    cannot know where to read until it has read the table.  ``valid`` is ``token < seq_len``, so
    table entries past a sequence's last block are never read (they may hold anything, e.g.
    padding), and masked lanes get block 0, an address that is then never dereferenced.
(3) Within a block, tokens are stored in order, so the position inside it is ``t % BLOCK_SIZE``.
(4) The element offset of that token's row for head 0, dimension 0.  ``stride_block`` is
    ``block_size * Hkv * D`` and ``stride_slot`` is ``Hkv * D`` (elements).  The block id is
    widened to int64 *before* the multiply: with int32 arithmetic a pool of more than
    2**31 / stride_block blocks (131,072 blocks at block 16, Hkv 8, D 128: 4.3 GB of bf16 K)
    would wrap to a negative offset and read someone else's memory.  For the contiguous pools
    used here this is ``(physical_block * block_size + slot) * Hkv * D``: the token's pool slot
    number — the same ``slot = block_id * block_size + offset`` the allocator's slot_mapping
    hands out — times the elements per slot.
The attention kernel then adds ``kv_head * stride_head + d`` to reach one head's D contiguous
values; the gather kernel copies the token's whole ``Hkv * D`` row from there.

A lab can show this helper (``inspect.getsource(kv_token_offset.fn)``) and replace it: the
``token_offset_fn=`` argument of ``paged_gather`` and ``paged_decode_attention`` recompiles the
kernels with a student's own ``@triton.jit`` function in its place (same signature).

Design notes (why, not what)
----------------------------
* The kernels walk a sequence in tiles of ``TILE`` tokens chosen independently of the block
  size, and look the block up per token.  A tile may span several small blocks or a fraction of
  a large one; either way each token's D values are one contiguous row.  So the block size
  changes how many table entries are read, not the shape of the work — which is what the
  benchmark then measures (FlashInfer's question: which of §10.3's trade-offs a good kernel
  makes irrelevant).  ``tile_tokens=`` overrides the choice, e.g. to make a tile equal one block.
* GQA: one program owns one (sequence, KV head) pair and all ``G = Hq / Hkv`` query heads that
  read it, so a K/V tile is loaded once and used G times.  For G > 1 the scores are a
  ``tl.dot`` of ``[G_PAD, D] x [D, TILE]`` with the group padded to 16 rows (tl.dot needs every
  dimension >= 16; padded rows are masked out of the store).  For MHA (G = 1), or D < 16, the
  kernel uses a broadcast multiply and ``tl.sum`` instead: no tensor-core padding is wasted.
* Online softmax in fp32 with ``exp2`` (log2(e) folded into the scale), so no pass over the
  scores is needed and any sequence length fits in registers.
* Split-K (flash-decoding, Dao et al. 2023): at small batch a sequence's tokens are cut into
  ``num_splits`` ranges handled by separate programs, each writing an unnormalised partial
  output with its running max and sum; a merge kernel rescales and combines them.  With
  ``num_splits=1`` the single program normalises and writes the output itself.

Hardware and dtype notes
------------------------
* fp16, bf16 and fp32 inputs; accumulation is always fp32.  fp32 ``tl.dot`` uses
  ``input_precision="ieee"`` (not TF32), so fp32 results match the reference to ~1e-6.
* Compiled on CUDA (Ampere sm_80 and newer for bf16).  **On a T4 (sm_75) bf16 is unsupported —
  use fp16**; the wrapper raises a ValueError for bf16 on GPUs older than sm_80.  On sm_75 Triton
  lowers even fp16 ``tl.dot`` to fp32 FMAs (no tensor cores), as it does fp32 "ieee" dots
  everywhere; those kernels take smaller tiles so they stay within registers (``_attention_tile``).
* tests/test_kernels_compile.py compiles the kernels for sm_75/80/90 on a machine without a GPU
  (Triton's own CUDA pipeline and the ptxas inside its wheel) and checks for register spills and
  16-byte loads — what the interpreter cannot see.
* Without a GPU the same kernels run on CPU tensors through Triton's interpreter
  (``TRITON_INTERPRET=1``, which ``import labsupport`` sets before triton is imported).  Two
  interpreter limitations are worked around: its ``tl.dot`` multiplies bf16 *bit patterns*
  (triton-lang/triton#11584), so under the interpreter bf16 dot operands are upcast to fp32;
  and it truncates fp32 -> bf16 on store instead of rounding to nearest (error <= 1 bf16 ulp).
  Interpreted programs use larger tiles than compiled ones (each interpreted op costs Python
  time); the tile size changes the schedule, never the result.
* Where triton is not importable at all (macOS), or tensors sit on a device the kernels cannot
  run on, every call falls back to the torch reference with a one-time warning naming why.
"""
from __future__ import annotations

import types
import warnings
from dataclasses import dataclass

import torch

from labsupport import kernel_args as args
from labsupport.kernel_args import MAX_BLOCK_SIZE, MAX_SPLITS, SUPPORTED_DTYPES  # noqa: F401  (public names)

try:  # `import labsupport` (our package __init__) has already set TRITON_INTERPRET when needed
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # ImportError on macOS/Windows; anything else a broken install raises
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = [
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "paged_decode_attention_torch",
    "length_groups",
    "paged_gather",
    "paged_gather_reference",
    "contiguous_decode_attention",
    "contiguous_decode_attention_reference",
    "gather_then_attend",
    "kv_token_offset",
    "kv_token_offsets",
    "suggest_num_splits",
    "default_tile",
    "backend_status",
    "interpreter_active",
    "SUPPORTED_DTYPES",
]

_LOG2E = 1.4426950408889634
_PROBE_TILE = 64  # tokens per program of kv_token_offsets


# --------------------------------------------------------------------------------------------
# The Triton kernels (defined only when triton imports)
# --------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def kv_token_offset(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
        """Element offset of each token's K/V row (head 0, dim 0) in a paged pool.

        table_row: pointer to this sequence's block-table row (int32 entries).
        token:     int32 tensor of logical token positions (0-based, in sequence order).
        valid:     mask; False lanes read no table entry (their offset is meaningless).
        Returns an int64 tensor shaped like ``token``.  See the module docstring, steps (1)-(4).
        """
        logical_block = token // BLOCK_SIZE
        physical_block = tl.load(table_row + logical_block, mask=valid, other=0)
        slot = token % BLOCK_SIZE
        return physical_block.to(tl.int64) * stride_block + slot.to(tl.int64) * stride_slot

    @triton.jit
    def _token_offset_probe_kernel(
        table_ptr, seq_lens_ptr, out_ptr, stride_table, stride_block, stride_slot, max_tokens,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    ):
        # Evaluates kv_token_offset for every (sequence, token) without touching a cache: what
        # the lab uses to show the addresses, and what the int64-overflow test inspects.
        seq = tl.program_id(0)
        tile = tl.program_id(1)
        seq_len = tl.load(seq_lens_ptr + seq)
        token = tile * TILE + tl.arange(0, TILE)
        valid = token < seq_len
        table_row = table_ptr + seq.to(tl.int64) * stride_table
        offset = kv_token_offset(table_row, token, valid, BLOCK_SIZE, stride_block, stride_slot)
        offset = tl.where(valid, offset, -1)
        tl.store(out_ptr + seq.to(tl.int64) * max_tokens + token, offset, mask=token < max_tokens)

    @triton.jit
    def _paged_gather_kernel(
        cache_ptr, table_ptr, seq_lens_ptr, out_ptr,
        out_len, row_elems,
        stride_block, stride_slot,
        stride_table,
        stride_out_seq, stride_out_tok,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, COLS: tl.constexpr,
    ):
        # One program copies TILE tokens x COLS elements of their rows.  A token's row (all Hkv
        # heads x D) is contiguous in the pool and in the output, so every load and store is a
        # run of COLS contiguous elements.  Positions at or beyond seq_len are written as zeros
        # so the whole output is defined.
        tile = tl.program_id(0)
        seq = tl.program_id(1)
        chunk = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + seq)
        token = tile * TILE + tl.arange(0, TILE)
        cols = chunk * COLS + tl.arange(0, COLS)
        col_ok = cols < row_elems
        valid = token < seq_len
        table_row = table_ptr + seq.to(tl.int64) * stride_table
        src = kv_token_offset(table_row, token, valid, BLOCK_SIZE, stride_block, stride_slot)
        rows = tl.load(cache_ptr + src[:, None] + cols[None, :], mask=valid[:, None] & col_ok[None, :], other=0.0)
        dst = seq.to(tl.int64) * stride_out_seq + token.to(tl.int64) * stride_out_tok
        tl.store(out_ptr + dst[:, None] + cols[None, :], rows, mask=(token < out_len)[:, None] & col_ok[None, :])

    @triton.jit
    def _decode_attention_kernel(
        q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
        qk_scale,  # softmax scale * log2(e): scores are kept in base-2 units for exp2
        num_q_heads,
        stride_q_seq, stride_q_head,
        stride_kv_outer, stride_kv_tok, stride_kv_head,  # PAGED: block/slot/head, else seq/token/head
        stride_table,
        stride_out_seq, stride_out_head,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
        NUM_SPLITS: tl.constexpr, SPLIT: tl.constexpr,
        PAGED: tl.constexpr, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + seq)

        # This program's token range.  Splits get whole tiles so no tile straddles two programs;
        # trailing splits of a short sequence may be empty and then write (m=-inf, l=0, acc=0).
        if SPLIT:
            tokens_per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE) * TILE
            start = split * tokens_per_split
            end = tl.minimum(start + tokens_per_split, seq_len)
        else:
            start = 0
            end = seq_len

        # The G query heads that share this KV head: rows kv_head*G .. kv_head*G + G-1.
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < GROUP
        q_head = kv_head * GROUP + rows
        q = tl.load(q_ptr + seq.to(tl.int64) * stride_q_seq + q_head[:, None] * stride_q_head + dims[None, :],
                    mask=row_ok[:, None], other=0.0)
        if DOT_FP32 or not USE_DOT:
            q = q.to(tl.float32)

        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max (base-2 units)
        l_i = tl.zeros([GROUP_PAD], tl.float32)                # running sum of exp2(s - m_i)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)      # running sum of p * V
        table_row = table_ptr + seq.to(tl.int64) * stride_table
        head_offset = kv_head.to(tl.int64) * stride_kv_head

        for tile_start in range(start, end, TILE):
            token = tile_start + tl.arange(0, TILE)
            valid = token < end
            if PAGED:
                row = kv_token_offset(table_row, token, valid, BLOCK_SIZE, stride_kv_outer, stride_kv_tok)
            else:
                row = seq.to(tl.int64) * stride_kv_outer + token.to(tl.int64) * stride_kv_tok
            kv_offset = row[:, None] + head_offset + dims[None, :]
            k = tl.load(k_ptr + kv_offset, mask=valid[:, None], other=0.0)

            if USE_DOT:
                if DOT_FP32:
                    s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
            else:
                s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]

            v = tl.load(v_ptr + kv_offset, mask=valid[:, None], other=0.0)
            if USE_DOT:
                if DOT_FP32:
                    acc += tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    acc += tl.dot(p.to(v.dtype), v)
            else:
                acc += tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            m_i = m_new

        if SPLIT:
            # Partials: acc [B, Hq, NUM_SPLITS, D] and (m, l) [B, Hq, NUM_SPLITS, 2], fp32.
            part = (seq.to(tl.int64) * num_q_heads + q_head) * NUM_SPLITS + split
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_ok[:, None])
            tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
            tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
        else:
            out = acc / l_i[:, None]
            out_offset = seq.to(tl.int64) * stride_out_seq + q_head[:, None] * stride_out_head + dims[None, :]
            tl.store(out_ptr + out_offset, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])

    @triton.jit
    def _merge_splits_kernel(
        part_acc_ptr, part_ml_ptr, out_ptr, num_q_heads, stride_out_seq, stride_out_head,
        NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        # out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s with M = max_s m_s; empty splits
        # carry m = -inf and so weigh exactly zero.
        seq = tl.program_id(0)
        q_head = tl.program_id(1)
        splits = tl.arange(0, SPLITS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        ok = splits < NUM_SPLITS
        part = (seq.to(tl.int64) * num_q_heads + q_head) * NUM_SPLITS + splits
        m = tl.load(part_ml_ptr + part * 2, mask=ok, other=float("-inf"))
        l = tl.load(part_ml_ptr + part * 2 + 1, mask=ok, other=0.0)
        acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=ok[:, None], other=0.0)
        weight = tl.exp2(m - tl.max(m, axis=0))
        out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
        out_offset = seq.to(tl.int64) * stride_out_seq + q_head * stride_out_head + dims
        tl.store(out_ptr + out_offset, out.to(out_ptr.dtype.element_ty))

    # Kernels are InterpretedFunction objects when TRITON_INTERPRET was set at import time.
    _INTERPRETING = type(_paged_gather_kernel).__name__ == "InterpretedFunction"
else:
    kv_token_offset = None
    _INTERPRETING = False


# --------------------------------------------------------------------------------------------
# Backend selection and the one-time fallback warning
# --------------------------------------------------------------------------------------------
_WARNED: set[str] = set()


def backend_status(device: torch.device | str = "cpu") -> str | None:
    """None when the Triton kernels can run on tensors on ``device``, else the reason they cannot."""
    device = torch.device(device)
    if triton is None:
        return f"triton is not importable ({_TRITON_IMPORT_ERROR})"
    if device.type == "cuda" or (device.type == "cpu" and _INTERPRETING):
        return None
    if device.type == "cpu":
        return ("the tensors are on the CPU but triton was imported without TRITON_INTERPRET=1 "
                "(import labsupport before triton, or set TRITON_INTERPRET=1)")
    return f"the kernels do not run on {device.type!r} tensors"


def _fallback_reason(device: torch.device) -> str | None:
    reason = backend_status(device)
    if reason is not None and reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"labsupport.kernels: using the torch reference instead of the Triton kernels: {reason}",
                      RuntimeWarning, stacklevel=3)
    return reason


# --------------------------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------------------------
_VARIANTS: dict[tuple, object] = {}


def _kernel(base, token_offset_fn):
    """``base`` itself, or a copy compiled with ``token_offset_fn`` standing in for kv_token_offset."""
    if token_offset_fn is None:
        return base
    if not callable(getattr(token_offset_fn, "fn", None)):
        raise ValueError("token_offset_fn must be a @triton.jit function with kv_token_offset's signature")
    key = (base, token_offset_fn)
    if key not in _VARIANTS:
        fn = base.fn
        scope = dict(fn.__globals__, kv_token_offset=token_offset_fn)
        clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        clone.__module__, clone.__qualname__, clone.__doc__ = fn.__module__, fn.__qualname__, fn.__doc__
        # FunctionType does not copy annotations, and `BLOCK_SIZE: tl.constexpr` lives there: without
        # them the compiler takes every constexpr for a runtime argument (tl.arange(0, TILE) then
        # fails to compile on a GPU, while the interpreter, which sees plain ints, does not notice).
        clone.__annotations__ = dict(fn.__annotations__)
        clone.__kwdefaults__ = fn.__kwdefaults__
        _VARIANTS[key] = triton.jit(clone)
    return _VARIANTS[key]


def _device_guard(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.device.type == "cuda" else _NullContext()


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# Work per program.  On a GPU a tile must fit in registers; under the interpreter every loop
# iteration costs Python time (each call of the kv_token_offset helper alone re-patches triton's
# language module, ~3 ms), so there fewer, larger tiles are faster.  Results do not depend on it.
_TILE_ELEMS = 1 << 16 if _INTERPRETING else 1 << 13


def _attention_tile(head_dim: int, use_dot: bool, fma_dot: bool = False) -> int:
    """Tokens per loop iteration of the attention kernel, sized so a program's tiles fit in registers.

    Budgets (elements of one K tile) were set by compiling for sm_75/80/90 and reading ptxas's
    register counts (tests/test_kernels_compile.py keeps them spill-free):
    * tensor-core ``tl.dot`` (fp16/bf16 on sm_80+): 8K, i.e. 64 tokens up to D=128 (~110 registers);
    * the broadcast path (MHA) materialises ``[G_PAD, TILE, D]`` fp32 products: 4K (D=128: 32 tokens,
      ~80 registers; 64 tokens needed 140-255);
    * an FMA ``tl.dot`` — fp32 with ``input_precision="ieee"``, or any dot before sm_80, where Triton
      lowers fp16 dots to fp32 FMAs too — holds ``[16, D]`` operands per thread: 2K (64 tokens at
      D=128 spilled to the stack on sm_75 and, for fp32, on sm_80).
    ``tl.dot`` needs TILE >= 16, so 16 is the floor.  The interpreter takes larger tiles (fewer
    Python-level iterations); the tile changes the schedule, never the result.
    """
    if _INTERPRETING:
        return max(16, min(256, (_TILE_ELEMS if use_dot or head_dim <= 128 else _TILE_ELEMS // 2) // head_dim))
    budget = (_TILE_ELEMS // 4) if (use_dot and fma_dot) else _TILE_ELEMS if use_dot else _TILE_ELEMS // 2
    return max(16, min(64, budget // head_dim))


def _uses_dot(group: int, head_dim: int) -> bool:
    return group > 1 and head_dim >= 16


def _fma_dot(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """Whether a ``tl.dot`` in this dtype compiles to FMAs rather than tensor-core MMAs."""
    return dtype == torch.float32 or (capability is not None and tuple(capability) < (8, 0))


def default_tile(dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 capability: tuple[int, int] | None = None) -> int:
    """Tokens per loop iteration the attention kernels pick for these shapes on a GPU of ``capability``."""
    use_dot = _uses_dot(num_q_heads // num_kv_heads, head_dim)
    return _attention_tile(head_dim, use_dot, _fma_dot(dtype, capability))


def _gather_tile(row_elems: int) -> tuple[int, int]:
    """(tokens, row elements) per gather program: whole rows up to 2K (16K interpreted) elements."""
    cols = min(triton.next_power_of_2(row_elems), _TILE_ELEMS // 4)
    return max(2, min(256, _TILE_ELEMS // cols)), cols


def suggest_num_splits(batch: int, num_kv_heads: int, seq_len: int, num_sms: int, tile: int = 64) -> int:
    """Split-K factor that gives about two programs per SM, keeping >= 4 tiles of work per split."""
    programs = max(1, batch * num_kv_heads)
    if programs >= num_sms:
        return 1
    wanted = -(-2 * num_sms // programs)
    most = max(1, seq_len // (4 * tile))
    return int(max(1, min(wanted, most, MAX_SPLITS)))


@dataclass
class _Launch:
    """One kernel launch, described before it happens: the kernel, its grid and its arguments.

    The wrappers build these and run them; the offline compile check (tests/test_kernels_compile.py)
    builds the same ones and compiles them for sm_75/80/90 without a GPU, so what it compiles is
    exactly what a student's launch would.
    """
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


def _attention_launches(q, k, v, block_tables, seq_lens, out, layout: args.Layout, scale: float, num_splits: int,
                        paged: bool, tile_tokens=None, use_dot=None, force_split=False,
                        token_offset_fn=None, capability: tuple[int, int] | None = None) -> list[_Launch]:
    """The launches for one attention call.  ``capability`` (major, minor) is the GPU the kernels
    will run on; by default that of ``q``'s device (the offline compile check passes its target's)."""
    batch, group, head_dim = layout.batch, layout.group, layout.head_dim
    if use_dot is None:
        use_dot = _uses_dot(group, head_dim)
    if capability is None and q.device.type == "cuda":
        capability = torch.cuda.get_device_capability(q.device)
    group_pad = max(16, triton.next_power_of_2(group)) if use_dot else triton.next_power_of_2(group)
    tile = tile_tokens or _attention_tile(head_dim, use_dot, _fma_dot(q.dtype, capability))
    dot_fp32 = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and _INTERPRETING)
    split = force_split or num_splits > 1
    if split:
        part_acc = torch.empty(batch, layout.num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(batch, layout.num_q_heads, num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused by the unsplit kernel
    kernel = _kernel(_decode_attention_kernel, token_offset_fn) if paged else _decode_attention_kernel
    table = block_tables if paged else seq_lens  # any int32 pointer; the contiguous path never reads it
    launches = [_Launch(
        kernel, (batch, layout.num_kv_heads, num_splits),
        (q, k, v, table, seq_lens, out, part_acc, part_ml,
         scale * _LOG2E, layout.num_q_heads,
         q.stride(0), q.stride(1),
         k.stride(0), k.stride(1), k.stride(2),
         block_tables.stride(0) if paged else 0,
         out.stride(0), out.stride(1)),
        dict(GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
             BLOCK_SIZE=layout.block_size if paged else 1, TILE=tile,
             NUM_SPLITS=num_splits, SPLIT=split, PAGED=paged, USE_DOT=use_dot, DOT_FP32=dot_fp32,
             num_warps=4),
    )]
    if split:
        launches.append(_Launch(
            _merge_splits_kernel, (batch, layout.num_q_heads),
            (part_acc, part_ml, out, layout.num_q_heads, out.stride(0), out.stride(1)),
            dict(NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
                 num_warps=4),
        ))
    return launches


def _launch_attention(q, k, v, block_tables, seq_lens, out, layout: args.Layout, scale: float, num_splits: int,
                      paged: bool, tile_tokens=None, use_dot=None, force_split=False, token_offset_fn=None):
    launches = _attention_launches(q, k, v, block_tables, seq_lens, out, layout, scale, num_splits, paged,
                                   tile_tokens, use_dot, force_split, token_offset_fn)
    with _device_guard(q):
        for launch in launches:
            launch()
    return out


def _gather_launch(cache, block_tables, seq_lens, out, token_offset_fn=None) -> _Launch:
    batch, out_len, num_kv_heads, head_dim = out.shape
    row_elems = num_kv_heads * head_dim
    tile, cols = _gather_tile(row_elems)
    return _Launch(
        _kernel(_paged_gather_kernel, token_offset_fn),
        (triton.cdiv(out_len, tile), batch, triton.cdiv(row_elems, cols)),
        (cache, block_tables, seq_lens, out, out_len, row_elems,
         cache.stride(0), cache.stride(1),
         block_tables.stride(0),
         out.stride(0), out.stride(1)),
        dict(BLOCK_SIZE=cache.shape[1], TILE=tile, COLS=cols, num_warps=4),
    )


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
def paged_gather(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, *,
                 out: torch.Tensor | None = None, validate: bool = True, token_offset_fn=None) -> torch.Tensor:
    """Copy each sequence's tokens out of the paged pool into a contiguous ``[B, S, Hkv, D]`` buffer.

    cache: ``[num_blocks, block_size, Hkv, D]``; block_tables: int32 ``[B, max_blocks]``;
    seq_lens: int32 ``[B]`` (0 allowed).  ``S = max(seq_lens)`` unless ``out`` is given, in which
    case ``out`` may be longer (``[B, S_out >= max(seq_lens), Hkv, D]``).  Row ``b`` holds the
    sequence's tokens in logical order, then zeros from ``seq_lens[b]`` on.

    Token ``t`` of sequence ``b`` is read from ``cache[block_tables[b, t // block_size], t % block_size]``
    — ``kv_token_offset`` computes exactly that address.  ``validate=False`` skips the
    data-dependent checks (lengths, block ids), which cost a device->host sync.
    """
    out_shape = args.check_gather(cache, block_tables, seq_lens, out, validate)
    if _fallback_reason(cache.device) is not None:
        result = paged_gather_reference(cache, block_tables, seq_lens, out_len=out_shape[1])
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty(out_shape, dtype=cache.dtype, device=cache.device)
    if out.numel() == 0:
        return out
    launch = _gather_launch(cache, block_tables, seq_lens, out, token_offset_fn)
    with _device_guard(cache):
        launch()
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                           num_splits: int = 1, *, out: torch.Tensor | None = None, validate: bool = True,
                           tile_tokens: int | None = None, token_offset_fn=None) -> torch.Tensor:
    """Decode attention over a paged KV cache: ``out[b, h] = softmax(scale * q[b, h] K_b^T) V_b``.

    q: ``[B, Hq, D]`` (one new token per sequence); k_cache, v_cache: ``[num_blocks, block_size, Hkv, D]``;
    block_tables: int32 ``[B, max_blocks]``; seq_lens: int32 ``[B]``, each in 1..max_blocks*block_size.
    Query head ``h`` reads KV head ``h // (Hq / Hkv)`` (GQA; MHA when Hq == Hkv).  ``scale``
    defaults to ``D ** -0.5``.  Returns ``out`` ``[B, Hq, D]`` in q's dtype.

    Sequence ``b`` reads only table entries ``0 .. ceil(seq_lens[b] / block_size) - 1`` and only
    the first ``seq_lens[b]`` slots of them; other entries and slots are never read.
    ``num_splits > 1`` runs the split-K (flash-decoding) kernel plus a merge; ``num_splits=1``
    is the single-pass kernel.  ``validate=False`` skips the data-dependent checks (a host
    sync): only for callers that have already validated the same tables, such as benchmarks.
    ``tile_tokens`` overrides the tokens per loop iteration (power of two, 16..256).
    """
    layout, scale = args.check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits,
                                               tile_tokens, out, validate, _INTERPRETING)
    if _fallback_reason(q.device) is not None:
        result = paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale)
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty_like(q)
    if layout.batch == 0:
        return out
    return _launch_attention(q, k_cache, v_cache, block_tables, seq_lens, out, layout, scale, num_splits,
                             paged=True, tile_tokens=tile_tokens, token_offset_fn=token_offset_fn)


def contiguous_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                                scale: float | None = None, num_splits: int = 1, *,
                                out: torch.Tensor | None = None, validate: bool = True,
                                tile_tokens: int | None = None) -> torch.Tensor:
    """Decode attention over a reserve-to-max cache ``k``, ``v``: ``[B, S_max, Hkv, D]``.

    The same Triton kernel as ``paged_decode_attention`` with its address line replaced by
    ``seq * stride_seq + token * stride_token``: no table, no indirection.  Comparing the two is
    a measurement of what the block table costs and nothing else.  seq_lens: int32 ``[B]``,
    each in 1..S_max.
    """
    layout, scale = args.check_contiguous_attention(q, k, v, seq_lens, scale, num_splits, tile_tokens, out, validate,
                                                    _INTERPRETING)
    if _fallback_reason(q.device) is not None:
        result = contiguous_decode_attention_reference(q, k, v, seq_lens, scale)
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty_like(q)
    if layout.batch == 0:
        return out
    return _launch_attention(q, k, v, seq_lens, seq_lens, out, layout, scale, num_splits,
                             paged=False, tile_tokens=tile_tokens)


def gather_then_attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                       num_splits: int = 1, *, out: torch.Tensor | None = None, validate: bool = True,
                       workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The naive baseline: ``paged_gather`` K and V into contiguous buffers, then attend to them.

    Moves the K/V bytes three times (read pool, write buffer, read buffer) where the fused
    kernel moves them once.  ``workspace=(k_buf, v_buf)``, each ``[B, S >= max(seq_lens), Hkv, D]``,
    reuses caller-owned buffers instead of allocating (the benchmark does, to fit big pools).
    """
    layout, scale = args.check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits,
                                               None, None, validate, _INTERPRETING)
    k_buf, v_buf = workspace if workspace is not None else (None, None)
    k_flat = paged_gather(k_cache, block_tables, seq_lens, out=k_buf, validate=validate)
    v_flat = paged_gather(v_cache, block_tables, seq_lens, out=v_buf, validate=validate)
    if layout.batch == 0:
        return out if out is not None else torch.empty_like(q)
    return contiguous_decode_attention(q, k_flat, v_flat, seq_lens, scale, num_splits, out=out, validate=False)


def kv_token_offsets(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                     stride_block: int, stride_slot: int, *, token_offset_fn=None) -> torch.Tensor:
    """Run ``kv_token_offset`` (or ``token_offset_fn``) for every token: int64 ``[B, max(seq_lens)]``.

    Entry ``[b, t]`` is the element offset the kernels would read token ``t`` of sequence ``b``
    from, or -1 past ``seq_lens[b]``.  No cache is touched, so a lab can inspect the addresses
    of a pool far larger than memory (e.g. block ids near 2**31).
    """
    batch = args.check_offsets(block_tables, seq_lens, block_size, stride_block, stride_slot)
    reason = backend_status(block_tables.device)
    if reason is not None:
        raise RuntimeError(f"kv_token_offsets runs the Triton helper itself and cannot here: {reason}")
    max_len = args.check_offset_lengths(block_tables, seq_lens, block_size, batch, _PROBE_TILE)
    out = torch.empty(batch, max_len, dtype=torch.int64, device=block_tables.device)
    if out.numel() == 0:
        return out
    launch = _offsets_launch(block_tables, seq_lens, out, block_size, stride_block, stride_slot, token_offset_fn)
    with _device_guard(block_tables):
        launch()
    return out


def _offsets_launch(block_tables, seq_lens, out, block_size: int, stride_block: int, stride_slot: int,
                    token_offset_fn=None) -> _Launch:
    batch, max_len = out.shape
    return _Launch(
        _kernel(_token_offset_probe_kernel, token_offset_fn), (batch, triton.cdiv(max_len, _PROBE_TILE)),
        (block_tables, seq_lens, out, block_tables.stride(0), stride_block, stride_slot, max_len),
        dict(BLOCK_SIZE=block_size, TILE=_PROBE_TILE),
    )


# --------------------------------------------------------------------------------------------
# Torch references: written from the definition, sharing nothing with the kernels above
# --------------------------------------------------------------------------------------------
def paged_gather_reference(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           out_len: int | None = None) -> torch.Tensor:
    """Plain-torch ``paged_gather``: index the pool with (block id, slot) pairs per token."""
    batch = block_tables.shape[0]
    lens = [int(n) for n in seq_lens.tolist()]
    out_len = max(lens, default=0) if out_len is None else out_len
    block_size = cache.shape[1]
    result = torch.zeros((batch, out_len) + tuple(cache.shape[2:]), dtype=cache.dtype, device=cache.device)
    for b, n in enumerate(lens):
        positions = torch.arange(n, device=cache.device)
        blocks = block_tables[b].to(cache.device).long()[positions // block_size]
        result[b, :n] = cache[blocks, positions % block_size]
    return result


def contiguous_decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                          seq_lens: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Plain-torch decode attention over ``[B, S_max, Hkv, D]`` K/V, fp32 softmax (fp64 for fp64 inputs, which
    the graders use for expected values whose bits do not depend on the CPU), one sequence at a time."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[1] // k.shape[2]
    out = torch.empty_like(q)
    wide = torch.promote_types(q.dtype, torch.float32)
    for b, n in enumerate(int(x) for x in seq_lens.tolist()):
        keys = k[b, :n].to(wide).repeat_interleave(group, dim=1)  # [n, Hq, D]
        values = v[b, :n].to(wide).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].to(wide), keys) * scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), values).to(q.dtype)
    return out


def paged_decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                     block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                     scale: float | None = None, num_splits: int = 1) -> torch.Tensor:
    """Plain-torch ``paged_decode_attention`` (gather, then fp32 softmax).  Same signature; the
    split count changes how a kernel schedules the work, not the result, so it is ignored."""
    _, scale = args.check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, None, None,
                                          True, _INTERPRETING)
    k = paged_gather_reference(k_cache, block_tables, seq_lens)
    v = paged_gather_reference(v_cache, block_tables, seq_lens)
    return contiguous_decode_attention_reference(q, k, v, seq_lens, scale)


# --------------------------------------------------------------------------------------------
# The CPU path: one gather through the block table, then torch's fused attention
# --------------------------------------------------------------------------------------------
def length_groups(lengths, power: int = 1, waste: float = 2.0) -> list[list[int]]:
    """Indices of ``lengths`` in groups of similar length, shortest first, for work padded to a group's longest.

    Sorted by length, an index joins the group before it while that group's padded work (its count times its
    longest length to the ``power``: 1 for a decode token's keys, 2 for a prompt's causal attention) stays
    within ``waste`` times its own (the sum of its lengths to the ``power``).
    """
    lengths = [int(n) for n in lengths]
    groups: list[list[int]] = []
    own = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        work = lengths[i] ** power
        if groups and (len(groups[-1]) + 1) * work <= waste * (own + work):
            groups[-1].append(i)
            own += work
        else:
            groups.append([i])
            own = work
    return groups


def paged_decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                                 num_splits: int = 1, *, validate: bool = True) -> torch.Tensor:
    """``paged_decode_attention`` in plain torch for the whole batch at once: what a model decodes with on a CPU.

    No loop over sequences: every sequence's slots come from its block-table row as the kernel computes them
    (``block_tables[b, t // block_size] * block_size + t % block_size``), K and V are gathered through them in
    one index per pool into ``[B, S, Hkv, D]``, and torch's fused attention (``scaled_dot_product_attention``:
    scores and softmax accumulated in fp32) attends each KV head's G query heads to it as G queries (GQA without
    a copy of K/V per query head).  Sequences of similar length go together (`length_groups`: a mixed batch
    gathers and attends at most twice its real tokens, where padding every sequence to the longest can copy
    several times them), so S is the longest of a group.  Slots past a sequence's length are never read (a pool
    may hold anything there, NaN included): those positions read the sequence's own first token again, and
    the mask gives them a weight of exactly 0.  The output agrees with the reference to the output dtype's
    rounding.  ``validate=False`` skips the data-dependent checks; a table entry outside the pool still raises
    (torch indexing is bounds-checked).  The split count does not change the result, so it is ignored.
    """
    _, scale = args.check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, None,
                                          None, validate, _INTERPRETING)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    lens = seq_lens.to(device=q.device, dtype=torch.long)
    tables = block_tables.to(q.device)
    groups = length_groups(lens.tolist())
    if len(groups) == 1:
        return _attend_padded(q, k_cache, v_cache, tables, lens, scale)
    out = torch.empty_like(q)
    for g in groups:
        rows = torch.tensor(g, device=q.device)
        out[rows] = _attend_padded(q[rows], k_cache, v_cache, tables[rows], lens[rows], scale)
    return out


def _attend_padded(q, k_cache, v_cache, block_tables, lens, scale: float) -> torch.Tensor:
    """`paged_decode_attention_torch` for one group: K/V gathered to [n, longest, Hkv, D], then fused attention."""
    from torch.nn.functional import scaled_dot_product_attention

    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    positions = torch.arange(int(lens.max()), device=q.device)
    valid = positions[None, :] < lens[:, None]  # [n, S]
    blocks = block_tables.long()[:, positions // block_size]
    # past its length a sequence reads its own first token again (written, so finite), masked out below
    slots = torch.where(valid, blocks * block_size + positions % block_size, blocks[:, :1] * block_size)
    k = k_cache.reshape(-1, num_kv_heads, head_dim)[slots]  # [n, S, Hkv, D]
    v = v_cache.reshape(-1, num_kv_heads, head_dim)[slots]
    group = num_q_heads // num_kv_heads  # query head h reads KV head h // group
    # in float32, as the Triton kernel accumulates and the reference computes: bf16 scores flip near-tied tokens
    out = scaled_dot_product_attention(q.float().reshape(batch, num_kv_heads, group, head_dim),
                                       k.float().transpose(1, 2), v.float().transpose(1, 2),
                                       attn_mask=valid[:, None, None, :], scale=scale)
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)


def interpreter_active() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(_INTERPRETING)

