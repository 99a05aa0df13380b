"""The judge: an answer against a checkoff's expected value, in one line of feedback (every lab).

`check()` (from the lab's public record) and `grade` (from the graders, on hidden givens and cases too)
both end here, with the answer as plain data and a *spec*, the expected value and how to compare it
(a message never contains the expected value):

    want              the expected value (a number, text, a list, a dict, a tensor)
    rel_tol, abs_tol  how close a number must be (default: exactly, 1e-9 relative)
    unit              shown after a number the student gave (" B")
    mistakes          [[a known wrong answer, the remark that names its mistake], ...]
    what              for a function: the call, as the message names it ("tail_waste(7, 16)")
    keys              for a dict: a spec per key (its own tolerance and mistakes)
    unordered         for a list: compared as a multiset
    whole             a count: a fraction is wrong whatever its size
    at_least          a floor no answer goes below (a count of what fits is 0 when nothing does)
    options, multi    for a choice: the options, and whether the answer is a set of them
    judge             the name of one of `JUDGES`, for an answer no generic rule fits
"""
from __future__ import annotations

import math
import numbers

from labsupport.course.data import Other, Tensor, unplain
from labsupport.units import fmt_number


class Mismatch(Exception):
    """The answer is wrong; the message says how, in one sentence or two."""


def echo(x, limit: int = 80) -> str:
    """What the student handed in, as a message repeats it: short."""
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 200:
        return f"a whole number of {x.bit_length():,} bits"
    if isinstance(x, Other):
        text = f"a {x.name}" if x.kind == "object" else f"the function {x.name}"
    elif isinstance(x, Tensor):
        text = f"a {x.dtype} tensor of shape {list(x.shape)}"
    else:
        text = repr(x)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def scalar(x):
    """A tensor holding one value (a 0-d torch tensor or numpy array, ``t.sum()``) as that value: a number
    wherever a number is expected; anything else as it is."""
    return x.values[0] if isinstance(x, Tensor) and len(x.values) == 1 else x


def as_number(x, what: str) -> float:
    """A real number, or a Mismatch saying what `what` is instead."""
    x = scalar(x)
    if isinstance(x, Other) and x.kind == "function":
        raise Mismatch(f"{what} is a function; call it and pass the number it returns.")
    if isinstance(x, bool) or x is None:
        raise Mismatch(f"{what} is {echo(x)}, not a number. Did your code forget to return or assign it?")
    if not isinstance(x, numbers.Real):
        raise Mismatch(f"{what} is {echo(x)}, not a number.")
    if isinstance(x, int) and x.bit_length() > 1000:
        raise Mismatch(f"{what} is a whole number of {x.bit_length():,} bits, too large to be the answer.")
    x = float(x)
    if not math.isfinite(x):
        raise Mismatch(f"{what} is {x}, not a finite number.")
    return x


def percent_text(share: float) -> str:
    """A relative tolerance as a percentage with its significant digits: 1e-6 is 0.0001%, not 0.00% (issue 35)."""
    return f"{float(f'{100 * share:.2g}'):f}".rstrip("0").rstrip(".") + "%"


def tolerance_text(rel_tol: float, abs_tol: float) -> str:
    bounds = ([f"±{fmt_number(abs_tol)}"] if abs_tol else []) + ([percent_text(rel_tol)] if rel_tol > 1e-9 else [])
    return f"which is not within {' or '.join(bounds)} of the right value" if bounds else "which is not exactly right"


# (factor, what it is, whether only a quantity in bytes can suffer it)
_SLIPS = (
    (1e9 / 2**30, "GB read as GiB (or the reverse): 1 GB = 1e9 bytes, 1 GiB = 2**30 bytes", True),
    (1.024, "a decimal kB where the lecture means KiB (or the reverse)", True),
    (1024 / 1e6, "a KiB/MB mix-up", True),
    (2**20, "a factor of 2**20: MiB versus bytes?", True),
    (2**30, "a factor of 2**30: GiB versus bytes?", True),
    (1e3, "a factor of 1,000: a unit prefix (k, M, G, ms) slipped?", False),
    (1e6, "a factor of a million: a unit prefix slipped?", False),
    (1e9, "a factor of 1e9: GB versus bytes?", False),
    (1e12, "a factor of 1e12: TFLOP/s versus FLOP/s?", False),
    (1024, "a factor of 1,024: a binary prefix slipped?", True),
    (2, "a factor of 2: keys and values, bytes per element, or 2 FLOP per multiply-add?", False),
    (8, "a factor of 8: bits versus bytes?", True),
)
_BYTE_UNITS = ("B", "bytes", "KiB", "MiB", "GiB", "GB", "MB", "kB", "B/s", "GB/s")


def units_slip(got: float, want: float, unit: str | None = None) -> str:
    """Name the units slip that explains `got` exactly (a remark, never the right value), or ""."""
    if got == 0 or want == 0 or (got < 0) != (want < 0):
        return ""
    ratio, in_bytes = got / want, unit is None or unit.strip() in _BYTE_UNITS
    for factor, name, bytes_only in _SLIPS:
        if (in_bytes or not bytes_only) and any(math.isclose(ratio, f, rel_tol=1e-6) for f in (factor, 1 / factor)):
            return sentence(f"Your answer is off by what looks like {name}")
    return ""


