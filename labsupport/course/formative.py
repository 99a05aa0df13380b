"""check() without the graders: the student release's sealed record of each lab's checkoffs.

The graders (labsupport/course/checkoffs) hold every expected value and the generators of hidden
inputs, so `python -m labsupport release` leaves them out.  In their place it writes
``formative/labNN.json``: per checkoff its title, hint and kind, and a sealed payload with what
the in-notebook check() needs to give the same kind of feedback:

    value     the expected number, its tolerance, units and known-mistake remarks (the value
              checkoff's own comparison then runs as in the repository)
    choice    the options, the answer and the remarks (likewise)
    function  the calls the lab's own cases make, with the results the reference solution gave
              (arguments in, result and changed arguments out, as in labsupport.course.codec);
              check() replays them against the student's function and compares
    open      the name of a judge that holds no answer (labsupport.course.open_answers)

"Sealed" means compressed and masked so that no answer can be read off the file or found with a
search; it is not secret from a student who decodes it, and it need not be: it holds the values on
the lecture's givens and the public cases only, while `grade` re-derives every value answer on
hidden givens and tries every function on hidden cases, whose generators are not in the release.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import json
import math
import numbers
import zlib
from pathlib import Path

from labsupport.course import codec
from labsupport.units import fmt_number
from labsupport.course.registry import (Mismatch, RemoteError, call, call_with, choice, describe_call, function,
                                        units_slip, value)

FOLDER = Path(__file__).resolve().parent / "formative"
_MASK_LABEL = b"labsupport formative record"


def _mask(data: bytes, lab: int) -> bytes:
    out = bytearray(len(data))
    block, counter = b"", 0
    for i, byte in enumerate(data):
        if i % 32 == 0:
            block = hashlib.sha256(_MASK_LABEL + bytes([lab]) + counter.to_bytes(8, "big")).digest()
            counter += 1
        out[i] = byte ^ block[i % 32]
    return bytes(out)


def seal(payload, lab: int) -> str:
    return base64.b64encode(_mask(zlib.compress(codec.dumps(payload, objects=True).encode(), 9), lab)).decode()


def unseal(text: str, lab: int):
    return codec.loads(zlib.decompress(_mask(base64.b64decode(text), lab)), objects=True)


def register_lab(lab: int, folder: Path = FOLDER) -> int:
    """Register lab `lab`'s checkoffs from its sealed record (none when there is no record)."""
    path = folder / f"lab{lab:02d}.json"
    if not path.is_file():
        return 0
    record = json.loads(path.read_text(encoding="utf-8"))
    for entry in record["checkoffs"]:
        _register(entry, unseal(entry["sealed"], lab))
    return len(record["checkoffs"])


def _register(entry: dict, payload: dict) -> None:
    cid, title, hint, kind = entry["id"], entry["title"], entry["hint"], entry["kind"]
    if kind == "choice":
        choice(cid, title, answer=payload["answer"] if isinstance(payload["answer"], str) else set(payload["answer"]),
               options=payload["options"], hint=hint, mistakes=payload.get("mistakes"))
    elif kind == "value" and "answer" not in payload:
        value(cid, title, expected=payload["expected"], hint=hint, rel_tol=payload["rel_tol"],
              abs_tol=payload["abs_tol"], unit=payload["unit"], mistakes=[tuple(m) for m in payload["mistakes"]])
    elif kind == "value":
        spec = payload.get("spec", {})
        value(cid, title, expected=payload["answer"], hint=hint,
              judge=lambda answer, want, spec=spec: compare_answer(answer, want, spec))
    elif "open" in payload:
        module, _, name = payload["open"].partition(":")
        judge = getattr(importlib.import_module(module), name)
        function(cid, title, hint=hint)(lambda fn, judge=judge: judge(fn))
    else:
        calls, tol = payload["calls"], (payload.get("rel_tol", 1e-6), payload.get("abs_tol", 1e-9))
        function(cid, title, hint=hint, cases=lambda rng, calls=calls: calls)(
            lambda fn, recorded, tol=tol: replay(fn, recorded, *tol))


# --- comparing without a judge ---------------------------------------------------------------------------

def _show(x) -> str:
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


