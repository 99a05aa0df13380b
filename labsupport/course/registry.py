"""What a checkoff is, and how a lab's grader module declares one (every lab; the staff side).

A lab's graders, ``checkoffs/labNN.py``, never ship to students nor run where student code runs.  They declare
the lab's hidden `givens` and each checkoff once (`value`, `choice`, or `function` over `case`s); the build
writes each checkoff's public part into the lab's record, all check() reads.  How to add one: COURSE_AUTHORING.md.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import random
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from labsupport.course import data, judge, record
from labsupport.course.harness import observe

ID_PATTERN = re.compile(r"^(\d+)\.(\d+)$")
GIVEN_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
PUBLIC_SEED = "labsupport formative cases"
ROOT = Path(__file__).resolve().parents[2]

REGISTRY: dict[str, "Checkoff"] = {}
GIVENS: dict[int, "Givens"] = {}


def namespace(values: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(**values)


def validate_id(checkoff_id) -> str:
    if not isinstance(checkoff_id, str) or not ID_PATTERN.match(checkoff_id):
        raise ValueError(f"checkoff id must look like '2.1' (lab.number), got {checkoff_id!r}")
    return checkoff_id


def case_rng(checkoff_id: str, secret: bytes | None = None, key: str = "") -> random.Random:
    """A checkoff's random source: a fixed public seed (the lab's own cases), or one from `grade`'s secret."""
    material = (secret.hex() if secret else PUBLIC_SEED) + f"|{key}|{checkoff_id}"
    return random.Random(hashlib.sha256(material.encode()).digest())


DRAW_TRIES = 200  # draws per hidden set before the lab's fixed fallback sets take over


@dataclass(frozen=True)
class Givens:
    """A lab's givens: the lecture's values (what its givens cell binds) and a source of other ones.

    `hidden(rng)` returns one set, or None when its own bounded search found none; `fallbacks` are fixed
    sets, each valid and differing from the lecture's in every given, used when DRAW_TRIES draws found no
    new one, so that a draw never fails the grade of an honest notebook."""
    lab: int
    lecture: dict
    hidden: Callable[[random.Random], dict | None]
    fallbacks: tuple = ()

    def draw(self, rng: random.Random, n: int) -> list[dict]:
        """`n` hidden sets, each differing from the lecture's in every given (and from each other)."""
        sets: list[dict] = []
        for _ in range(n):
            g = self._drawn(rng, sets)
            if g is None:  # bounded: the first fixed set not drawn already (ValueError only past them all)
                g = next((dict(f) for f in self.fallbacks if self._fresh(f, sets)), None)
            if g is None:
                raise ValueError(f"lab {self.lab:02d}'s hidden givens never differ from the lecture's in every "
                                 f"given, and its {len(self.fallbacks)} fallback sets are used up")
            sets.append(g)
        return sets

    def _drawn(self, rng: random.Random, sets: list[dict]) -> dict | None:
        """A new set in DRAW_TRIES draws, or None (at once when `hidden`'s own bounded search found none)."""
        for _attempt in range(DRAW_TRIES):
            g = self.hidden(rng)
            if g is None:
                return None
            if self._fresh(g, sets):
                return g
        return None

    def _fresh(self, g: dict, sets: list[dict]) -> bool:
        if set(g) != set(self.lecture):  # an authoring slip, at once, whatever the draw
            raise ValueError(f"lab {self.lab:02d}'s hidden givens have the keys {sorted(g)}, "
                             f"not the givens {sorted(self.lecture)}")
        return all(g[k] != self.lecture[k] for k in g) and g not in sets


def givens_cell(source: str, where: str = "the givens cell") -> dict:
    """The constants a givens cell binds, NAME = value per line; ValueError naming the line otherwise."""
    bound = {}
    for stmt in ast.parse(source).body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            raise ValueError(f"{where}, line {stmt.lineno}: a givens cell holds only 'NAME = value' lines")
        name = stmt.targets[0].id
        try:
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), {"__builtins__": {}})  # noqa: S307
        except Exception:  # noqa: BLE001 - a name or a call: not a constant
            raise ValueError(f"{where}, line {stmt.lineno}: {name} must be a constant number or text") from None
        if not GIVEN_NAME.match(name) or isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{where}, line {stmt.lineno}: a given is NAME = a number or text, in capitals")
        bound[name] = value
    return bound


