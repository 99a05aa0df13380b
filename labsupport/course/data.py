"""Plain data: what a checkoff's inputs and a student's answers become on their way across (every lab).

Answers leave the student's process as strict JSON and nothing else, so the grader never holds an
object of the student's (never unpickles, never calls a method the student defined).  `plain` turns a
value into that data; `parse` reads it back, with bounds, as the grader's own built-in types:

    None, bools, ints, finite floats, text      as themselves
    a Fraction or Decimal, a numpy scalar       an int when whole, else a float
    list, tuple                                 a list
    a dict with text keys                       a dict
    nan, inf, -inf                              {"$": "float", "v": "nan"}
    a set, a dict with other keys               {"$": "set", "items": [...]}, {"$": "dict", "items": [[k, v], ...]}
    a torch tensor or numpy array               {"$": "tensor", "dtype": "int64", "shape": [...], "values": [...]}
    the placeholder ``...``                     {"$": "unfinished"}
    a function, anything else                   {"$": "function", "name": ...}, {"$": "object", "type": ...}

A function checkoff's inputs go the other way, into the sandbox, as data too: labsupport's own objects
as the recipe that makes them, ``{"$": "new", "make": "module:Type", "args", "kwargs", "calls"}``,
written by `live` (or `plain`, for a frozen dataclass) and rebuilt by `build`.
"""
from __future__ import annotations

import dataclasses
import decimal
import fractions
import importlib
import json
import math
import operator

MAX_DEPTH = 40
MAX_ITEMS = 2_000_000  # list items, dict entries and tensor elements in one answer
MAX_TEXT = 64 * 2**20  # characters of JSON read back
MAX_INT_BITS = 4000  # a longer whole number is not handed over: JSON has no limit, Python's int-to-text has one


class DataError(ValueError):
    """Text that is not plain data in the agreed shape, or too much of it."""


def contains_unfinished(value, _depth: int = 0) -> bool:
    """``...`` alone or inside built-in containers (only exact built-in types are opened)."""
    if value is Ellipsis:
        return True
    if _depth > MAX_DEPTH or type(value) not in (dict, list, tuple, set, frozenset):
        return False
    return any(contains_unfinished(v, _depth + 1) for v in (value.values() if type(value) is dict else value))


