"""One-call answers are found by a test, not by a list (issue 34, item 5).

A value checkoff asks for a quantity derived from the lab's givens; a function of the student's package
that returns it in one call answers the exercise for them.  Each such function must be named in the
checkoff's ``forbid=`` (the scan's hint, GRADING.md: it can be bypassed) or be staff-only (not shipped).

This test finds them: it calls every public function of every module the student release ships (the
release's own rule, release.STAFF_ONLY, decides which), and the public static and class methods of their
public classes, on each lab's givens — the lecture's and a hidden draw — in the obvious ways: the givens'
values positionally in their declaration order, by keyword (a parameter named as a given, in any case),
and with a ModelSpec and a GPUSpec built from the givens for a parameter that takes a model or a card.
A call reproduces a checkoff when what it returns, or a number one level inside it (a tuple, a list, a
dict, a dataclass), equals the checkoff's expected value on both sets within its tolerance.  The test
fails naming each (function, checkoff) pair the checkoff's forbid list does not cover.

Calls are guarded: two seconds each (signal.alarm), every exception caught, and a function that could
touch files, the network or processes is never called (cli/, the data fetchers, anything whose source
opens, writes or starts something).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import itertools
import math
import numbers
import re
import resource
import signal
import sys
import warnings
from pathlib import Path

import pytest

from labsupport import card
from labsupport.course import release
from labsupport.course.checkoffs import load_lab
from labsupport.course.registry import GIVENS, REGISTRY, case_rng, namespace
from labsupport.specs import GPUSpec, ModelSpec, get_gpu

PACKAGE = Path(release.PACKAGE)
LABS = range(9)
CALL_SECONDS = 2
HIDDEN_SETS = 3
# What is never called: the command line (cli/: it parses argv, prints, writes), and any function or module whose
# source reaches files, the network or other processes (the trace fetchers, the benches' subprocesses).
NEVER_MODULES = ("cli/", "__main__.py")
TOUCHES = re.compile(r"\bopen\(|\.write|\bmkdir\b|\bunlink\b|rmtree|\bsubprocess\b|\bPopen\b|urllib|urlopen|"
                     r"\bsocket\b|os\.system|os\.remove|\.savefig|write_html|write_image|to_csv|\bshutil\b|"
                     r"\bfetch\b|download|\binput\(|\bsys\.exit\b|\bexec\(|\beval\(")


def student_modules() -> list[str]:
    """The modules of labsupport the student release ships, by the rule release._copy_package applies."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == s or rel.startswith(s + "/") for s in release.STAFF_ONLY) or rel.startswith(NEVER_MODULES):
            continue
        module = "labsupport." + rel[:-3].replace("/", ".")
        names.append(module[: -len(".__init__")] if module.endswith(".__init__") else module)
    return names


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def candidates() -> list[tuple[str, object]]:
    """(dotted name, callable): public functions defined in each student module, and the public static and
    class methods of its public classes, never one whose source (or module's) touches the outside."""
    found = {}
    for name in student_modules():
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that cannot load in this environment offers nothing to call
            continue
        if re.search(r"^\s*(import|from)\s+(subprocess|urllib|socket|http|requests)\b", _source(module), re.M):
            continue
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj):
                found[f"{name}.{attr}"] = obj
            elif inspect.isclass(obj):
                for meth, raw in vars(obj).items():
                    if not meth.startswith("_") and isinstance(raw, (staticmethod, classmethod)):
                        found[f"{name}.{attr}.{meth}"] = getattr(obj, meth)
    return [(n, f) for n, f in sorted(found.items()) if not TOUCHES.search(_source(f))]


# --- the obvious ways to call a function on a lab's givens ------------------------------------------------------

def models(g: dict) -> list[ModelSpec]:
    """The model the givens describe, as the labs build one (lab 06's ModelSpec(..., g.PARAMS, dtype_bytes=...)):
    every KV head its own (MHA) and, where the givens name GQA heads, the GQA model."""
    if "LAYERS" not in g or "HEAD_DIM" not in g:
        return []
    heads = g.get("HEADS", g.get("Q_HEADS", g.get("KV_HEADS")))
    out = []
    for kv in [h for h in (g.get("KV_HEADS", heads), g.get("GQA_KV_HEADS")) if h]:
        with contextlib.suppress(ValueError, TypeError):
            out.append(ModelSpec("givens", g["LAYERS"], heads, kv, g["HEAD_DIM"], g.get("PARAMS", 7e9),
                                 dtype_bytes=g.get("DTYPE_BYTES", 2)))
    return out