def close(got, want, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """Equal as data: numbers within the tolerance, text without case or surrounding spaces, containers item by item."""
    return not _difference(got, want, rel_tol, abs_tol, "")


def _difference(got, want, rel_tol, abs_tol, at) -> str:
    """'' when `got` matches `want`, else where and how it differs (never the expected value)."""
    where = f" at {at}" if at else ""
    if want is None or isinstance(want, bool):
        return "" if got is want else f"{echo(got)}{where}"
    if isinstance(want, numbers.Real):
        got = scalar(got)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return f"{echo(got)}{where}, which is not a number"
        if isinstance(got, int) and got.bit_length() > 1000:
            return f"a whole number of {got.bit_length():,} bits{where}, far too large"
        if math.isnan(want) or math.isnan(got):
            return "" if math.isnan(want) and math.isnan(got) else f"{fmt_number(got)}{where}, which is not right"
        if math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=abs_tol):
            return ""
        return f"{fmt_number(got)}{where}, which is too {'high' if got > want else 'low'}"
    if isinstance(want, str):
        if isinstance(got, str) and " ".join(got.split()).lower() == " ".join(want.split()).lower():
            return ""
        return f"{echo(got)}{where}"
    if isinstance(want, Tensor):
        if not isinstance(got, Tensor):
            return f"{echo(got)}{where} where a tensor was expected"
        if got.shape != want.shape:
            return f"a tensor of shape {list(got.shape)}{where} where {list(want.shape)} was expected"
        if got.dtype != want.dtype:
            return f"a {got.dtype} tensor{where} where {want.dtype} was expected"
        bad = next((i for i, (g, w) in enumerate(zip(got.values, want.values))
                    if _difference(g, w, max(rel_tol, 1e-5) if isinstance(w, float) else 0.0,
                                   max(abs_tol, 1e-5) if isinstance(w, float) else 0.0, "")), None)
        return "" if bad is None else f"a tensor{where} whose item {_index(bad, want.shape)} is off"
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{echo(got)}{where} where a sequence of {len(want)} was expected"
        if len(got) != len(want):
            return f"{len(got)} items{where} where {len(want)} were expected"
        return _first(_difference(g, w, rel_tol, abs_tol, f"{at}[{i}]") for i, (g, w) in enumerate(zip(got, want)))
    if isinstance(want, frozenset):
        return "" if isinstance(got, frozenset) and got == want else f"{echo(got)}{where}"
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{echo(got)}{where} where a dict with the keys {sorted(map(str, want))} was expected"
        return _first(_difference(got[key], want[key], rel_tol, abs_tol, f"{at}[{key!r}]") for key in want)
    return "" if got == want else f"{echo(got)}{where}"


def _first(problems) -> str:
    return next((p for p in problems if p), "")


def _index(flat: int, shape: tuple) -> list[int]:
    out = []
    for n in reversed(shape):
        flat, i = divmod(flat, n) if n else (flat, 0)
        out.append(i)
    return list(reversed(out))


def _remark(got, spec: dict, rel: float, abs_: float) -> str:
    """The remark of the first known mistake `got` matches (after a space), or ""."""
    return next((" " + remark for wrong, remark in spec.get("mistakes", ())
                 if close(got, wrong, max(rel, 1e-9), abs_)), "")


def sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def verdict(got, spec: dict) -> None:
    """Raise Mismatch unless `got` (plain data, parsed) matches `spec`."""
    name = spec.get("judge")
    if name:
        if name not in JUDGES:  # labsupport.course.harness registers them; check(), the registry and grade import it
            raise KeyError(f"no judge named {name!r}: labsupport.course.harness registers the named judges")
        return JUDGES[name](got, spec)
    if "options" in spec:
        return _choice(got, spec)
    want, what = spec["want"], spec.get("what")
    rel, abs_ = float(spec.get("rel_tol", 1e-9)), float(spec.get("abs_tol", 0.0))
    if isinstance(want, numbers.Real) and not isinstance(want, bool):
        x = as_number(got, f"{what} returned a value that" if what else "your answer")
        said = f"{what} returned {fmt_number(x)}" if what else f"your answer is {fmt_number(x)}"
        if spec.get("whole") and not x.is_integer():
            raise Mismatch(f"{said}: it counts whole things, and a fraction of one is none.")
        if math.isclose(x, want, rel_tol=rel, abs_tol=abs_):
            return
        floor = spec.get("at_least")
        if floor is not None and x < floor <= want:
            raise Mismatch(f"{said}: it cannot be below {fmt_number(floor)} (when nothing fits, the answer is "
                           f"{fmt_number(floor)}).")
        too = "too high" if x > want else "too low"
        problem = (f"{said}, which is {too}." if what
                   else f"you gave {fmt_number(x)}{spec.get('unit', '')}, {tolerance_text(rel, abs_)}; it is {too}.")
        raise Mismatch(problem + (_remark(x, spec, rel, abs_) or f" {units_slip(x, want, spec.get('unit'))}".rstrip()))
    if isinstance(want, dict) and "keys" in spec:
        return _keys(got, spec)
    if spec.get("unordered") and isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        got, want = _sorted(got), _sorted(want)
    problem = _difference(got, want, rel, abs_, "")
    if problem:
        raise Mismatch(sentence(f"{what + ' returned' if what else 'you gave'} {problem}")
                       + _remark(got, spec, rel, abs_))