def _number(x):
    if isinstance(x, float) and not math.isfinite(x):
        return {"$": "float", "v": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    return x


def _exact(x: fractions.Fraction | decimal.Decimal) -> int | float:
    """A Fraction or a Decimal as JSON can carry it: an int when it is whole (exactly), else the nearest float."""
    try:
        if isinstance(x, fractions.Fraction) and x.denominator == 1:
            return x.numerator
        if isinstance(x, decimal.Decimal) and x.is_finite() and x == x.to_integral_value() and x.adjusted() < 1200:
            return int(x)  # a whole Decimal past 1200 digits is a float's infinity: int() of 1e999999999 never ends
        return float(x)
    except OverflowError:  # a Fraction past a float's range
        return math.inf if x > 0 else -math.inf
    except ValueError:  # a signalling NaN
        return math.nan


def plain_numbers(values) -> bool:
    """Whether every item is a finite float or an int within 64 bits: such a list (a block table, an engine run's
    token times) is plain data as it is, item by item, with no walk through it."""
    return all(type(v) is float and math.isfinite(v) or type(v) is int and abs(v) < 2**63 for v in values)


def _tensor(x) -> dict | None:
    kind = type(x).__module__.split(".")[0]
    if kind == "torch" and type(x).__name__ in ("Tensor", "Parameter"):
        t = x.detach().cpu()
        dtype, shape = str(t.dtype).replace("torch.", ""), list(t.shape)
        values = t.float().reshape(-1).tolist() if dtype == "bfloat16" else t.reshape(-1).tolist()
    elif kind == "numpy" and type(x).__name__ == "ndarray":
        dtype, shape, values = str(x.dtype), list(x.shape), x.reshape(-1).tolist()
    else:
        return None
    return {"$": "tensor", "dtype": dtype, "shape": shape, "values": [_number(v) for v in values]}


def plain(x, _depth: int = 0, _count: list | None = None):
    """`x` as plain data (see the module's docstring); a value too deep or too large raises DataError."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_ITEMS or _depth > MAX_DEPTH:
        raise DataError("the answer is too large or too deeply nested to hand over")
    if type(x) is int and x.bit_length() > MAX_INT_BITS:
        return {"$": "object", "type": f"whole number of {x.bit_length():,} bits"}
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return _number(x)
    if isinstance(x, (fractions.Fraction, decimal.Decimal)):
        return plain(_exact(x), _depth, count)
    if x is Ellipsis:
        return {"$": "unfinished"}
    if type(x) in (list, tuple):
        if _depth < MAX_DEPTH and plain_numbers(x):
            count[0] += len(x)  # a list of plain numbers (a block table, token times) is itself: one item each
            if count[0] > MAX_ITEMS:
                raise DataError("the answer is too large or too deeply nested to hand over")
            return list(x)
        return [plain(v, _depth + 1, count) for v in x]
    if type(x) is dict:
        if all(type(k) is str and not k.startswith("$") for k in x):
            return {k: plain(v, _depth + 1, count) for k, v in x.items()}
        items = [[plain(k, _depth + 1, count), plain(v, _depth + 1, count)] for k, v in x.items()]
        return {"$": "dict", "items": items}
    if type(x) in (set, frozenset):
        return {"$": "set", "items": [plain(v, _depth + 1, count) for v in x]}
    if isinstance(x, Live):
        return x.recipe(count)
    tensor = _tensor(x)
    if tensor is not None:
        count[0] += len(tensor["values"])
        if count[0] > MAX_ITEMS:
            raise DataError("the answer is too large to hand over")
        return tensor
    if type(x).__module__.split(".")[0] == "numpy" and getattr(type(x), "item", None) is not None:  # a scalar
        return plain(x.item(), _depth, count)
    if dataclasses.is_dataclass(x) and type(x).__module__.startswith("labsupport.") \
            and type(x).__dataclass_params__.frozen:
        fields = {f.name: plain(getattr(x, f.name), _depth + 1, count) for f in dataclasses.fields(x) if f.init}
        return {"$": "new", "make": f"{type(x).__module__}:{type(x).__qualname__}", "args": [], "kwargs": fields,
                "calls": []}
    if callable(x):
        return {"$": "function", "name": str(getattr(x, "__name__", "function"))[:80]}
    return {"$": "object", "type": str(type(x).__name__)[:80]}


def dumps(x) -> str:
    """`x` as one line of strict JSON (lone surrogates escaped, so any text survives)."""
    return json.dumps(plain(x), ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def reread(already_plain):
    """Plain data (an observation, an answer event) as the grader reads it back off the pipe."""
    return parse(json.dumps(already_plain, ensure_ascii=True, allow_nan=False))


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor as handed over: its dtype's name, shape and values (flat), compared as data."""
    dtype: str
    shape: tuple
    values: tuple


@dataclasses.dataclass(frozen=True)
class Other:
    """Something plain data has no word for: a function (`kind` "function") or an object of some type."""
    kind: str
    name: str


UNFINISHED = Other("unfinished", "...")


def _reject_constant(name):
    raise DataError(f"not strict JSON ({name})")


def parse(text: str | bytes):
    """Strict JSON back (on the grader's side) into built-in types, `Tensor` and `Other`; DataError on anything else."""
    if len(text) > MAX_TEXT:
        raise DataError(f"{len(text):,} characters of data, more than the {MAX_TEXT:,} read back")
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise DataError(f"not strict JSON ({str(exc)[:80]})") from None
    return unplain(raw)


def unplain(data, _depth: int = 0, _count: list | None = None):
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_ITEMS or _depth > MAX_DEPTH:
        raise DataError("the data is too large or too deeply nested")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [unplain(v, _depth + 1, count) for v in data]
    if type(data) is not dict:
        raise DataError(f"unexpected {type(data).__name__}")
    tag = data.get("$")
    if tag is None:
        return {k: unplain(v, _depth + 1, count) for k, v in data.items()}
    try:
        if tag == "float":
            return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[data["v"]])
        if tag == "set":
            return frozenset(_hashable(unplain(v, _depth + 1, count)) for v in data["items"])
        if tag == "dict":
            return {_hashable(unplain(k, _depth + 1, count)): unplain(v, _depth + 1, count) for k, v in data["items"]}
        if tag == "tensor":
            values = tuple(unplain(v, _depth + 1, count) for v in data["values"])
            count[0] += len(values)
            shape = tuple(int(n) for n in data["shape"])
            if math.prod(shape) != len(values) or not all(type(v) in (bool, int, float) for v in values):
                raise DataError("a tensor whose shape and values disagree")
            return Tensor(str(data["dtype"])[:40], shape, values)
        if tag == "unfinished":
            return UNFINISHED
        if tag in ("function", "object"):
            return Other(tag, str(data.get("name", data.get("type", "")))[:80])
        if tag == "new":  # one of labsupport's objects, handed back: named by its type
            return Other("object", str(data.get("make", "")).rpartition(":")[2][:80])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"a malformed {tag!r} item ({type(exc).__name__})") from None
    raise DataError(f"an unknown tag {str(tag)[:40]!r}")