def gpus(g: dict) -> list[GPUSpec]:
    """The card the givens describe: the lecture's H100 with each of its quantities the givens name."""
    h100 = get_gpu("h100-sxm-80gb")
    try:
        return [GPUSpec("givens", g.get("HBM_BYTES", h100.hbm_bytes), g.get("HBM_BW", h100.hbm_bandwidth),
                        g.get("PEAK_FLOPS", h100.peak_flops), g.get("LINK_BW", h100.link_bandwidth))]
    except (ValueError, TypeError):
        return []


def _is(param: inspect.Parameter, word: str, cls: str) -> bool:
    return param.name.lower() == word or cls in str(param.annotation)


def quantities(g: dict) -> dict[str, list]:
    """What a student has at hand on the givens `g`, by the names a parameter would give it: each given (its
    name lower-cased; S_MAX_LONG is also an s_max, BLOCK a block_size), and the quantities every lab derives
    from them first: the KV budget, the KV bytes per token (of each model the givens describe) and the tokens
    a sequence ends with."""
    out: dict[str, list] = {}

    def add(names, value):
        for name in dict.fromkeys(names):  # never deduplicated by value: the hidden set's calls line up with these
            out.setdefault(name, []).append(value)

    for key, v in g.items():
        low = key.lower()
        add([key, low, *(low.rsplit("_", n)[0] for n in (1, 2) if "_" in low)], v)
        add([f"{low}_size", f"{low}_tokens", f"{low}_bytes"], v)
    if {"HBM_BYTES", "PARAMS", "DTYPE_BYTES", "RESERVE_BYTES"} <= set(g):
        add(["budget", "budget_bytes", "kv_budget", "kv_budget_bytes"],
            g["HBM_BYTES"] - g["PARAMS"] * g["DTYPE_BYTES"] - g["RESERVE_BYTES"])
    for m in models(g):
        add(["kv_per_token", "kv_bytes_per_token", "kv_bytes", "kv"], m.kv_bytes_per_token)
    if {"PROMPT", "OUTPUT"} <= set(g):
        add(["seq_tokens", "seq_len", "tokens", "sequence_tokens"], g["PROMPT"] + g["OUTPUT"])
    return out


MAX_COMBINATIONS = 48  # keyword calls tried per function and givens set


def arguments(fn, g: dict) -> list[tuple[tuple, dict]]:
    """The calls to try: the givens' values positionally (a prefix as long as the function takes), and by
    keyword, each parameter bound to what `quantities` names it or to a model or card built from the givens."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]
    except (TypeError, ValueError):
        return []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    values = list(g.values())
    calls = []
    if len(required) <= len(values) and all(p in positional for p in required):
        calls += [(tuple(values[:n]), {}) for n in range(len(required), min(len(positional), len(values)) + 1) if n]
    known = quantities(g)
    choices = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if _is(p, "model", "ModelSpec"):
            choices.append([(p.name, m) for m in models(g)])
        elif _is(p, "gpu", "GPUSpec"):
            choices.append([(p.name, c) for c in gpus(g)])
        elif p.name in known or p.name.lower() in known:
            choices.append([(p.name, v) for v in known.get(p.name, known.get(p.name.lower()))])
        elif p.default is p.empty:
            return calls
    choices = [c for c in choices if c]
    if choices:
        calls += [((), dict(combo)) for combo in itertools.islice(itertools.product(*choices), MAX_COMBINATIONS)]
    return calls


class _Slow(Exception):
    pass


def _alarm(signum, frame):
    raise _Slow()


def call(fn, args: tuple, kwargs: dict):
    """fn(*args, **kwargs) within CALL_SECONDS; None for any exception (a wrong call is no answer)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CALL_SECONDS)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # a call sized by a card's whole memory (80e9 B as a tensor) must fail alone, not get the test run OOM-killed
    resource.setrlimit(resource.RLIMIT_AS, (min(hard, _address_space() + CALL_MEMORY) if hard > 0 else
                                            _address_space() + CALL_MEMORY, hard))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - a function called wrongly raises anything; KeyboardInterrupt passes
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


