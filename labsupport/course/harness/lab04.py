"""Lab 04's harness: the attention kernel reads through the block table (§10.3 step three), beside checkoffs/lab04.py.

Checkoff 4.2: the student's @triton.jit address line compiled into the real kernels (harness and judge
"triton_offset"), on an address case or a kernel case whose tensors `kernel_case_tensors` makes from a seed, the
same on every machine.  The grader's expected values use `kernel_case_tensors` and `tensor_values` too; notebook 04
calls `raise_if_unfinished` (imported from labsupport.course.harness).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import random
import re

from labsupport.course.harness.base import _raised, harness, judge
from labsupport.course.judge import Mismatch, echo
from labsupport.units import fmt_number


def raise_if_unfinished(fn) -> None:
    """Raise the exercise's own NotImplementedError while `fn`'s source holds it: Triton never lets it out of a kernel
    as itself, so an unfinished @triton.jit exercise is recognised before it runs ('not attempted', not 'failed')."""
    fn = getattr(fn, "fn", fn)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return
    if found := re.search(r'raise\s+NotImplementedError\(\s*("(?:[^"\\\n]|\\.)*")', source):
        message = found[1]
        with contextlib.suppress(ValueError):
            message = json.loads(found[1])
        raise NotImplementedError(message)
    if "raise NotImplementedError" in source:
        raise NotImplementedError(f"{getattr(fn, '__name__', 'this function')} still raises NotImplementedError")


def _padded_table(rows: list[list[int]], block_size: int):
    """An int32 block table padded with 0 as a real batch's is, wide enough that no lane of a tile reads past it."""
    import torch

    width = max(max(map(len, rows)), -(-256 // block_size)) + 1
    return torch.tensor([row + [0] * (width - len(row)) for row in rows], dtype=torch.int32)


def kernel_case_tensors(case: dict, device=None):
    """4.2's kernel case (q, k_cache, v_cache, block_tables, seq_lens) from its seed, the same on every machine: a
    shuffled pool with NaN in every slot no sequence owns (a kernel that reads one returns NaN)."""
    import torch

    rng = random.Random(case["seed"])

    def normal() -> float:  # a standard normal in steps of 1/64: exact in float32, short in the record
        return round(rng.gauss(0.0, 1.0) * 64) / 64

    bs, hq, hkv, d, lens = (case[k] for k in ("block_size", "q_heads", "kv_heads", "head_dim", "seq_lens"))
    need = [-(-n // bs) for n in lens]
    ids = list(range(sum(need) + 3))
    rng.shuffle(ids)
    row, tables = hkv * d, [ids[sum(need[:b]):sum(need[:b + 1])] for b in range(len(lens))]
    k, v = [float("nan")] * (len(ids) * bs * row), [float("nan")] * (len(ids) * bs * row)
    for b, n in enumerate(lens):
        for j, block in enumerate(tables[b]):
            for slot in range(min(bs, n - j * bs)):
                start = (block * bs + slot) * row
                k[start:start + row] = [normal() for _ in range(row)]
                v[start:start + row] = [normal() for _ in range(row)]
    q = [normal() for _ in range(len(lens) * hq * d)]
    shape = (len(ids), bs, hkv, d)
    tensors = (torch.tensor(q, dtype=torch.float32).reshape(len(lens), hq, d),
               torch.tensor(k, dtype=torch.float32).reshape(shape), torch.tensor(v, dtype=torch.float32).reshape(shape),
               _padded_table(tables, bs), torch.tensor(lens, dtype=torch.int32))
    return tuple(t.to(device or "cpu") for t in tensors)


def _kernel_run(kernel, fn, *args) -> dict:
    try:
        return {"result": kernel(*args, token_offset_fn=fn)}
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the interpreter or the compiler met an error in the student's line
        if "NotImplementedError" in str(exc):
            raise NotImplementedError(f"{fn.fn.__name__} still raises NotImplementedError") from None
        return _raised(exc, type(exc).__name__)


@harness("triton_offset")
def _triton_offset(fn, case) -> dict:
    """4.2: the real kernels compiled with the student's @triton.jit line, on an address case or a kernel case."""
    import torch

    from labsupport import kernels as K

    raise_if_unfinished(fn)
    if not callable(getattr(fn, "fn", None)):
        return {"result": {"not_jit": True}}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if case["kind"] == "addresses":
        lens, table = case["seq_lens"], _padded_table(case["table"], case["block_size"]).to(device)
        seen = _kernel_run(K.kv_token_offsets, fn, table, torch.tensor(lens, dtype=torch.int32, device=device),
                           case["block_size"], case["stride_block"], case["stride_slot"])
        if "result" in seen:
            seen["result"] = [row[:n] for row, n in zip(seen["result"].cpu().tolist(), lens)]
        runs = {"kv_token_offsets": seen}
    else:
        q, k, v, table, seq_lens = kernel_case_tensors(case, device)
        runs = {"paged_gather": _kernel_run(K.paged_gather, fn, k, table, seq_lens),
                "paged_decode_attention": _kernel_run(K.paged_decode_attention, fn, q, k, v, table, seq_lens)}
        for seen in runs.values():
            if "result" in seen:
                seen["result"] = tensor_values(seen["result"])
    return {"result": {"name": str(getattr(fn.fn, "__name__", "function"))[:80], "runs": runs}}


def tensor_values(t) -> dict:
    """A kernel's output tensor as 4.2 holds it: shape, values in order (None for NaN), whether any is NaN."""
    values = t.detach().cpu().float().reshape(-1).tolist()
    return {"shape": list(t.shape), "nan": any(math.isnan(x) for x in values),
            "values": [None if math.isnan(x) else x for x in values]}


@judge("triton_offset")
def _triton_offset_judge(got, spec) -> None:
    """4.2: the addresses exactly, the gather bit for bit, attention within 1e-5 of the torch reference (`want`)."""
    if not isinstance(got, dict):
        raise Mismatch("the kernels' run with your function did not come back.")
    if got.get("not_jit"):
        raise Mismatch("this checkoff wants a @triton.jit function with kv_token_offset's signature (table_row, "
                       "token, valid, BLOCK_SIZE, stride_block, stride_slot); decorate yours with @triton.jit.")
    name, runs, bs = str(got.get("name", "function"))[:80], got.get("runs") or {}, spec["block_size"]
    for kernel in [k for k in ("kv_token_offsets", "paged_gather", "paged_decode_attention") if k in spec["want"]]:
        want, seen = spec["want"][kernel], runs.get(kernel) or {}
        if "raised" in seen:
            kind, text = (list(seen["raised"]) + ["", ""])[:2]
            raise Mismatch(f"{kernel} with your {name} raised {str(kind)[:80]}: {str(text)[:300]}")
        out = seen.get("result")
        if kernel == "kv_token_offsets":
            if not isinstance(out, list) or len(out) != len(want):
                raise Mismatch(f"kv_token_offsets with your {name} returned {echo(out)}, not a tensor of offsets.")
            for b, (row, real) in enumerate(zip(out, want)):
                row = row if isinstance(row, list) else []
                if row != real:
                    t = next((t for t, (g, w) in enumerate(zip(row, real)) if g != w), min(len(row), len(real)))
                    shown = f"{row[t]:,}" if t < len(row) and isinstance(row[t], int) else "nothing"
                    raise Mismatch(f"with block_size={bs}, token {t} of sequence {b} got offset {shown}, not the "
                                   "address of its keys." + (" The block ids here are near 2**31: widen before you "
                                                             "multiply." if spec.get("huge") else ""))
            continue
        if not isinstance(out, dict) or not isinstance(out.get("values"), list):
            raise Mismatch(f"{kernel} with your {name} returned {echo(out)}, not a tensor.")
        pairs = list(zip(out["values"], want["values"])) if out.get("shape") == want["shape"] else None
        if kernel == "paged_gather":
            if pairs is None or any(g is None or g != w for g, w in pairs):
                raise Mismatch(f"paged_gather with your {name} (block_size={bs}, seq_lens={spec['seq_lens']}) copied "
                               "the wrong values: some token was read from the wrong slot of the pool.")
            continue
        gaps = [abs(g - w) if isinstance(g, (int, float)) and not isinstance(g, bool) and math.isfinite(g) else math.inf
                for g, w in pairs or [(None, 0.0)]]
        if pairs is None or any(gap > 1e-5 + 1e-5 * abs(w) for gap, (_, w) in zip(gaps, pairs)):
            raise Mismatch(f"paged_decode_attention with your {name} (block_size={bs}, Hq={spec['q_heads']}, "
                           f"Hkv={spec['kv_heads']}, seq_lens={spec['seq_lens']}) differs from the reference by up to "
                           f"{fmt_number(float(format(max(gaps), '.3g')))}." + (" It produced NaN: it read pool "
                           "slots no sequence owns (they hold NaN)." if out.get("nan") else ""))