def _hashable(x):
    if isinstance(x, list):
        return tuple(_hashable(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    return x


class Live:
    """One of labsupport's objects, made in the grader, that remembers how it was made: it behaves as the
    real object and records each method called on it (change it only through its methods, never through an
    attribute it hands out), so that `build` can replay it where the student's function runs, to the same
    state: the mechanisms are deterministic."""

    def __init__(self, make, *args, **kwargs):
        self._make, self._args, self._kwargs, self._calls = make, args, kwargs, []
        self.real = make(*args, **kwargs)

    def __getattr__(self, name):
        value = getattr(self.real, name)
        if not callable(value) or name.startswith("__"):
            return value

        def recorded(*args, **kwargs):
            self._calls.append((name, args, kwargs))
            return value(*args, **kwargs)
        return recorded

    def recipe(self, count: list) -> dict:
        owner = getattr(self._make, "__self__", None)  # a classmethod: named through the class it was called on
        make = (f"{owner.__module__}:{owner.__qualname__}.{self._make.__name__}" if isinstance(owner, type)
                else f"{self._make.__module__}:{self._make.__qualname__}")
        return {"$": "new", "make": make, "args": plain(list(self._args), 1, count),
                "kwargs": plain(self._kwargs, 1, count),
                "calls": [[n, plain(list(a), 1, count), plain(k, 1, count)] for n, a, k in self._calls]}


live = Live  # as a lab's graders write it: live(ContiguousAllocator, 4096, kv_bytes_per_token=KV)
_MADE: dict[str, object] = {}  # a function-made Live's value as data, by its recipe: many cases share one run


def as_input(x, _depth: int = 0):
    """A case's input as `grade` sends it into the sandbox: plain data, with what a function `live(...)` made (a
    seeded engine run) as that value itself, {"$": "shared", "value": ...}, never the recipe that made it (from its
    seed the run's every other output follows); a labsupport dataclass, frozen or not, as the call that makes it
    from its fields.  A live made by a class (an allocator) stays its recipe: the object, built as it was."""
    if _depth > MAX_DEPTH:
        raise DataError("the input is too deeply nested")
    kind = type(x)
    if x is None or kind is str or kind is bool or kind is int and x.bit_length() <= MAX_INT_BITS:
        return x  # the leaves of an engine run, most of the calls: plain as they are (as `plain` returns them)
    if kind is float:
        return _number(x)
    if isinstance(x, Live) and not (isinstance(x._make, type) or isinstance(getattr(x._make, "__self__", None), type)):
        key = json.dumps(x.recipe([0]), sort_keys=True)
        if key not in _MADE:
            if len(_MADE) > 32:
                _MADE.clear()
            _MADE[key] = as_input(x.real, _depth + 1)
        return {"$": "shared", "value": _MADE[key]}
    if type(x) in (list, tuple):
        if plain_numbers(x):
            return list(x)  # an engine run's token times: plain as they are, at a planning's scale (issue 34)
        return [as_input(v, _depth + 1) for v in x]
    if type(x) is dict and all(type(k) is str and not k.startswith("$") for k in x):
        return {k: as_input(v, _depth + 1) for k, v in x.items()}
    if (names := _init_fields(kind)) is not None:
        fields = {name: as_input(getattr(x, name), _depth + 1) for name in names}
        return {"$": "new", "make": f"{kind.__module__}:{kind.__qualname__}", "args": [], "kwargs": fields,
                "calls": []}
    return plain(x, _depth)


_INIT_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _init_fields(kind: type) -> tuple[str, ...] | None:
    """The fields a labsupport dataclass's constructor takes, in order; None for any other type (read once a type:
    an engine run hands over thousands of requests)."""
    if kind not in _INIT_FIELDS:
        made = dataclasses.is_dataclass(kind) and kind.__module__.startswith("labsupport.")
        _INIT_FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind) if f.init) if made else None
    return _INIT_FIELDS[kind]


