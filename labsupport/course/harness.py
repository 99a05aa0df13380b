"""The harness: a handed-in function run on a checkoff's cases, in the process the function lives in (every lab).

`observe` calls the function on a case (plain data, never its expected result) and writes down, as plain data, what
it saw: {"result": ...} (and {"after": {i: argument i}}), {"raised": [type, message]}, {"unfinished": prompt} or
{"timeout": seconds}.  labsupport.course.judge judges that outside the function's reach; a function driven step by
step names a harness of `HARNESSES`, an answer no generic rule fits a judge of `judge.JUDGES`.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import json
import math
import random
import re
import signal
import threading

from labsupport.course import data
from labsupport.course.judge import JUDGES, Mismatch, echo
from labsupport.units import fmt_number

CASE_SECONDS = 60  # one call of a student's function, at most (a hang fails its case, not the notebook)
HARNESSES: dict = {}
LAST_ERROR: BaseException | None = None  # the last exception a student's function raised (check() shows its frames)


class TimeLimit(BaseException):
    """The case ran past its time (a BaseException: `except Exception` in the student's code lets it through)."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimit

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def observe(fn, case: dict, seconds: float | None = CASE_SECONDS, shared: list = ()) -> dict:
    """What `fn` did on `case` (its input; `shared`: the values its {"$": "ref"} items name, `data.share`)."""
    try:
        with time_limit(seconds):
            if "harness" in case:
                return HARNESSES[case["harness"]](fn, data.resolve(case.get("data"), shared))
            args, kwargs = data.build(case.get("args", []), shared), data.build(case.get("kwargs", {}), shared)
            seen = {"result": data.plain(fn(*args, **kwargs))}
            if case.get("after"):
                seen["after"] = {str(i): data.plain(args[i]) for i in case["after"]}
            return seen
    except TimeLimit:
        return {"timeout": seconds}
    except NotImplementedError as exc:
        return {"unfinished": str(exc)[:500]}
    except data.DataError as exc:
        return {"raised": ["an answer too large", str(exc)]}
    except Exception as exc:  # noqa: BLE001 - the student's bug, reported as the call that met it
        return _raised(exc)


def _raised(exc: Exception, blank: str = "") -> dict:
    """A student's exception as an observation, its type and last line (`blank` if none); LAST_ERROR keeps it."""
    global LAST_ERROR
    LAST_ERROR = exc
    try:
        text = str(exc).strip()
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = ""
    return {"raised": [type(exc).__name__, (text.splitlines() or [blank])[-1][:300]]}


def _register(table: dict, name: str):
    def register(fn):
        table[name] = fn
        return fn
    return register


harness, judge = functools.partial(_register, HARNESSES), functools.partial(_register, JUDGES)


def _normal(text):
    return " ".join(text.split()).lower() if isinstance(text, str) else text


@judge("matching")
def _matching(got, spec) -> None:
    """Labs 01 and 08: items matched to options, a dict or a list.  spec: want, options, noun, remarks {"k=option"}."""
    want, options, noun = spec["want"], {_normal(o) for o in spec["options"]}, spec.get("noun", "item")
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise Mismatch(f"answer with a dict from each {noun} to its match; you gave {echo(got)}.")
        if stray := [k for k in got if _normal(k) not in want]:
            raise Mismatch(f"{echo(stray[0])} is not one of the {noun}s: {', '.join(want)}.")
        answer = {_normal(k): v for k, v in got.items()}
        if missing := [k for k in want if k not in answer]:
            raise Mismatch(f"{len(missing)} of the {len(want)} {noun}s {'is' if len(missing) == 1 else 'are'} "
                           f"missing: {', '.join(missing)}.")
        pairs = [(k, answer[k], want[k]) for k in want]
    else:
        if not isinstance(got, list) or len(got) != len(want):
            raise Mismatch(f"answer with a list of {len(want)}, one per {noun} in its order; you gave {echo(got)}.")
        pairs = [(str(i), g, w) for i, (g, w) in enumerate(zip(got, want), start=1)]
    listed = ": " + ", ".join(spec["options"]) if len(options) <= 5 else " the options listed above the exercise"
    for key, value, _ in pairs:
        if _normal(value) not in options:
            raise Mismatch(f"{noun} {key}: {echo(value)} is not one of{listed}.")
    if wrong := [(k, _normal(v)) for k, v, w in pairs if _normal(v) != _normal(w)]:
        remarks = " ".join(spec.get("remarks", {}).get(f"{k}={v}", "") for k, v in wrong).strip()
        raise Mismatch(f"{len(wrong)} of the {len(pairs)} {'is' if len(wrong) == 1 else 'are'} not right "
                       f"({', '.join(k for k, _ in wrong)})." + (f" {remarks}" if remarks else ""))


# --- lab 03: 3.2's append, in lockstep with the real allocator ----------------------------------------------
@harness("append")
def _append(fn, case) -> dict:
    """Random traffic on the real BlockAllocator, which appends too (in take_free_block or after the call); per append,
    the table and length given, the blocks taken, the table left and the slot returned."""
    from labsupport.block_allocator import BlockAllocator

    bs, steps, names = case["block_size"], [], itertools.count()
    rng, alloc = random.Random(case["seed"]), BlockAllocator(80, bs)
    for _ in range(300):
        live = list(alloc.block_tables)
        if rng.random() < 0.15 or not live:
            n = rng.randint(0, 2 * bs + 3)
            if alloc.can_allocate(alloc.blocks_needed(n)):
                alloc.allocate(f"s{next(names)}", n)
            continue
        seq = rng.choice(live)
        if alloc.seq_lens[seq] % bs == 0 and not alloc.num_free_blocks:
            alloc.free(seq)
            continue
        before, n, given = list(alloc.block_tables[seq]), alloc.seq_lens[seq], []
        full = n == len(before) * bs

        def take_free_block():
            if full and not given:
                alloc.append_slot(seq)
                given.append(alloc.block_tables[seq][-1])
            else:
                given.append(alloc.num_blocks + 1000)  # a block no pool has: the call was not needed
            return given[-1]

        table = list(before)
        result = fn(table, n, bs, take_free_block)
        if not (full and given):
            alloc.append_slot(seq)
        steps.append({"table": before, "seq_len": n, "took": len(given), "after": data.plain(table),
                      "slot": data.plain(result)})
    return {"result": steps}


@judge("append")
def _append_steps(got, spec) -> None:
    """3.2: a block taken exactly when the last one was full, then the real allocator's table and slot."""
    want, bs = spec["want"], spec["block_size"]
    if not isinstance(got, list) or len(got) != len(want):
        raise Mismatch("append(...) did not answer every step of the run.")
    for seen, real in zip(got, want):
        what = f"append(table={real['table']}, seq_len={real['seq_len']}, block_size={bs}, take_free_block)"
        if seen["took"] > real["took"]:
            raise Mismatch(f"{what} asked for a new block "
                           f"{'a second time' if real['took'] else 'although its last block still had room'}.")
        if seen["took"] < real["took"]:
            raise Mismatch(f"{what} did not take a new block, but the last block was full ({len(real['table'])} "
                           f"blocks x {bs} slots hold {len(real['table']) * bs} tokens).")
        if seen["after"] != real["after"]:
            raise Mismatch(f"{what} left the table as {echo(seen['after'])}; the real allocator's table is now "
                           f"{real['after']}. Append the new block to the table you were given (modify it in place).")
        if seen["slot"] != real["slot"]:
            raise Mismatch(f"{what} returned {echo(seen['slot'])}, which is not the slot the real allocator writes "
                           "this token to.")


# --- lab 04: 4.2's address line compiled into the real kernels ----------------------------------------------
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


# --- lab 05: 5.1's copy-on-write append on a scripted fork/append/free world; 5.3's reference counts; 5.4's history
class CowWorld:
    """The plain structures 5.1's `cow_append` edits, and BlockAllocator's other operations on them."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size, self.tables, self.seq_lens = block_size, {}, {}
        self.ref_counts, self.free_blocks = [0] * num_blocks, list(range(num_blocks))

    def allocate(self, seq, tokens):
        table = [self.free_blocks.pop(0) for _ in range(-(-tokens // self.block_size))]
        for b in table:
            self.ref_counts[b] = 1
        self.tables[seq], self.seq_lens[seq] = table, tokens

    def fork(self, parent, child):
        self.tables[child], self.seq_lens[child] = list(self.tables[parent]), self.seq_lens[parent]
        for b in self.tables[child]:
            self.ref_counts[b] += 1

    def free(self, seq):
        for b in reversed(self.tables.pop(seq)):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        del self.seq_lens[seq]


@harness("cow_append")
def _cow_append(fn, case) -> dict:
    """5.1: the script on plain structures, the function doing every append; a step it raised on ends the run."""
    world, steps = CowWorld(case["num_blocks"], case["block_size"]), []
    for op in case["ops"]:
        step = {}
        try:
            if op[0] == "append":
                step["returned"] = data.plain(fn(op[1], world.tables, world.seq_lens, world.ref_counts,
                                                 world.free_blocks, world.block_size))
            else:
                getattr(world, "allocate" if op[0] == "alloc" else op[0])(*op[1:])
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the student's bug, or structures it left that the script cannot use
            steps.append(_raised(exc) if op[0] == "append" else {"broken": [type(exc).__name__, str(exc)[:200]]})
            break
        steps.append({**step, "tables": [[data.plain(s), data.plain(t)] for s, t in world.tables.items()],
                      "seq_lens": [[data.plain(s), data.plain(n)] for s, n in world.seq_lens.items()],
                      "ref_counts": data.plain(world.ref_counts), "free": len(world.free_blocks)})
    return {"result": steps}


def _pairs(items) -> dict:
    pairs = [item for item in items if isinstance(item, list) and len(item) == 2] if isinstance(items, list) else []
    return {tuple(k) if isinstance(k, list) else k: v for k, v in pairs if not isinstance(k, dict)}


@judge("cow_append")
def _cow_append_steps(got, spec) -> None:
    """5.1, step by step against the real BlockAllocator's run (`want`): each append's slot and copy, then the pool."""
    bs, got, before = spec["block_size"], got if isinstance(got, list) else [], {}
    for number, (op, real) in enumerate(zip(spec["ops"], spec["want"]), start=1):
        where = f"In '{spec['name']}', step {number} ({op[0]} {', '.join(map(repr, op[1:]))})"
        seen = got[number - 1] if number - 1 < len(got) and isinstance(got[number - 1], dict) else {}
        if "raised" in seen:
            kind, text = (list(seen["raised"]) + ["", ""])[:2]
            raise Mismatch(f"{where}: cow_append raised {str(kind)[:80]}: {str(text)[:300]}".rstrip(": ") + ".")
        if "broken" in seen:
            kind, text = (list(seen["broken"]) + ["", ""])[:2]
            raise Mismatch(f"{where}: your structures could not carry this operation ({str(kind)[:80]}: "
                           f"{str(text)[:200]}).")
        if "tables" not in seen:
            raise Mismatch(f"{where}: the run stopped before this step.")
        if op[0] == "append":
            returned, (real_slot, real_cow) = seen.get("returned"), real["returned"]
            if not isinstance(returned, list) or len(returned) != 2:
                raise Mismatch(f"{where}: cow_append returned {echo(returned)}; return a pair (slot, cow).")
            slot, cow = returned
            if not isinstance(slot, int):
                raise Mismatch(f"{where}: the slot is {echo(slot)}; it is one integer, block_id * block_size + offset.")
            table = _pairs(seen["tables"]).get(op[1])
            if slot % bs != real_slot % bs:
                raise Mismatch(f"{where}: your slot {slot} sits at offset {slot % bs} of its block; the token belongs "
                               f"at offset {real_slot % bs} (the sequence's length modulo the block size).")
            if not isinstance(table, list) or not table or slot // bs != table[-1]:
                raise Mismatch(f"{where}: your slot {slot} is in block {slot // bs}, but the token must go into the "
                               "sequence's last block as its table names it after the append.")
            if (cow is None) != (real_cow is None):
                raise Mismatch(f"{where}: you " + ("copied a block" if real_cow is None else "did not copy")
                               + "; this append " + ("must write without copying" if real_cow is None
                                                     else "lands in a block someone else still names") + ".")
            old = before.get(op[1])
            if cow is not None and (not isinstance(cow, list) or not isinstance(old, list) or not old
                                    or cow != [old[-1], table[-1]]):
                raise Mismatch(f"{where}: cow is {echo(cow)}; it should be (the block you copy from, the block you "
                               "copy into) — the old last block and the new one.")
        # then the pool, up to renaming of block ids
        tables, lens, counts = _pairs(seen.get("tables")), _pairs(seen.get("seq_lens")), seen.get("ref_counts")
        counts = counts if isinstance(counts, list) else []
        real_lens, rename = _pairs(real["seq_lens"]), {}
        for seq, table in _pairs(real["tables"]).items():
            mine = tables.get(seq)
            if not isinstance(mine, list) or len(mine) != len(table):
                raise Mismatch(f"{where}: sequence {seq!r} should hold {len(table)} block(s); your block table has "
                               f"{'none' if not isinstance(mine, list) else len(mine)}.")
            if lens.get(seq) != real_lens[seq]:
                raise Mismatch(f"{where}: seq_lens[{seq!r}] is {echo(lens.get(seq))}, it should be {real_lens[seq]}: "
                               "the append must count the token it placed.")
            for i, (m, r) in enumerate(zip(mine, table)):
                if isinstance(m, (list, dict)) or rename.setdefault(m, r) != r:
                    raise Mismatch(f"{where}: your block table makes {seq!r}'s block {i} the same physical block "
                                   "as another entry that should be a different block — a block is shared that "
                                   "should have been copied (or the other way round).")
        if len(set(rename.values())) != len(rename):
            raise Mismatch(f"{where}: two entries that should share one physical block name different blocks in your "
                           "tables — something was copied that is still shared.")
        for m, r in rename.items():
            count = counts[m] if isinstance(m, int) and 0 <= m < len(counts) else None
            if count != real["ref_counts"][r]:
                holders = sum(m in t for t in tables.values() if isinstance(t, list))
                raise Mismatch(f"{where}: a block held by {holders} table entr(ies) has ref_count {echo(count)} in "
                               f"your structures; it should be {real['ref_counts'][r]}.")
        used = sum(1 for c in counts if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0)
        real_used = sum(1 for c in real["ref_counts"] if c > 0)
        if used != real_used or seen.get("free") != real["free"]:
            raise Mismatch(f"{where}: {used} blocks are in use and {echo(seen.get('free'))} free in your structures; "
                           f"the pool should have {real_used} in use and {real['free']} free (a block taken from the "
                           "free list must get ref_count 1, and only one block per append).")
        before = tables


@judge("refcounts_in_use")
def _refcounts_in_use(got, spec) -> None:
    """5.3's 'refcounts': every in-use block's ref_count, in any order (want and mistakes sorted).  spec: writers."""
    want = spec["want"]
    got = list(got) if isinstance(got, (frozenset, tuple)) else got
    if not isinstance(got, list):
        raise Mismatch(f"list the ref_count of every block in use, e.g. [8, 8, 1]; you gave {echo(got)}.")
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in got):
        raise Mismatch(f"reference counts are whole numbers; you gave {echo(got)}.")
    if 0 in got:
        raise Mismatch("you list a block with ref_count 0; a block nobody names is free, not in use — leave it out.")
    got = sorted(got)
    if got == want:
        return
    problem = "you have the right number of blocks in use, but not their reference counts."
    if len(got) != len(want):
        problem = f"you list {len(got)} blocks in use; the pool holds {len(want)} after those {spec['writers']} writes."
    remark = next((r for w, r in spec.get("mistakes", ()) if w == got), "")
    raise Mismatch(problem + (f" {remark}" if remark else ""))


@judge("copies_after_all_write")
def _copies_after_all_write(got, spec) -> None:
    """5.3's 'copies': block copies once every branch has written a token.  spec: want, branches, mistakes."""
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
        raise Mismatch(f"give a whole number of block copies; you gave {echo(got)}.")
    if got == spec["want"]:
        return
    remark = next((r for w, r in spec.get("mistakes", ()) if w == got), "")
    raise Mismatch(f"{int(got)} block copies is too {'many' if got > spec['want'] else 'few'} for all "
                   f"{spec['branches']} branches to have written one token each." + (f" {remark}" if remark else ""))


@judge("fanout")
def _fanout(got, spec) -> None:
    """5.2: (unshared_blocks, shared_blocks).  spec: want, what, slips {"unshared"/"shared": [[count, remark]]}."""
    want, what = spec["want"], spec["what"]
    if not isinstance(got, list) or len(got) != 2:
        raise Mismatch(f"{what} returned {echo(got)}; return a pair (unshared_blocks, shared_blocks).")
    for label, g, w in (("unshared", got[0], want[0]), ("shared", got[1], want[1])):
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g != int(g):
            raise Mismatch(f"{what}: the {label} count is {echo(g)}; blocks are whole numbers.")
        if g != w:
            remark = next((r for wrong, r in spec.get("slips", {}).get(label, ()) if wrong == g), "")
            raise Mismatch(f"{what}: your {label} count is {int(g):,}, the allocator holds a different number "
                           f"({'more' if w > g else 'fewer'})." + (f" {remark}" if remark else ""))


@judge("prefix_hits")
def _prefix_hits(got, spec) -> None:
    """5.4: the blocks an unbounded prefix index serves.  spec: want, label (the input, in words)."""
    if isinstance(got, bool) or not isinstance(got, int):
        raise Mismatch(f"prefix_hit_blocks(...) returned {echo(got)}; return the number of blocks served by the "
                       "index.")
    if got != spec["want"]:
        raise Mismatch(f"on {spec['label']} you count {got:,} hits; the allocator's prefix index serves "
                       f"{'fewer' if spec['want'] < got else 'more'}.")


def chat_hash_ids(seed: int, requests: int) -> list[list[int]]:
    """5.4's long input: made-up prompts as block ids, shaped like the Mooncake conversation trace's hash ids."""
    rng, ids_made, out, sessions = random.Random(seed), itertools.count(), [], []

    def fresh(k: int) -> list[int]:
        return [next(ids_made) for _ in range(k)]

    systems = [fresh(rng.randint(1, 6)) for _ in range(8)]
    for _ in range(requests):
        r = rng.random()
        if sessions and r < 0.6:  # the next turn of a conversation: everything before, then the new blocks
            i = rng.randrange(len(sessions))
            ids = sessions[i] = sessions[i] + fresh(rng.randint(1, 4))
        elif sessions and r < 0.75:  # a regenerated or edited turn: part of an earlier prompt, then new blocks
            base = rng.choice(sessions)
            ids = base[:rng.randint(1, len(base))] + fresh(rng.randint(0, 3))
        else:  # a new conversation on one of the system prompts
            ids = rng.choice(systems) + fresh(rng.randint(1, 8))
            sessions.append(ids)
            if len(sessions) > 40:
                sessions.pop(rng.randrange(len(sessions)))
        out.append(list(ids))
    return out


# --- labs 06 and 07 -------------------------------------------------------------------------------------------
@judge("preemption_plan")
def _preemption_plan(got, spec) -> None:
    """6.2: the victims in the engine's order, each swapped or recomputed.  spec: want, what, blocks_needed, tokens."""
    want, what, need = spec["want"], spec["what"], spec["blocks_needed"]
    if isinstance(got, str) or not isinstance(got, list):
        raise Mismatch(f"{what} returned {echo(got)}; return a list of (name, 'swap' or 'recompute') pairs.")
    if any(not isinstance(x, list) or len(x) != 2 for x in got):
        raise Mismatch(f"{what} returned {echo(got)}; each entry is a pair (name, 'swap' or 'recompute').")
    names_got, names_want = [x[0] for x in got], [x[0] for x in want]
    if names_got != names_want:
        if sorted(map(repr, names_got)) == sorted(map(repr, names_want)):
            raise Mismatch(f"{what}: you preempt the right sequences in the wrong order.")
        raise Mismatch(f"{what}: you preempt {echo(names_got, 200)}; that is "
                       f"{'too many' if len(names_got) > len(names_want) else 'not the right set'} for {need} "
                       "block(s) under the engine's first-come-first-served policy.")
    for (name, kind), (_, want_kind) in zip(got, want):
        if not isinstance(kind, str) or kind.strip().lower() not in ("swap", "recompute"):
            raise Mismatch(f"{what}: the decision for {name!r} is {echo(kind)}; answer 'swap' or 'recompute'.")
        if kind.strip().lower() != want_kind:
            raise Mismatch(f"{what}: {name!r} ({spec['tokens'][name]:,} tokens) should not be preempted by "
                           f"{kind!r} on this link.")


def engine_requests(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.3's and 7.4's input: the RequestResults of a small run of the real engine (cost-model clock), the same
    anywhere: `n_req` random requests at `rate` per second, then one that never fits, on `blocks` blocks of 16."""
    from labsupport.replay import replay

    rng, t, requests = random.Random(seed), 0.0, []
    for _ in range(n_req):
        t += rng.expovariate(rate)
        requests.append((t, rng.randint(16, 3000), rng.choice([1, 2, 40, 200])))
    requests.append((t, 200_000, 10))  # never fits: rejected
    return list(replay(requests, num_blocks=blocks, record_token_times=True).result.requests.values())


def engine_run(seed: int, rate: float, blocks: int, n_req: int) -> tuple[list, list]:
    """A small run of the real engine (cost-model clock, the lecture's 7B on its H100, `blocks` blocks of 16) whose
    first arrival, at t = 0, never fits and is refused, so it never finishes; then `n_req` random requests at `rate`
    per second, some ending after one token (no TPOT), some sampling two or three branches.  Returns every step's
    `StepOutput` and every request's `RequestResult`."""
    from labsupport.costmodel import CostModel
    from labsupport.engine import Engine

    rng, t = random.Random(seed), 0.0
    engine = Engine(cost_model=CostModel(), num_blocks=blocks, block_size=16, record_token_times=True)
    engine.add_request(prompt_len=200_000, max_new_tokens=10, arrival_time=0.0)  # never fits: refused
    for _ in range(n_req):
        t += rng.expovariate(rate)
        engine.add_request(prompt_len=rng.randint(16, 3000), max_new_tokens=rng.choice([1, 2, 40, 200]),
                           n=rng.choice([1, 1, 1, 2, 3]), arrival_time=t)
    steps = [out for out, _ in engine.iterations(idle=True)]
    return steps, list(engine.result().requests.values())


def engine_run_requests(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.3's input: the RequestResults of `engine_run`."""
    return engine_run(seed, rate, blocks, n_req)[1]


def engine_run_steps(seed: int, rate: float, blocks: int, n_req: int) -> list:
    """7.7's input: the StepOutputs of `engine_run`, the engine's log of its iterations."""
    return engine_run(seed, rate, blocks, n_req)[0]


# --- lab 08: 8.7 is an open question (any decode-heavy workload with the property passes): no answer here -------
@judge("utilization_workload")
def _utilization_workload(got, spec) -> None:
    """8.7: the returned (arrival_s, prompt_tokens, output_tokens) workload, run naive and paged."""
    from labsupport.replay import utilization_run

    try:
        requests = [(float(a), int(p), int(o)) for a, p, o in got]
    except (TypeError, ValueError, OverflowError):
        raise Mismatch("utilization_workload() must return a list of (arrival_s, prompt_tokens, output_tokens) "
                       "tuples.") from None
    if not 100 <= len(requests) <= 1500:
        raise Mismatch(f"your workload has {len(requests)} requests; use between 100 and 1,500 so the "
                       "comparison means something and the grader stays quick.")
    for a, p, o in requests:
        if not math.isfinite(a) or a < 0 or p < 1 or o < 1 or p + o > 4096:
            raise Mismatch(f"request (arrival {a}, prompt {p}, output {o}) is not allowed: arrivals >= 0, at "
                           "least one prompt and one output token, and prompt + output within S_max = 4,096.")
    if sum(p + o for _, p, o in requests) > 3_000_000:
        raise Mismatch("your workload holds more than 3 million tokens in all; a smaller one makes the point.")
    if prefill_heavy := sum(o < p for _, p, o in requests):
        raise Mismatch(f"{prefill_heavy} of your {len(requests)} requests have a prompt longer than their output; "
                       "this construction asks for a decode-heavy workload, every output at least as long as its "
                       "prompt (the sweep's chat requests are 512 in, 128 out, the other way round). Its rates do not "
                       "carry over as they are: a request's life on the card is set by how many steps it decodes.")
    try:  # one S_max block per sequence (reserve-to-max), then paging
        naive, paged = utilization_run(requests, 4096), utilization_run(requests, 16)
    except ValueError as exc:
        raise Mismatch(f"your workload does not run: {exc}") from None
    naive_util, naive_tput, naive_peak = naive.utilization, naive.throughput_tok_s, naive.peak_running
    paged_util, paged_tput = paged.utilization, paged.throughput_tok_s
    if naive_util > 0.20:
        raise Mismatch(f"under reserve-to-max your workload already uses {naive_util:.1%} of what it reserves; the "
                       "claim starts near 15%.")
    if naive_util < 0.10:
        raise Mismatch(f"under reserve-to-max your workload uses only {naive_util:.1%} of what it reserves; the claim "
                       "starts near 15% — sequences so short are not the workload the lecture means (its chat "
                       "sequences hold 640 of 4,096 tokens).")
    slots = naive.slots  # reserve-to-max's slots on the course card (the lecture's 29)
    busy = slots * 2 // 3 + 1  # more than two thirds of them: a load at which slots could bind, so "unmoved" is a finding
    if naive_peak < busy:
        raise Mismatch(f"at its busiest the reserve-to-max engine runs only {naive_peak} sequences of its {slots} slots: "
                       "on a card that idle nothing could move throughput, and the claim says nothing. Raise the arrival "
                       f"rate until the naive engine runs at least {busy} at once, and see whether throughput still holds.")
    if paged_util < 0.95:
        raise Mismatch(f"paged utilization is only {paged_util:.1%}; the claim ends near 99%.")
    if not naive_tput > 0:
        raise Mismatch("no request of your workload finished under reserve-to-max; the engine produced no tokens.")
    if abs(paged_tput / naive_tput - 1) > 0.05:
        raise Mismatch(f"throughput moved from {naive_tput:,.0f} to {paged_tput:,.0f} tok/s "
                       f"({paged_tput / naive_tput - 1:+.1%}); it should barely move (within 5%).")


# --- lab 08: 8.8's changed machine, handed back as the specs' fields --------------------------------------------
@harness("spec_fields")
def _spec_fields(fn, case) -> dict:
    """Call fn(*args) on labsupport specs; what comes back is a pair of specs, read as their fields (plain data)."""
    from dataclasses import asdict, is_dataclass

    result = fn(*data.build(case["args"]))
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(is_dataclass(r) for r in result)):
        return {"result": data.plain(result) if isinstance(result, (int, float, str, list, tuple)) else
                f"a {type(result).__name__}"}
    return {"result": [{type(r).__name__: asdict(r)} for r in result]}
