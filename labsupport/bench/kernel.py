"""Measuring the paged-attention kernels (§10.3 step three, §10.7 row one: achieved bandwidth on an
indirect access): ``python -m labsupport bench kernel`` and ``python -m labsupport bench gpu``.

``bench kernel`` on CUDA measures, in one run:
  * the device's copy bandwidth (``dst.copy_(src)``, bytes read + bytes written per second) — the
    ceiling every other figure is a percentage of;
  * the Triton gather kernel's GB/s by block size, beside a plain copy of the same bytes;
  * decode attention for B x S x Hkv x block size (Hq = 32, D = 128, bf16; fp16 on pre-Ampere
    GPUs): median time (``triton.testing.do_bench``, L2 flushed between runs), bytes moved
    (K and V read once, plus q and out), achieved GB/s, % of the measured copy bandwidth, and the
    time ratios to the contiguous kernel, to gather-then-attend and to torch SDPA on contiguous
    tensors.  Every row goes to a JSON file.
On CPU it runs one tiny case through Triton's interpreter and says that its timings measure the
interpreter, not a GPU.

``bench gpu`` is the <4-minute GPU check: correctness on CUDA for the test matrix (dtypes x block
sizes x GQA ratios x lengths at block edges x split-K, against the torch reference, with unused
pool slots poisoned with NaN), then a trimmed sweep, written to ``data/gpu_results.json`` with the
date, GPU, driver, torch and triton versions.  The matrix is ~50 configurations and ~120 distinct
kernel compilations (1-2 s of one CPU core each on a fresh Triton cache), which alone would eat
most of the four minutes, so it is checked by ``--workers`` processes in parallel (default: half
the CPU cores, at most 8); the sweep then stops starting rows at ``--budget-s``.

SDPA is given ``[B, H, S, D]`` views (``transpose(1, 2)``) of the contiguous K/V the contiguous
kernel reads, with ``enable_gqa`` for GQA; torch picks its backend.

Pools are built by scattering contiguous K/V into a random permutation of physical blocks, so
consecutive logical blocks are almost never neighbours — a fragmented pool, the case paging is for.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from labsupport import kernels as K
from labsupport.cli.parser import OneLineParser, UsageError, int_flag, real_flag, run_command
from labsupport.kernels import MAX_BLOCK_SIZE
from labsupport.units import fmt_pct

BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
BATCHES = (1, 8, 64, 256)
SEQ_LENS = (512, 2048, 8192, 32768)
KV_HEADS = (32, 8)
NUM_Q_HEADS = 32
HEAD_DIM = 128
GATHER_SHAPE = dict(batch=64, seq_len=8192, num_kv_heads=8)  # one 1.07 GB bf16 K cache
# The targets on an H100/H200, evaluated at this point (reported, never asserted).
HEADLINE = dict(batch=64, seq_len=8192, block_size=16)
TARGETS = dict(min_pct_of_copy=0.75, max_paged_over_contiguous=1.15, min_gather_then_attend_over_paged=2.0)
MEMORY_FRACTION = 0.8  # of free device memory a row may use
CPU_NOTE = ("CPU: these timings measure Triton's *interpreter* (Python executing the kernel program "
            "by program); they say nothing about GPU performance. Run on a CUDA GPU for real figures.")


# --------------------------------------------------------------------------------------------
# Environment and timing
# --------------------------------------------------------------------------------------------
def environment() -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": getattr(K.triton, "__version__", None),
        "python": platform.python_version(),
        "cuda_runtime": torch.version.cuda,
        "interpreter": K.interpreter_active(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}",
                    memory_bytes=props.total_memory, num_sms=props.multi_processor_count,
                    driver=_driver_version())
    return info


def _driver_version() -> str:
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (nvidia-smi unavailable)"


def time_ms(fn) -> float:
    """Median milliseconds of ``fn`` on the GPU (triton.testing.do_bench, L2 flushed per run)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def measure_copy_bandwidth(nbytes: int, device="cuda") -> dict:
    """Bytes/s of ``dst.copy_(src)``, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return dict(copy_bytes=nbytes, copy_ms=ms, copy_bandwidth=2 * nbytes / (ms * 1e-3))


def sweep_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16


# --------------------------------------------------------------------------------------------
# Pools
# --------------------------------------------------------------------------------------------
def build_pool(k: torch.Tensor, v: torch.Tensor | None, block_size: int, generator: torch.Generator,
               spare: int = 0):
    """Scatter contiguous ``[B, S, Hkv, D]`` K/V into a pool at randomly permuted physical blocks.

    Returns ``(k_cache, v_cache, block_tables)`` (``v_cache`` is None when ``v`` is); logical
    block j of sequence b is physical block ``block_tables[b, j]``.  ``spare`` extra blocks are
    NaN-filled: nothing may read them.
    """
    batch, seq_len, num_kv_heads, head_dim = k.shape
    if seq_len % block_size:
        raise ValueError(f"build_pool needs S ({seq_len}) to be a multiple of block_size ({block_size})")
    per_seq = seq_len // block_size
    used = batch * per_seq
    perm = torch.randperm(used + spare, generator=generator)[:used].to(k.device)
    caches = []
    for src in (k, v):
        if src is None:
            caches.append(None)
            continue
        cache = torch.empty(used + spare, block_size, num_kv_heads, head_dim, dtype=src.dtype, device=src.device)
        if spare:
            cache.fill_(float("nan"))
        cache.index_copy_(0, perm, src.reshape(used, block_size, num_kv_heads, head_dim))
        caches.append(cache)
    return caches[0], caches[1], perm.view(batch, per_seq).to(torch.int32)


def poison_past_lengths(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """NaN-fill every slot at or beyond each sequence's length (they must never be read)."""
    batch, per_seq = block_tables.shape
    block_size = cache.shape[1]
    token = torch.arange(per_seq * block_size, device=cache.device)
    slots = block_tables.long()[:, token // block_size] * block_size + token % block_size  # [B, S]
    unused = token[None, :] >= seq_lens.long()[:, None]
    cache.view(-1, *cache.shape[2:])[slots[unused]] = float("nan")


# --------------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------------
def gather_rows(copy_bandwidth: float, dtype, block_sizes=BLOCK_SIZES, progress=None, *, shape=None,
                head_dim: int = HEAD_DIM, device="cuda", timer=None) -> list[dict]:
    """The gather kernel's GB/s by block size, beside a plain copy of the same bytes."""
    timer = timer or time_ms
    shape = shape or GATHER_SHAPE
    batch, seq_len, num_kv_heads = shape["batch"], shape["seq_len"], shape["num_kv_heads"]
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    out = torch.empty_like(k)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    nbytes = k.numel() * k.element_size()
    plain_ms = timer(lambda: out.copy_(k))
    rows = []
    for bs in block_sizes:
        k_cache, _, table = build_pool(k, None, bs, gen)
        K.paged_gather(k_cache, table, lens, out=out)  # validates once
        exact = torch.equal(out, k)
        ms = timer(lambda: K.paged_gather(k_cache, table, lens, out=out, validate=False))
        moved = 2 * nbytes  # read the pool, write the buffer
        rows.append(dict(
            batch=batch, seq_len=seq_len, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=str(dtype),
            block_size=bs, bytes_moved=moved, table_bytes=table.numel() * 4, gather_ms=ms,
            gather_gbps=moved / (ms * 1e-3) / 1e9, plain_copy_ms=plain_ms,
            plain_copy_gbps=moved / (plain_ms * 1e-3) / 1e9,
            pct_of_copy=moved / (ms * 1e-3) / copy_bandwidth, bit_exact=exact,
        ))
        _say(progress, f"gather  bs={bs:>3}  {ms * 1e3:9.1f} µs  {rows[-1]['gather_gbps']:8.1f} GB/s  "
                       f"{fmt_pct(rows[-1]['pct_of_copy'], 1):>6} of copy  "
                       f"(plain copy {rows[-1]['plain_copy_gbps']:.1f} GB/s)"
                       f"  exact={exact}")
        del k_cache, table
    del k, out
    _empty_cache(device)
    return rows


def _empty_cache(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _free_bytes(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return 2**62  # host runs are tiny interpreter dry runs


def _sdpa_ms(q, k, v, group: int, timer):
    """Median ms of torch SDPA on contiguous K/V (views as [B, H, S, D]); None if unsupported."""
    q4 = q.unsqueeze(2)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    kwargs = {"enable_gqa": True} if group > 1 else {}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        sdpa(q4, kt, vt, **kwargs)
        return timer(lambda: sdpa(q4, kt, vt, **kwargs)), None
    except TypeError as exc:  # torch < 2.5 has no enable_gqa
        return None, f"sdpa: {exc}"
    except torch.cuda.OutOfMemoryError:
        _empty_cache(q.device)
        return None, "sdpa: out of memory"
    except RuntimeError as exc:  # e.g. no SDPA backend for this shape/dtype
        return None, f"sdpa: {str(exc).splitlines()[0]}"


def decode_rows(combos, copy_bandwidth: float, dtype, num_sms: int, progress=None, deadline: float | None = None, *,
                num_q_heads: int = NUM_Q_HEADS, head_dim: int = HEAD_DIM, device="cuda", timer=None,
                tile_tokens: int | None = None) -> list[dict]:
    """One row per (B, S, Hkv, block size); combos: iterable of (B, S, Hkv, block_sizes).

    ``tile_tokens`` (default: the kernels' own choice) sets the tokens per loop iteration of the
    paged and the contiguous kernel alike, e.g. to equal the block size.
    """
    timer = timer or time_ms
    rows = []
    gen = torch.Generator().manual_seed(1)
    elem = torch.tensor([], dtype=dtype).element_size()
    for batch, seq_len, num_kv_heads, block_sizes in combos:
        base = dict(batch=batch, seq_len=seq_len, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, dtype=str(dtype))
        kv_bytes = 2 * batch * seq_len * num_kv_heads * head_dim * elem
        free = _free_bytes(device)
        if deadline is not None and time.monotonic() > deadline:
            rows += [dict(base, block_size=bs, skipped="time budget of the GPU check spent") for bs in block_sizes]
            _say(progress, f"skip    B={batch} S={seq_len} Hkv={num_kv_heads}: time budget spent", rows=len(block_sizes))
            continue
        if 2 * kv_bytes > MEMORY_FRACTION * free:  # contiguous copy + paged pool
            rows += [dict(base, block_size=bs, skipped=f"needs {2 * kv_bytes / 1e9:.1f} GB, "
                                                         f"{free / 1e9:.1f} GB free") for bs in block_sizes]
            _say(progress, f"skip    B={batch} S={seq_len} Hkv={num_kv_heads}: {rows[-1]['skipped']}",
                 rows=len(block_sizes))
            continue
        try:
            rows += _decode_combo(base, block_sizes, dtype, kv_bytes, copy_bandwidth, num_sms, gen, progress,
                                  device=device, timer=timer, tile_tokens=tile_tokens)
        except torch.cuda.OutOfMemoryError:
            rows += [dict(base, block_size=bs, skipped="out of memory") for bs in block_sizes]
            _say(progress, f"skip    B={batch} S={seq_len} Hkv={num_kv_heads}: out of memory", rows=len(block_sizes))
        _empty_cache(device)
    return rows


def _decode_combo(base: dict, block_sizes, dtype, kv_bytes: int, copy_bandwidth: float, num_sms: int, gen, progress,
                  *, device, timer, tile_tokens) -> list[dict]:
    """Rows for one (B, S, Hkv): the contiguous and SDPA baselines once, then each block size."""
    batch, seq_len, num_q_heads = base["batch"], base["seq_len"], base["num_q_heads"]
    num_kv_heads, head_dim = base["num_kv_heads"], base["head_dim"]
    elem = torch.tensor([], dtype=dtype).element_size()
    rows = []
    group = num_q_heads // num_kv_heads
    q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    capability = torch.cuda.get_device_capability(device) if torch.device(device).type == "cuda" else None
    tile = tile_tokens or K.default_tile(dtype, num_q_heads, num_kv_heads, head_dim, capability)
    splits = K.suggest_num_splits(batch, num_kv_heads, seq_len, num_sms, tile=tile)
    opts = dict(num_splits=splits, tile_tokens=tile_tokens)
    moved = kv_bytes + 2 * q.numel() * elem  # K and V once, q in, out back
    contiguous_out = K.contiguous_decode_attention(q, k, v, lens, **opts)
    contiguous_ms = timer(lambda: K.contiguous_decode_attention(q, k, v, lens, out=out, validate=False, **opts))
    sdpa_ms, sdpa_note = _sdpa_ms(q, k, v, group, timer)
    for bs in block_sizes:
        k_cache, v_cache, table = build_pool(k, v, bs, gen)
        paged_out = K.paged_decode_attention(q, k_cache, v_cache, table, lens, **opts)  # validated
        diff = float((paged_out.float() - contiguous_out.float()).abs().max())
        paged_ms = timer(lambda: K.paged_decode_attention(q, k_cache, v_cache, table, lens, out=out,
                                                          validate=False, **opts))
        # the gather writes the same values back into k and v, so they double as its workspace
        gta_ms = timer(lambda: K.gather_then_attend(q, k_cache, v_cache, table, lens, num_splits=splits,
                                                    out=out, validate=False, workspace=(k, v)))
        gbps = moved / (paged_ms * 1e-3)
        row = dict(base, block_size=bs, num_splits=splits, tile_tokens=tile, bytes_moved=moved,
                   table_bytes=table.numel() * 4, paged_ms=paged_ms, paged_gbps=gbps / 1e9,
                   pct_of_copy=gbps / copy_bandwidth,
                   contiguous_ms=contiguous_ms,
                   contiguous_pct_of_copy=moved / (contiguous_ms * 1e-3) / copy_bandwidth,
                   gather_then_attend_ms=gta_ms, sdpa_ms=sdpa_ms,
                   paged_over_contiguous=paged_ms / contiguous_ms,
                   gather_then_attend_over_paged=gta_ms / paged_ms,
                   sdpa_over_paged=None if sdpa_ms is None else sdpa_ms / paged_ms,
                   max_abs_diff_vs_contiguous=diff)
        if sdpa_note:
            row["note"] = sdpa_note
        rows.append(row)
        _say(progress, _decode_line(row))
        del k_cache, v_cache, table
    return rows


def _decode_line(r: dict) -> str:
    sdpa = "   n/a" if r["sdpa_over_paged"] is None else f"{r['sdpa_over_paged']:6.2f}"
    return (f"decode  B={r['batch']:>3} S={r['seq_len']:>5} Hkv={r['num_kv_heads']:>2} bs={r['block_size']:>3} "
            f"splits={r['num_splits']:>2}  {r['paged_ms'] * 1e3:9.1f} µs  {r['paged_gbps']:7.1f} GB/s "
            f"{fmt_pct(r['pct_of_copy'], 1):>6} of copy | paged/contig {r['paged_over_contiguous']:5.2f} "
            f"| gta/paged {r['gather_then_attend_over_paged']:5.2f} | sdpa/paged {sdpa}")


def _say(progress, text: str, rows: int = 1) -> None:
    """Print one finished measurement (through the progress bar when there is one) and tick it."""
    if progress is not None:
        progress.write(text)
        progress.update(rows)
    else:
        print(text, flush=True)


def evaluate_targets(rows: list[dict]) -> list[dict]:
    """The issue's targets at B=64, S=8192, block 16, per Hkv — reported, not asserted."""
    verdicts = []
    for r in rows:
        if "skipped" in r or any(r[key] != HEADLINE[key] for key in HEADLINE):
            continue
        for name, value, ok in (
            ("pct_of_copy >= 75%", r["pct_of_copy"], r["pct_of_copy"] >= TARGETS["min_pct_of_copy"]),
            ("paged/contiguous <= 1.15", r["paged_over_contiguous"],
             r["paged_over_contiguous"] <= TARGETS["max_paged_over_contiguous"]),
            ("gather-then-attend/paged >= 2", r["gather_then_attend_over_paged"],
             r["gather_then_attend_over_paged"] >= TARGETS["min_gather_then_attend_over_paged"]),
        ):
            verdicts.append(dict(num_kv_heads=r["num_kv_heads"], target=name, value=value, met=bool(ok)))
    return verdicts


# --------------------------------------------------------------------------------------------
# Correctness on the device (the test matrix, compiled)
# --------------------------------------------------------------------------------------------
def default_check_configs(bf16: bool = True) -> list[tuple]:
    """(dtype, block size, Hq, Hkv, num_splits): every block size in bf16, the ends in fp16/fp32."""
    configs = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        if dtype == torch.bfloat16 and not bf16:
            continue
        for bs in BLOCK_SIZES if dtype == torch.bfloat16 else (16, 256):
            for hq, hkv in ((32, 32), (32, 8), (32, 4), (5, 1)):  # GQA ratios 1, 4, 8 and 5:1
                for splits in ((1, 4) if bs == 16 else (1,)):
                    configs.append((dtype, bs, hq, hkv, splits))
    return configs


def correctness_matrix(progress=None, *, configs=None, head_dim: int = HEAD_DIM, long_len: int = 1000,
                       device="cuda", workers: int = 1) -> list[dict]:
    """The CPU test matrix, compiled for CUDA, against the torch reference.

    Each configuration runs one batch with lengths 1, 2b-1, 2b, 2b+1 and ``long_len`` (b the block
    size), slots past each length and spare blocks NaN-filled, table entries past each length junk.
    Nearly all of the time goes to compiling (~50 configurations, each a few kernel variants, about
    a second or two of one CPU core apiece), so ``workers > 1`` checks disjoint slices of the matrix
    in that many processes at once; each configuration seeds its own generator, so the inputs (and
    so the results) do not depend on how the matrix was sliced.
    """
    if configs is None:
        configs = default_check_configs(bf16=torch.cuda.get_device_capability()[0] >= 8)
    indexed = list(enumerate(configs))
    workers = max(1, min(workers, len(indexed)))
    if workers == 1:
        return _check_configs(indexed, head_dim, long_len, device, progress)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    slices = [indexed[w::workers] for w in range(workers)]
    # spawn, not fork: a forked child cannot use the CUDA context its parent already holds
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_check_configs, part, head_dim, long_len, device, None) for part in slices]
        results = [row for future in futures for row in future.result()]
    results.sort(key=lambda row: row["index"])
    if progress is not None:
        progress.update(len(results))
    return results


def _check_configs(indexed, head_dim: int, long_len: int, device, progress) -> list[dict]:
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 5e-3}
    results = []
    for index, (dtype, bs, hq, hkv, splits) in indexed:
        gen = torch.Generator().manual_seed(1000 + index)
        lens_list = [1, 2 * bs - 1, 2 * bs, 2 * bs + 1, long_len]
        s_pool = -(-max(lens_list) // bs) * bs
        batch = len(lens_list)
        k = torch.randn(batch, s_pool, hkv, head_dim, generator=gen).to(device, dtype)
        v = torch.randn(batch, s_pool, hkv, head_dim, generator=gen).to(device, dtype)
        q = torch.randn(batch, hq, head_dim, generator=gen).to(device, dtype)
        lens = torch.tensor(lens_list, dtype=torch.int32, device=device)
        k_cache, v_cache, table = build_pool(k, v, bs, gen, spare=3)
        poison_past_lengths(k_cache, table, lens)
        poison_past_lengths(v_cache, table, lens)
        # table entries past each sequence's blocks hold junk that must never be read
        need = (lens.long() + bs - 1) // bs
        junk = torch.arange(table.shape[1], device=device)[None, :] >= need[:, None]
        table = torch.where(junk, torch.full_like(table, 2**31 - 1), table)
        expected = K.paged_decode_attention_reference(q, k_cache, v_cache, table, lens).float()
        out = torch.full_like(q, float("nan"))
        K.paged_decode_attention(q, k_cache, v_cache, table, lens, num_splits=splits, out=out)
        gta = K.gather_then_attend(q, k_cache, v_cache, table, lens, num_splits=splits)
        gathered = K.paged_gather(k_cache, table, lens)
        gather_ok = all(torch.equal(gathered[b, :n], k[b, :n]) for b, n in enumerate(lens_list))
        scale = float(expected.abs().max())
        err = float((out.float() - expected).abs().max()) / scale
        gta_err = float((gta.float() - expected).abs().max()) / scale
        ok = (not torch.isnan(out).any().item()) and err <= tolerance[dtype] and gta_err <= tolerance[dtype] and gather_ok
        results.append(dict(index=index, dtype=str(dtype), block_size=bs, num_q_heads=hq, num_kv_heads=hkv,
                            num_splits=splits, seq_lens=lens_list, max_rel_err=err,
                            gather_then_attend_max_rel_err=gta_err, gather_exact=gather_ok,
                            tolerance=tolerance[dtype], passed=bool(ok)))
        _say(progress, f"check   {str(dtype):>14} bs={bs:>3} Hq={hq:>2} Hkv={hkv:>2} splits={splits}  "
                       f"rel err {err:.2e}  {'ok' if ok else 'FAIL'}")
    return results


# --------------------------------------------------------------------------------------------
# CPU: a tiny interpreter case
# --------------------------------------------------------------------------------------------
def cpu_rows() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    batch, seq_len, hq, hkv, d, bs = 2, 64, 4, 2, 32, 16
    k = torch.randn(batch, seq_len, hkv, d, generator=gen)
    v = torch.randn(batch, seq_len, hkv, d, generator=gen)
    q = torch.randn(batch, hq, d, generator=gen)
    lens = torch.full((batch,), seq_len, dtype=torch.int32)
    k_cache, v_cache, table = build_pool(k, v, bs, gen)
    cases = {
        "paged_gather": lambda: K.paged_gather(k_cache, table, lens),
        "paged_decode_attention": lambda: K.paged_decode_attention(q, k_cache, v_cache, table, lens),
        "paged_decode_attention(num_splits=2)": lambda: K.paged_decode_attention(q, k_cache, v_cache, table, lens,
                                                                                 num_splits=2),
        "contiguous_decode_attention": lambda: K.contiguous_decode_attention(q, k, v, lens),
        "gather_then_attend": lambda: K.gather_then_attend(q, k_cache, v_cache, table, lens),
        "paged_decode_attention_reference": lambda: K.paged_decode_attention_reference(q, k_cache, v_cache, table, lens),
    }
    rows = []
    for name, fn in cases.items():
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        rows.append(dict(function=name, batch=batch, seq_len=seq_len, num_q_heads=hq, num_kv_heads=hkv,
                         head_dim=d, block_size=bs, median_s=sorted(times)[1]))
    return rows


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def _write(path: str | None, payload: dict) -> None:
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {target}")


def _progress(total: int, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False)


def bench_kernel(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m labsupport bench kernel", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON path for every row "
                        "(default on CUDA: data/kernel_bench.json; on CPU nothing is written unless given)")
    parser.add_argument("--batches", type=int_flag(1, 65_535), nargs="+", default=list(BATCHES))
    parser.add_argument("--seq-lens", type=int_flag(1, 1 << 22), nargs="+", default=list(SEQ_LENS))
    parser.add_argument("--kv-heads", type=int_flag(1, NUM_Q_HEADS), nargs="+", default=list(KV_HEADS),
                        help=f"KV heads, each dividing the {NUM_Q_HEADS} query heads")
    parser.add_argument("--block-sizes", type=int_flag(1, MAX_BLOCK_SIZE), nargs="+", default=list(BLOCK_SIZES),
                        help=f"powers of two up to {MAX_BLOCK_SIZE}")
    parser.add_argument("--tile-tokens", type=int_flag(16, 256), default=None,
                        help="tokens per kernel loop iteration (power of two, 16..256; default: the kernel's choice)")
    args = parser.parse_args(argv)
    bad = ([f"--kv-heads {h} (must divide {NUM_Q_HEADS})" for h in args.kv_heads if NUM_Q_HEADS % h]
           + [f"--block-sizes {b} (a power of two)" for b in args.block_sizes if b & (b - 1)]
           + ([f"--tile-tokens {args.tile_tokens} (a power of two)"]
              if args.tile_tokens is not None and args.tile_tokens & (args.tile_tokens - 1) else []))
    if bad:
        raise UsageError(f"bad value: {bad[0]}")

    if not torch.cuda.is_available():
        print(CPU_NOTE)
        rows = cpu_rows()
        for r in rows:
            print(f"  {r['function']:<40} {r['median_s'] * 1e3:9.1f} ms   (B={r['batch']}, S={r['seq_len']}, "
                  f"Hq={r['num_q_heads']}, Hkv={r['num_kv_heads']}, D={r['head_dim']}, block {r['block_size']})")
        print(CPU_NOTE)
        _write(args.out, dict(meta=environment(), note=CPU_NOTE, cpu_interpreter=rows))
        return 0

    started = time.monotonic()
    meta = environment()
    dtype = sweep_dtype()
    print(f"{meta['gpu']} ({meta['capability']}, driver {meta['driver']}), torch {meta['torch']}, "
          f"triton {meta['triton']}; decode dtype {dtype}")
    copy = measure_copy_bandwidth(_copy_bytes())
    print(f"copy bandwidth (read + write): {copy['copy_bandwidth'] / 1e9:.1f} GB/s over {copy['copy_bytes'] / 1e9:.2f} GB")
    combos = [(b, s, h, tuple(args.block_sizes)) for h in args.kv_heads for b in args.batches for s in args.seq_lens]
    bar = _progress(len(args.block_sizes) + len(combos) * len(args.block_sizes), "kernel bench")
    gather = gather_rows(copy["copy_bandwidth"], dtype, args.block_sizes, progress=bar)
    decode = decode_rows(combos, copy["copy_bandwidth"], dtype, meta["num_sms"], progress=bar,
                         tile_tokens=args.tile_tokens)
    if bar is not None:
        bar.close()
    verdicts = evaluate_targets(decode)
    _print_verdicts(verdicts)
    _write(args.out or "data/kernel_bench.json",
           dict(meta=meta, copy=copy, gather=gather, decode=decode, targets=verdicts,
                elapsed_s=time.monotonic() - started))
    return 0


def _copy_bytes() -> int:
    free, _ = torch.cuda.mem_get_info()
    return int(min(2**30, free // 8))


def _print_verdicts(verdicts: list[dict]) -> None:
    for v in verdicts:
        print(f"target at B=64, S=8192, block 16, Hkv={v['num_kv_heads']}: {v['target']}: "
              f"{v['value']:.3f} -> {'met' if v['met'] else 'NOT met'}")


TRIMMED = [  # (B, S, Hkv, block sizes): the headline point first, then the corners
    (64, 8192, 8, BLOCK_SIZES),
    (64, 8192, 32, (16, 256)),
    (1, 32768, 8, (16, 256)),
    (256, 2048, 8, (16, 256)),
    (8, 2048, 32, (16,)),
]


def gpu_check(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m labsupport bench gpu",
                           description="correctness on CUDA for the test matrix, then a trimmed sweep")
    parser.add_argument("--out", default="data/gpu_results.json")
    parser.add_argument("--budget-s", type=real_flag(1.0, 3600.0), default=210.0,
                        help="stop starting sweep rows after this many seconds (the whole check stays < 4 min)")
    parser.add_argument("--workers", type=int_flag(1, 64), default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                        help="processes that compile and check the correctness matrix in parallel")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is visible, so there is nothing to check "
                         "(on CPU use `python -m labsupport bench kernel` for the interpreter case)")
    started = time.monotonic()
    deadline = started + args.budget_s
    meta = environment()
    print(f"{meta['gpu']} ({meta['capability']}, driver {meta['driver']}), torch {meta['torch']}, triton {meta['triton']}")
    checks = correctness_matrix(workers=args.workers)
    failed = [c for c in checks if not c["passed"]]
    print(f"correctness: {len(checks) - len(failed)}/{len(checks)} configurations passed "
          f"({time.monotonic() - started:.0f} s)")
    dtype = sweep_dtype()
    copy = measure_copy_bandwidth(_copy_bytes())
    print(f"copy bandwidth (read + write): {copy['copy_bandwidth'] / 1e9:.1f} GB/s")
    gather = gather_rows(copy["copy_bandwidth"], dtype)
    decode = decode_rows(TRIMMED, copy["copy_bandwidth"], dtype, meta["num_sms"], deadline=deadline)
    verdicts = evaluate_targets(decode)
    _print_verdicts(verdicts)
    elapsed = time.monotonic() - started
    print(f"GPU check took {elapsed:.0f} s")
    _write(args.out, dict(meta=meta, correctness=checks, copy=copy, gather=gather, decode=decode,
                          targets=verdicts, elapsed_s=elapsed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_command("bench kernel", bench_kernel, sys.argv[1:]))