def _sorted(items):
    try:
        return sorted(items, key=lambda v: (str(type(v)), v))
    except TypeError:
        return list(items)


def _keys(got, spec: dict) -> None:
    want, what = spec["want"], spec.get("what")
    if not isinstance(got, dict) or set(map(str, got)) != set(want):
        raise Mismatch(f"{what + ' returned' if what else 'answer with'} a dict with exactly the keys "
                       f"{sorted(want)}; {'it is' if what else 'you gave'} {echo(got)}.")
    for key in want:
        sub = {"rel_tol": spec.get("rel_tol", 1e-9), "abs_tol": spec.get("abs_tol", 0.0),
               **spec["keys"].get(key, {}), "want": want[key]}
        try:
            verdict(got[key], {**sub, "what": f"{what}[{key!r}]"} if what else sub)
        except Mismatch as exc:
            text = str(exc)
            raise Mismatch(text if what else f"{key!r}: {text[0].lower()}{text[1:]}") from None


def _choice(got, spec: dict) -> None:
    options, mistakes = spec["options"], spec.get("mistakes", {})

    def normal(item) -> str:
        if not isinstance(item, str):
            raise Mismatch(f"{echo(item)} is not text; answer with one of: {', '.join(options)}.")
        key = " ".join(item.split()).lower()
        if key not in options:
            raise Mismatch(f"{echo(item)} is not one of: {', '.join(options)}.")
        return key

    if not spec.get("multi"):
        key = normal(got)
        if key != spec["want"]:
            raise Mismatch(f"you chose {key!r}." + (f" {mistakes[key]}" if key in mistakes else ""))
        return
    if isinstance(got, str) or not isinstance(got, (list, frozenset)):
        raise Mismatch(f"this checkoff wants a set of options, e.g. {{'{options[0]}', ...}}; you gave {echo(got)}.")
    chosen, want = {normal(g) for g in got}, set(spec["want"])
    if chosen == want:
        return
    extra, missing = sorted(chosen - want), sorted(want - chosen)
    parts = ([f"{len(extra)} of your choices {'does' if len(extra) == 1 else 'do'} not belong"] if extra else []) + \
        ([f"{len(missing)} {'is' if len(missing) == 1 else 'are'} missing"] if missing else [])
    remark = " ".join(mistakes[e] for e in extra if e in mistakes)
    raise Mismatch(f"you chose {sorted(chosen)}: {' and '.join(parts)}." + (f" {remark}" if remark else ""))


def readable(spec: dict) -> dict:
    """A spec as stored (plain data: want, mistakes, after, keys) turned back into values to compare with."""
    out = dict(spec)
    if "want" in out:
        out["want"] = unplain(out["want"])
    if isinstance(out.get("mistakes"), list):
        out["mistakes"] = [(unplain(w), r) for w, r in out["mistakes"]]
    if isinstance(out.get("after"), dict):
        out["after"] = {k: unplain(v) for k, v in out["after"].items()}
    if isinstance(out.get("keys"), dict):
        out["keys"] = {k: readable(v) for k, v in out["keys"].items()}
    return out


class Unfinished(Exception):
    """The function still raises the student copy's NotImplementedError: not attempted."""


def observed(observation: dict, spec: dict) -> None:
    """One case of a function checkoff: what the harness saw the function do, against the case's spec."""
    what = spec.get("what") or "your function"
    if not isinstance(observation, dict):
        raise Mismatch(f"{what}: the answer record is malformed.")
    if "unfinished" in observation:
        raise Unfinished(str(observation["unfinished"])[:300])
    if "raised" in observation:
        kind, message = (list(observation["raised"]) + ["", ""])[:2]
        raise Mismatch(f"{what} raised {str(kind)[:80]}: {str(message)[:300]}".rstrip(": ") + ".")
    if "timeout" in observation:
        raise Mismatch(f"{what} did not return within {observation['timeout']} s.")
    verdict(observation.get("result"), spec)
    for index, want in (spec.get("after") or {}).items():
        got = (observation.get("after") or {}).get(index)
        if not close(got, want):
            changed = spec.get("after_remark", "changed it differently from the reference")
            raise Mismatch(f"{what} left its argument {index} as {echo(got)}; {changed}.")


JUDGES: dict = {}  # name -> judge(got, spec), for answers no generic rule fits (labsupport.course.harness adds them)