def share(inputs):
    """`inputs` with each shared value (`as_input`) sent once: ({"$": "ref", "i": n} in its places, the values)."""
    table: list = []
    index: dict[int, int] = {}

    def walk(x):
        if type(x) is list:
            return [walk(v) for v in x]
        if type(x) is not dict:
            return x
        if x.get("$") == "shared":
            if id(x["value"]) not in index:
                index[id(x["value"])] = len(table)
                table.append(x["value"])
            return {"$": "ref", "i": index[id(x["value"])]}
        return {k: walk(v) for k, v in x.items()}
    return walk(inputs), table


def resolve(data, shared: list = ()):
    """Plain data with each shared value (`share`) put back in its places, still plain (a harness's input)."""
    if type(data) is list:
        return [resolve(v, shared) for v in data]
    if type(data) is not dict:
        return data
    if data.get("$") in ("ref", "shared"):
        return resolve(shared[data["i"]] if data["$"] == "ref" else data["value"], shared)
    return {k: resolve(v, shared) for k, v in data.items()}


def build(data, shared: list = ()):
    """Plain input data as the objects a student's function is called with; recipes make only labsupport's;
    `shared` holds what {"$": "ref"} names (`share`), built afresh at each place."""
    if type(data) is list:
        return [build(v, shared) for v in data]
    if type(data) is not dict:
        return data
    tag = data.get("$")
    if tag is None:
        return {k: build(v, shared) for k, v in data.items()}
    if tag == "ref":
        return build(shared[data["i"]], shared)
    if tag == "shared":
        return build(data["value"], shared)
    if tag == "new":
        module, _, name = data["make"].partition(":")
        if not module.startswith("labsupport.") or module.startswith("labsupport.course.checkoffs"):
            raise DataError(f"a recipe may only make labsupport's objects, not {data['make']!r}")
        make = operator.attrgetter(name)(importlib.import_module(module))  # a dotted name: a classmethod
        obj = make(*build(data["args"], shared), **build(data["kwargs"], shared))
        for method, args, kwargs in data["calls"]:
            getattr(obj, method)(*build(args, shared), **build(kwargs, shared))
        return obj
    if tag == "tensor":
        import torch
        values = [float(unplain(v)) if isinstance(v, dict) else v for v in data["values"]]
        return torch.tensor(values, dtype=getattr(torch, data["dtype"])).reshape(data["shape"])
    if tag == "dict":
        return {_hashable(build(k, shared)): build(v, shared) for k, v in data["items"]}
    if tag == "set":
        return {_hashable(build(v, shared)) for v in data["items"]}
    return unplain(data)