# A givens line bound to the course card: ``NAME = literal  # card=gqa.num_kv_heads: what it is, on {gpu}``.  The build
# writes the card's value (course.toml) and drops the marker; {gpu} {model} {mha} {gqa} in the comment become names.
CARD_MARK = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<eq>\s*=\s*)(?P<literal>[^#\n]*?)(?P<pad>\s*)"
                       r"#\s*card=(?P<expr>[a-z_]+(?:\.[a-z_]+)+):\s*(?P<comment>.*)$")
CARD_ROOTS = ("gpu", "model", "mha", "gqa", "card")


def _card_literal(value, like: str, where: str) -> str:
    """The card's value written as the source wrote its own (an int stays an int; 80 * 10**9 keeps its form)."""
    old = eval(compile(ast.Expression(ast.parse(like, mode="eval").body), where, "eval"), {"__builtins__": {}})  # noqa: S307
    if old == value:
        return like  # the lecture's card: the source's own text, byte for byte
    if isinstance(old, int):
        if value != int(value):
            raise ValueError(f"{where}: the card's value {value!r} is not a whole number, and the given is one")
        value = int(value)
        return f"{value // 10**9} * 10**9" if value >= 10**9 and value % 10**9 == 0 else f"{value:_}"
    return f"{float(value):g}" if float(value) == float(f"{float(value):g}") else repr(float(value))


def card_givens(source: str, where: str = "the givens cell") -> str:
    """A givens cell with every ``# card=…`` line set from the course card (labsupport.card)."""
    from labsupport import card as course_card

    c = course_card.card()
    roots = {"gpu": c.gpu, "model": c.model, "mha": c.mha, "gqa": c.gqa}
    names = {key: spec.name for key, spec in roots.items()}
    roots["card"] = c  # the card's own derived givens (Card.slow_link_bandwidth)
    lines = []
    for number, line in enumerate(source.split("\n"), start=1):
        found = CARD_MARK.match(line)
        if found:
            head, *fields = found["expr"].split(".")
            if head not in roots:
                raise ValueError(f"{where}, line {number}: card={found['expr']} starts with none of "
                                 f"{', '.join(CARD_ROOTS)}")
            value = roots[head]
            for f in fields:
                if f.startswith("_") or not hasattr(value, f):
                    raise ValueError(f"{where}, line {number}: card={found['expr']}: {head} has no field {f!r}")
                value = getattr(value, f)
            literal = _card_literal(value, found["literal"], f"{where}, line {number}")
            comment = found["comment"].format(**names)
            line = f"{found['name']}{found['eq']}{literal}{found['pad']}# {comment}"
        lines.append(line)
    return "\n".join(lines)


def lecture_givens(lab: int) -> dict:
    """The lecture's givens of lab `lab`: its source's givens cell (the one declaration), else its record."""
    source = min((ROOT / "solutions").glob(f"{lab:02d}_*.py"), default=None)
    if source is not None:
        for cell in re.split(r"^# %%", source.read_text(encoding="utf-8"), flags=re.M):
            header, _, body = cell.partition("\n")
            if re.search(r"""tags=\[[^\]]*["']givens["']""", header):
                where = f"{source.name}, the givens cell"
                return givens_cell(card_givens(body, where), where)
    found = (record.read(lab) or {}).get("givens")
    if found is None:
        raise ValueError(f"lab {lab:02d} declares givens, but neither its source nor its record has a givens cell")
    return dict(found)


def givens(*, hidden: Callable[[random.Random], dict | None], lab: int | None = None,
           lecture: dict | None = None, fallbacks: Iterable[dict] = ()) -> types.SimpleNamespace:
    """Declare the calling lab's hidden givens; returns the lecture's (from its source's givens cell, or
    `lecture` for a lab with no source) as a namespace, ``G.S_MAX``.  `fallbacks`: fixed valid sets for when
    `hidden` draws no new one in DRAW_TRIES tries (give at least grade's HIDDEN_RUNS)."""
    if lab is None:
        found = re.search(r"lab(\d+)$", _module())
        if not found:
            raise ValueError("declare givens and checkoffs from a lab's grader module (labNN.py)")
        lab = int(found[1])
    GIVENS[lab] = Givens(lab, dict(lecture) if lecture is not None else lecture_givens(lab), hidden,
                     tuple(dict(f) for f in fallbacks))
    return namespace(GIVENS[lab].lecture)


@dataclass
class Case:
    """One case of a function checkoff: its inputs (plain data once written), what it must give, and remarks."""
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    want: Any = None
    spec: dict = field(default_factory=dict)  # rel_tol, abs_tol, mistakes, whole, keys, unordered, judge, after
    what: str = ""
    after: tuple = ()  # arguments whose state after the call is compared (spec["after"] holds theirs)
    harness: str = ""  # a harness of labsupport.course.harness that drives the function instead of one call
    data: Any = None  # the harness's input

    def input(self, sent: bool = False) -> dict:
        """The case's input as plain data: as check() rebuilds it (a live object by its recipe), or `sent` into a
        grading sandbox (`data.as_input`: what a seeded recipe made, never the recipe)."""
        write = data.as_input if sent else data.plain
        if self.harness:
            return {"harness": self.harness, "data": write(self.data)}
        out = {"args": write(list(self.args)), "kwargs": write(self.kwargs)}
        return {**out, "after": list(self.after)} if self.after else out

    def public_spec(self, name: str) -> dict:
        what = self.what or f"{name}({shown(self.args, self.kwargs)})"
        spec = {**self.spec, "want": data.plain(self.want), "what": what}
        if "mistakes" in spec:
            spec["mistakes"] = [[data.plain(w), r] for w, r in spec["mistakes"] if r]
        if "after" in spec:
            spec["after"] = {str(k): data.plain(v) for k, v in spec["after"].items()}
        return spec


def case(*args, want=None, what: str = "", kwargs: dict | None = None, after: dict | None = None,
         harness: str = "", data=None, **spec) -> Case:
    """A function checkoff's case: ``case(7, 16, want=9, mistakes=[(16, "a whole block")])``.  `after` maps an
    argument's position to the state the call must leave it in; `harness` runs the function on `data` instead."""
    if after:
        spec["after"] = after
    return Case(tuple(args), dict(kwargs or {}), want, spec, what, tuple(sorted(after or ())), harness, data)


def shown(args: tuple, kwargs: dict | None = None) -> str:
    def one(a) -> str:
        if isinstance(a, data.Live):
            return f"<{type(a.real).__name__}>"
        name = getattr(a, "name", None)
        if isinstance(name, str) and not isinstance(a, str):
            return name
        text = repr(a)
        return text if len(text) <= 40 else f"<{len(a)} items>" if hasattr(a, "__len__") else text[:37] + "..."
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()])