def same(got, want, rel_tol: float, abs_tol: float, where: str = "") -> str:
    """'' when `got` matches `want` (numbers within the tolerance), else what differs and where."""
    at = f" at {where}" if where else ""
    if want is None:
        return "" if got is None else f"{_show(got)}{at} where nothing (None) was expected"
    if isinstance(want, bool):
        return "" if got is want else f"{_show(got)}{at} where a truth value was expected"
    if isinstance(want, numbers.Real):
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            item = getattr(got, "item", None)
            try:
                got = item() if item is not None and getattr(got, "numel", lambda: 1)() == 1 else got
            except (ValueError, RuntimeError, TypeError):
                pass
            if isinstance(got, bool) or not isinstance(got, numbers.Real):
                return f"{_show(got)}{at}, which is not a number"
        if isinstance(want, int) and isinstance(got, float) and not got.is_integer():
            return f"{fmt_number(got)}{at}, which is not a whole number"
        if math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=abs_tol):
            return ""
        slip = units_slip(float(got), float(want))
        return f"{fmt_number(got)}{at}, which is too {'high' if got > want else 'low'}" + (f" ({slip})" if slip else "")
    if isinstance(want, str):
        if isinstance(got, str) and got.strip().lower() == want.strip().lower():
            return ""
        return f"{_show(got)}{at}"
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{_show(got)}{at} where a sequence of {len(want)} was expected"
        if len(got) != len(want):
            return f"{len(got)} items{at} where {len(want)} were expected"
        for i, (g, w) in enumerate(zip(got, want)):
            problem = same(g, w, rel_tol, abs_tol, f"{where}[{i}]")
            if problem:
                return problem
        return ""
    if isinstance(want, (set, frozenset)):
        try:
            return "" if set(got) == set(want) else f"{_show(got)}{at}"
        except TypeError:
            return f"{_show(got)}{at}"
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{_show(got)}{at} where a dict with the keys {sorted(map(str, want))} was expected"
        for key in want:
            problem = same(got[key], want[key], rel_tol, abs_tol, f"{where}[{key!r}]")
            if problem:
                return problem
        return ""
    if hasattr(want, "dtype") and hasattr(want, "shape"):
        import torch

        if not isinstance(got, torch.Tensor):
            return f"a {type(got).__name__}{at} where a tensor was expected"
        got = got.detach().cpu()
        if tuple(got.shape) != tuple(want.shape):
            return f"a tensor of shape {tuple(got.shape)}{at} where {tuple(want.shape)} was expected"
        if want.dtype.is_floating_point:
            ok = got.dtype.is_floating_point and torch.allclose(got.to(want.dtype), want, rtol=max(rel_tol, 1e-5),
                                                                 atol=1e-5, equal_nan=True)
        else:
            ok = not got.dtype.is_floating_point and torch.equal(got.to(want.dtype), want)
        return "" if ok else f"a tensor{at} whose values differ from the expected ones"
    return ""  # nothing plain to compare


def compare_answer(answer, want, spec: dict) -> None:
    """A structured value answer against the reference's, key by key (the release's judge of 5.3, 6.3)."""
    if isinstance(want, dict):
        if not isinstance(answer, dict) or set(answer) != set(want):
            raise Mismatch(f"answer with a dict with exactly the keys {sorted(want)}; you gave {_show(answer)}.")
        for key, w in want.items():
            got = answer[key]
            if key in spec.get("unordered", ()):
                try:
                    got, w = sorted(got), sorted(w)
                except TypeError:
                    raise Mismatch(f"{key!r} is {_show(got)}; give a list of numbers.") from None
            rel, abs_ = spec.get("per_key", {}).get(key, (spec.get("rel_tol", 1e-9), spec.get("abs_tol", 0.0)))
            problem = same(got, w, rel, abs_)
            if problem:
                raise Mismatch(f"{key!r}: you gave {problem}.")
        return
    problem = same(answer, want, spec.get("rel_tol", 1e-9), spec.get("abs_tol", 0.0))
    if problem:
        raise Mismatch(f"you gave {problem}.")


def replay(fn, recorded: dict, rel_tol: float, abs_tol: float) -> None:
    """One recorded call of the reference solution, made again with the student's function."""
    feed: list = list(recorded.get("callbacks", []))
    used = [0]

    class Handed:
        """The function the reference was handed (3.2's take_free_block): it replays what it returned."""

        name = "<the function it was handed>"

        def __call__(self, *args, **kwargs):
            used[0] += 1
            return feed[used[0] - 1] if used[0] <= len(feed) else -1

    def stub(number):
        return Handed()

    args = codec.from_plain(recorded["args"], objects=True, callback=stub)
    kwargs = codec.from_plain(recorded["kwargs"], objects=True, callback=stub)
    if "target" in recorded:
        module, _, name = recorded["target"].partition(":")
        target = importlib.import_module(module)
        for attr in name.split("."):
            target = getattr(target, attr)
        what = f"{target.__name__} with your {getattr(getattr(fn, 'fn', fn), '__name__', 'function')}"
        try:
            got = call_with(fn, target, *args, answer_kw=recorded["answer_kw"], **kwargs)
        except (NotImplementedError, Mismatch):
            raise
        except Exception as exc:  # noqa: BLE001 - Triton reports an error inside the student's line
            kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
            if "NotImplementedError" in str(exc):
                raise NotImplementedError(f"{what}: still raises NotImplementedError") from None
            raise Mismatch(f"{what} raised {kind}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}") from None
    else:
        what = describe_call(fn, args, kwargs)
        got = call(fn, *args, **kwargs)
    if used[0] != len(feed):
        raise Mismatch(f"{what} called the function it was handed {used[0]} time(s); the reference called it "
                       f"{len(feed)} time(s).")
    problem = same(got, codec.from_plain(recorded["result"]), rel_tol, abs_tol)
    if problem:
        raise Mismatch(f"{what} returned {problem}.")
    # an argument the reference changed in place must end the same; one it left alone must stay so
    after = recorded.get("after") or {}
    before = [*recorded["args"]], dict(recorded["kwargs"])
    for key, value_now in [*enumerate(args), *kwargs.items()]:
        if not (isinstance(value_now, (list, dict)) or hasattr(value_now, "dtype")):
            continue
        want = after.get(str(key), before[0][key] if isinstance(key, int) else before[1][key])
        problem = same(value_now, codec.from_plain(want, objects=True, callback=stub), rel_tol, abs_tol)
        if problem:
            changed = "changed it differently" if str(key) in after else "left it as it was"
            raise Mismatch(f"{what} left its argument {key} as {problem}; the reference {changed}.")