CALL_MEMORY = 2 * 2**30  # address space one call may add


def _address_space() -> int:
    """This process's mapped address space now, in bytes (/proc/self/statm's first field is in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


MAX_READINGS = 200  # values read off one call's result


def numbers_in(result, depth: int = 2) -> list:
    """The result and what it reports, `depth` levels down: a tuple's or list's items, a dict's values, a
    dataclass's fields, an object's public attributes and properties (slo.three_columns' list of Columns, each
    column's concurrency): what a student reads off one call without deriving anything.  No method is called."""
    out = [result]
    if depth == 0 or isinstance(result, (str, bytes, numbers.Number, type)) or inspect.isroutine(result) \
            or inspect.ismodule(result):
        return out
    if isinstance(result, (tuple, list)):
        inner = list(result[:64])
    elif isinstance(result, dict):
        inner = list(result.values())[:64]
    else:
        inner = []
        for attr in dir(result)[:200]:
            if attr.startswith("_"):
                continue
            with contextlib.suppress(Exception):  # a field or a property: read, never a method called
                member = inspect.getattr_static(result, attr)
                if isinstance(member, property) or not callable(member):
                    inner.append(call(getattr, (result, attr), {}))
    for item in inner:
        out += numbers_in(item, depth - 1)
        if len(out) > MAX_READINGS:
            break
    return out[:MAX_READINGS]


def read_numbers(result) -> list[float]:
    """The finite real numbers `numbers_in` reads off `result`."""
    out = []
    for x in numbers_in(result):
        if isinstance(x, numbers.Real) and not isinstance(x, bool):
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                if math.isfinite(float(x)):
                    out.append(float(x))
    return out


def matches(read: list[float], want, spec: dict) -> bool:
    """Whether a number read off a result is the checkoff's expected number, within its tolerance."""
    if isinstance(want, bool) or not isinstance(want, numbers.Real):
        return False  # a number's checkoff only: text and containers are not one call's coincidence to judge here
    rel, abs_ = spec.get("rel_tol", 1e-9), spec.get("abs_tol", 0.0)
    return any(math.isclose(x, float(want), rel_tol=rel, abs_tol=abs_) for x in read)


def value_checkoffs(lab: int) -> list:
    load_lab(lab)
    return [c for c in REGISTRY.values() if c.lab == lab and c.kind == "value" and c.takes_givens]


def reproductions() -> list[tuple[str, str]]:
    """Every (function, checkoff) whose call on the lecture's givens and on a hidden draw gives the answer."""
    funcs = candidates()
    found = []
    for lab in LABS:
        checkoffs = value_checkoffs(lab)
        if not checkoffs or lab not in GIVENS:
            continue
        lecture = dict(GIVENS[lab].lecture)
        # hidden sets as grade draws them; three, so that an answer that happens to equal a function's constant
        # on one set (3.8's entry width of 8 bytes beside a default of n=8) is not taken for a one-call answer
        hidden = GIVENS[lab].draw(case_rng("givens", b"one-call answers", f"test|{lab:02d}"), HIDDEN_SETS)
        want = {c.id: ([c.expect(namespace(lecture))] + [c.expect(namespace(h)) for h in hidden], c.spec)
                for c in checkoffs}
        for name, fn in funcs:
            calls = arguments(fn, lecture)
            hidden_calls = [arguments(fn, h) for h in hidden]  # the same calls, in order, on each hidden set
            for number, (args, kwargs) in enumerate(calls):
                read = read_numbers(call(fn, args, kwargs))
                hits = [cid for cid, (w, spec) in want.items() if matches(read, w[0], spec)]
                for n, h_calls in enumerate(hidden_calls, start=1):
                    if not hits or len(h_calls) != len(calls):
                        hits = []
                        break
                    again = read_numbers(call(fn, *h_calls[number]))
                    hits = [cid for cid in hits if matches(again, want[cid][0][n], want[cid][1])]
                found += [(name, cid) for cid in hits]
    return sorted(set(found))


def covered(name: str, checkoff_id: str) -> bool:
    """Whether the checkoff's forbid list names `name` (or a module or class above it)."""
    return any(name == f or name.startswith(f + ".") for f in REGISTRY[checkoff_id].forbid)


FAST_MODULES = ("labsupport.ledger", "labsupport.specs", "labsupport.slo", "labsupport.measure.fragmentation",
                "labsupport.contiguous", "labsupport.measure.block_size", "labsupport.units", "labsupport.viz.roofline")


@pytest.fixture(scope="module")
def found():
    return reproductions()


def test_the_student_side_is_the_releases_rule_and_holds_the_librarys_modules():
    mods = student_modules()
    assert "labsupport.ledger" in mods and "labsupport.specs" in mods and "labsupport.measure.fragmentation" in mods
    assert not any(m.startswith(("labsupport.course.checkoffs", "labsupport.course.grade", "labsupport.cli"))
                   for m in mods)


def test_the_search_finds_a_one_call_answer_it_is_shown(monkeypatch):
    """The search can fail: a student-side function returning 2.1's answer from the givens' names is found."""
    import labsupport.units as units

    def wasted_slot_bytes(s_max, prompt, output, layers, kv_heads, head_dim, dtype_bytes):
        return (s_max - prompt - output) * 2 * layers * kv_heads * head_dim * dtype_bytes

    wasted_slot_bytes.__module__ = "labsupport.units"
    monkeypatch.setattr(units, "wasted_slot_bytes", wasted_slot_bytes, raising=False)
    funcs = dict(candidates())
    assert "labsupport.units.wasted_slot_bytes" in funcs
    value_checkoffs(2)  # loads lab 02's graders, and with them its givens
    lecture = dict(GIVENS[2].lecture)  # the lab's givens as the course card sets them (the lecture's on its card)
    calls = arguments(wasted_slot_bytes, lecture)
    g = {k: lecture[k] for k in ("S_MAX", "PROMPT", "OUTPUT", "LAYERS", "KV_HEADS", "HEAD_DIM", "DTYPE_BYTES")}
    by_name = ((), {"s_max": g["S_MAX"], "prompt": g["PROMPT"], "output": g["OUTPUT"], "layers": g["LAYERS"],
                    "kv_heads": g["KV_HEADS"], "head_dim": g["HEAD_DIM"], "dtype_bytes": g["DTYPE_BYTES"]})
    assert by_name in calls  # (and S_MAX_LONG, S_MAX_BROCHURE, S_MAX_SHORT as an s_max, in other calls)
    got = call(wasted_slot_bytes, *by_name)
    # 2.1's answer on those givens, by hand: (4,096 - 512 - 128) x 2 x 32 x 32 x 128 x 2 = 1,811,939,328 B on the
    # lecture's card
    assert got == (g["S_MAX"] - g["PROMPT"] - g["OUTPUT"]) * 2 * g["LAYERS"] * g["KV_HEADS"] * g["HEAD_DIM"] * \
        g["DTYPE_BYTES"]
    if card.card().is_lecture:
        assert got == 1_811_939_328
    assert matches(read_numbers(got), REGISTRY["2.1"].expect(), REGISTRY["2.1"].spec)
    assert not matches(read_numbers(got + 1024), REGISTRY["2.1"].expect(), REGISTRY["2.1"].spec)  # 1e-9: a KiB off is not it


def _uncovered_text(uncovered) -> str:
    return "\n".join(f"{name} answers {cid} in one call: add it to {cid}'s forbid= in "
                     f"checkoffs/lab{int(cid.split('.')[0]):02d}.py, or make it staff-only" for name, cid in uncovered)


def test_the_ledger_and_its_neighbours_answer_nothing_unforbidden(monkeypatch):
    """The fast tier: the modules where a one-call answer most likely lives (the ledger and what wraps it)."""
    everything = candidates()
    monkeypatch.setattr(sys.modules[__name__], "candidates",
                        lambda: [(n, f) for n, f in everything if n.startswith(tuple(m + "." for m in FAST_MODULES))])
    uncovered = [(name, cid) for name, cid in reproductions() if not covered(name, cid)]
    assert uncovered == [], _uncovered_text(uncovered)


@pytest.mark.slow
def test_every_one_call_answer_is_forbidden_or_staff_only(found):
    uncovered = [(name, cid) for name, cid in found if not covered(name, cid)]
    assert uncovered == [], _uncovered_text(uncovered)