@dataclass(frozen=True)
class Checkoff:
    id: str
    title: str
    hint: str
    kind: str  # "value", "choice" or "function"
    module: str = ""
    forbid: tuple[str, ...] = ()
    derive: str = ""
    fixed: str = ""  # why a value has nothing to vary
    expected: Any = None  # value: g -> the answer (or a constant); choice: the option(s)
    spec: dict = field(default_factory=dict)  # how to compare (see labsupport.course.judge)
    make_cases: Callable | None = None  # function: rng -> iterable of Case
    name: str = "your function"

    @property
    def lab(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def order(self) -> tuple[int, int]:
        return tuple(int(x) for x in self.id.split("."))

    @property
    def takes_givens(self) -> bool:
        return (self.kind == "value" and callable(self.expected)
                and len(inspect.signature(self.expected).parameters) == 1)

    def expect(self, g=None):
        """The expected answer on givens `g` (the lecture's when None)."""
        if self.kind == "choice" or not callable(self.expected):
            return self.expected
        if not self.takes_givens:
            return self.expected()
        return self.expected(g if g is not None else namespace(GIVENS[self.lab].lecture))

    def value_spec(self, g=None) -> dict:
        """The judge's spec on givens `g` (the lecture's when None); `mistakes` and `keys` may depend on them."""
        g = g if g is not None or not self.takes_givens else namespace(GIVENS[self.lab].lecture)
        spec = {key: (v(g) if self.takes_givens else v()) if callable(v) and key in ("mistakes", "keys") else v
                for key, v in self.spec.items()}
        want = self.expect(g)
        spec["want"] = sorted(want) if isinstance(want, (set, frozenset)) else data.plain(want)
        if self.kind == "value":
            spec["mistakes"] = [[data.plain(w), r] for w, r in spec.get("mistakes", ())]
            if "keys" in spec:
                spec["keys"] = {k: {**v, "mistakes": [[data.plain(w), r] for w, r in v.get("mistakes", ())]}
                                for k, v in spec["keys"].items()}
        return spec

    def cases(self, rng: random.Random) -> list[Case]:
        return list(self.make_cases(rng))

    # --- judging in this process (tests, the build's self-check) ----------------------------------------
    def prepare(self, rng: random.Random | None = None):
        rng = rng if rng is not None else case_rng(self.id)
        return self.cases(rng) if self.kind == "function" else self.expect()

    def verdict(self, answer, prepared) -> None:
        """Raise judge.Mismatch or judge.Unfinished unless `answer` passes on `prepared` (expected value or cases)."""
        if self.kind != "function":
            spec = {**self.value_spec(), "want": sorted(prepared) if isinstance(prepared, (set, frozenset))
                    else data.plain(prepared)}
            return judge.verdict(data.parse(data.dumps(answer)), judge.readable(spec))
        for c in prepared:
            judge.observed(data.reread(observe(answer, c.input())), judge.readable(c.public_spec(self.name)))

    def grade(self, answer, rng: random.Random | None = None) -> None:
        self.verdict(answer, self.prepare(rng))


def register(checkoff: Checkoff) -> Checkoff:
    validate_id(checkoff.id)
    if checkoff.expected is Ellipsis or "..." in (checkoff.hint, checkoff.title) or checkoff.make_cases is Ellipsis:
        raise ValueError(f"checkoff {checkoff.id} still holds the scaffold's `...`: write its formula, title and hint")
    if not checkoff.hint.strip() or not checkoff.title.strip():
        raise ValueError(f"checkoff {checkoff.id}: a title and a hint are required")
    old = REGISTRY.get(checkoff.id)
    if old is not None and old.module != checkoff.module:
        raise ValueError(f"checkoff {checkoff.id} is registered twice: by {old.module} and {checkoff.module}")
    REGISTRY[checkoff.id] = checkoff
    return checkoff


def _module() -> str:
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def _names(forbid: Iterable[str]) -> tuple[str, ...]:
    forbid = (forbid,) if isinstance(forbid, str) else tuple(forbid)
    for name in forbid:
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$", name):
            raise ValueError(f"forbid= wants dotted names such as 'labsupport.ledger.ridge_batch', got {name!r}")
    return forbid


def value(checkoff_id: str, title: str, *, expected, hint: str, rel_tol: float = 1e-9, abs_tol: float = 0.0,
          unit: str = "", mistakes: Iterable[tuple[Any, str]] | Callable = (), forbid: Iterable[str] = (),
          derive: str = "", fixed: str = "", keys: dict | Callable | None = None, unordered: bool = False,
          whole: bool = False, judge_name: str = "", **judge_data) -> Checkoff:
    """A value checked against `expected` (a function of the lab's givens, or of nothing when `fixed`).

    `keys` gives each key of a dict answer its own tolerance and mistakes; `mistakes` and `keys` may be
    functions of the givens, so that hidden givens name a slip too.  `judge_name` names a judge of
    judge.JUDGES for an answer no generic rule fits, and `judge_data` is the plain data it reads."""
    lab = int(validate_id(checkoff_id).split(".")[0])
    takes = callable(expected) and len(inspect.signature(expected).parameters) == 1
    if takes and lab not in GIVENS:
        raise ValueError(f"checkoff {checkoff_id}: expected takes the givens, but lab {lab:02d} declares none")
    if lab in GIVENS and not takes and not fixed.strip():
        raise ValueError(f"checkoff {checkoff_id}: lab {lab:02d} has givens; make expected a function of them "
                         "(lambda g: ...) or say in fixed= why this answer has nothing to vary")
    spec = {"rel_tol": rel_tol, "abs_tol": abs_tol, "unit": unit,
            "mistakes": mistakes if callable(mistakes) else [(w, r) for w, r in mistakes]}
    optional = {"keys": keys, "unordered": bool(unordered), "whole": bool(whole), "judge": judge_name}
    spec.update({k: v for k, v in optional.items() if v}, **judge_data)
    return register(Checkoff(checkoff_id, title, hint, "value", _module(), _names(forbid), derive, fixed.strip(),
                             expected, spec))


def choice(checkoff_id: str, title: str, *, answer: str | Iterable[str], options: Iterable[str], hint: str,
           mistakes: dict[str, str] | None = None) -> Checkoff:
    """One option (text) or a set of options; case and spaces do not matter."""
    options = tuple(o.lower() for o in options)
    multi = not isinstance(answer, str)
    want = frozenset(a.lower() for a in answer) if multi else answer.lower()
    if (set(want) if multi else {want}) - set(options):
        raise ValueError(f"checkoff {checkoff_id}: the answer is not among the options {options}")
    spec = {"options": list(options), "multi": multi, "mistakes": {k.lower(): v for k, v in (mistakes or {}).items()}}
    return register(Checkoff(checkoff_id, title, hint, "choice", _module(), (), "", "a choice", want, spec))


def function(checkoff_id: str, title: str, *, hint: str, forbid: Iterable[str] = (), derive: str = "",
             name: str = "") -> Callable[[Callable], Checkoff]:
    """Decorator over the cases' generator, ``def _(rng): yield case(...)``; `name` is the function's, for messages."""
    forbid = _names(forbid)

    def wrap(make_cases: Callable) -> Checkoff:
        return register(Checkoff(checkoff_id, title, hint, "function", make_cases.__module__, forbid, derive,
                                 make_cases=make_cases, name=name or "your function"))
    return wrap
