"""Plain data across a process boundary: what a student's kernel or worker may hand the grader.

`grade` never unpickles, never keeps an object the student's code made, and never calls a method
the student's code defined.  Whatever crosses from the student's side is text in strict JSON (no
NaN, no Infinity), turned back here into the grader's own built-in types:

    numbers, strings, None, booleans, lists, dicts with text keys   as themselves
    tuple, set, frozenset, a dict with other keys                     {"__tuple__": [...]}, ...
    nan, inf, -inf                                                    {"__float__": "nan"}
    a torch tensor or numpy array                                     {"__tensor__": {dtype, shape, data}}
                                                                      (the raw bytes, base64, little-endian)
    a function                                                        {"__callable__": "its name"}
    an exercise still unfinished (``...``, an ``Unfinished`` object)  {"__unfinished__": "..."}
    anything else                                                     {"__opaque__": {"type", "repr"}}

A value with a lying ``__eq__`` therefore arrives as a plain number, list or `Opaque` stand-in, and
the grader compares that.  The other direction (grader -> worker, where the student's function is
called) may also carry a few of labsupport's own objects, rebuilt field by field (``__obj__``); the
grader's decoder refuses those.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import math
import numbers
import sys
from collections import deque

# dtype name -> (bytes per element, torch attribute); bfloat16 travels as its raw 2-byte pattern
TENSOR_DTYPES = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}
MAX_DEPTH = 60
MAX_ITEMS = 4_000_000  # list elements, dict entries and tensor elements in one message
MAX_TEXT = 256 * 2**20  # bytes of JSON in one message
REPR_CHARS = 200

# labsupport objects the grader may send to a worker as arguments ("module:Class").
TRANSPORTABLE = (
    "labsupport.specs:ModelSpec", "labsupport.specs:GPUSpec",
    "labsupport.contiguous:ContiguousAllocator", "labsupport.contiguous:ReserveToMaxAllocator",
    "labsupport.contiguous:Slot", "labsupport.engine:RequestResult",
)


class DecodeError(ValueError):
    """The text is not plain data in the agreed shape; the message says where."""


@dataclasses.dataclass(frozen=True)
class Opaque:
    """Stands in, on the grader's side, for an object of a type plain data has no word for."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return f"<{self.type_name}: {self.text}>"


@dataclasses.dataclass(frozen=True)
class HandedFunction:
    """Stands in for a function handed in where a value was expected (the grader cannot call it)."""

    name: str

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.name} is a function handed to a value checkoff")

    @property
    def __name__(self) -> str:  # noqa: PLW3201 - reads like a function in messages
        return self.name


@dataclasses.dataclass(frozen=True)
class Callback:
    """A callable argument of the grader's, called back from the worker by number (grader -> worker only)."""

    number: int


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """An exercise left as the student copy gave it (``...`` or an ``Unfinished`` placeholder)."""

    text: str = "..."


def is_unfinished(value) -> bool:
    """The student copy's placeholder for an exercise not done yet (checked by type name: the kernel's class)."""
    return value is Ellipsis or type(value).__name__ == "Unfinished"


def contains_unfinished(value, _depth: int = 0) -> bool:
    """A placeholder, alone or inside built-in containers.

    Only exact built-in container types are opened, so an object of the student's is never asked
    anything (none of its `__eq__`, `__iter__` or `values` runs): this also serves `check()` in the
    student's own kernel.
    """
    if isinstance(value, Unfinished) or is_unfinished(value):
        return True
    if _depth > MAX_DEPTH:
        return False
    if type(value) is dict:
        return any(contains_unfinished(v, _depth + 1) for v in value.values())
    if type(value) in (list, tuple, set, frozenset):
        return any(contains_unfinished(v, _depth + 1) for v in value)
    return False


# --- encoding (any process; on the student's side it only ever produces claims) -----------------

def _short_repr(x) -> str:
    try:
        text = repr(x)
    except BaseException as exc:  # noqa: BLE001 - a hostile __repr__ is only text we do not get
        text = f"<repr raised {type(exc).__name__}>"
    if not isinstance(text, str):
        text = "<repr returned no text>"
    return text if len(text) <= REPR_CHARS else text[:REPR_CHARS - 1] + "…"


def _type_name(x) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ not in ("builtins", "__main__") else t.__qualname__


def _tensor(x) -> dict | None:
    """A torch tensor or numpy array as dtype, shape and raw bytes; None if `x` is neither."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype"):
        t = x.detach().cpu().contiguous()
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in TENSOR_DTYPES:
            return None
        import torch

        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        data = bytes(raw.numpy().tobytes())
        if sys.byteorder == "big" and TENSOR_DTYPES[dtype] > 1:  # pragma: no cover - little-endian wire format
            return None
        return {"dtype": dtype, "shape": [int(s) for s in t.shape], "data": base64.b64encode(data).decode()}
    if mod.startswith("numpy") and hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "tobytes"):
        import numpy as np

        arr = np.ascontiguousarray(x)
        dtype = str(arr.dtype)
        if dtype not in TENSOR_DTYPES:
            return None
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        return {"dtype": dtype, "shape": [int(s) for s in arr.shape],
                "data": base64.b64encode(arr.tobytes()).decode()}
    return None


def _transportable_name(x) -> str:
    t = type(x)
    name = f"{t.__module__}:{t.__qualname__}"
    return name if name in TRANSPORTABLE else ""


def _count_item(count: list | None, depth: int, error: type) -> list:
    """One more item seen at this depth; `error` when the data is too large or too deep to be plain."""
    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise error(f"more than {MAX_ITEMS:,} items")
    if depth > MAX_DEPTH:
        raise error(f"nested more than {MAX_DEPTH} levels deep")
    return count


def to_plain(x, *, objects: bool = False, _depth: int = 0, _count: list | None = None):
    """`x` as JSON-ready plain data with tags; `objects` also carries labsupport's transportable objects."""
    count = _count_item(_count, _depth, ValueError)
    rec = lambda v: to_plain(v, objects=objects, _depth=_depth + 1, _count=count)  # noqa: E731
    if x is None or type(x) is bool:
        return x
    if is_unfinished(x) or isinstance(x, Unfinished):
        return {"__unfinished__": _short_repr(x)}
    if isinstance(x, str):
        return str(x)
    if isinstance(x, numbers.Integral) and not _tensor_like(x):
        return int(x)
    if isinstance(x, numbers.Real) and not _tensor_like(x):
        f = float(x)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    tensor = _tensor(x)
    if tensor is not None:
        count[0] += len(tensor["data"]) // 8
        return {"__tensor__": tensor}
    if isinstance(x, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(x)).decode()}
    if isinstance(x, tuple):
        return {"__tuple__": [rec(v) for v in tuple(x)]}
    if isinstance(x, (list, deque)):
        return [rec(v) for v in list(x)]
    if isinstance(x, frozenset):
        return {"__frozenset__": [rec(v) for v in x]}
    if isinstance(x, set):
        return {"__set__": [rec(v) for v in x]}
    if isinstance(x, dict):
        items = list(dict.items(x))
        if all(type(k) is str and not k.startswith("__") for k, _ in items):
            return {k: rec(v) for k, v in items}
        return {"__dict__": [[rec(k), rec(v)] for k, v in items]}
    if objects:
        name = _transportable_name(x)
        if name:
            state = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)} if dataclasses.is_dataclass(x) \
                else dict(vars(x))
            return {"__obj__": {"type": name, "state": rec(state)}}
    if isinstance(x, Opaque):
        return {"__opaque__": {"type": x.type_name, "repr": x.text}}
    if isinstance(x, Callback) and objects:
        return {"__callback__": x.number}
    if callable(x):
        name = getattr(x, "__name__", None)
        return {"__callable__": name if isinstance(name, str) else _type_name(x)}
    return {"__opaque__": {"type": _type_name(x), "repr": _short_repr(x)}}


def _tensor_like(x) -> bool:
    mod = type(x).__module__ or ""
    return (mod.startswith("torch") or mod.startswith("numpy")) and hasattr(x, "shape") and getattr(x, "shape", ()) != ()


def dumps(x, *, objects: bool = False) -> str:
    """Strict JSON text for `x` (see `to_plain`)."""
    return json.dumps(to_plain(x, objects=objects), allow_nan=False, ensure_ascii=True, separators=(",", ":"))


def collector(path: str):
    """The function `grade` binds in a kernel in place of check(): it appends each answer handed to it,
    as one line of plain data, to the grader's answers file (what it hands over is all the grader reads)."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    write, encode, dump = os.write, to_plain, json.dumps

    def collect(checkoff_id, value, index=0):
        head = {"id": str(checkoff_id), "index": int(index)}
        try:
            head["callable"] = bool(callable(value)) and not is_unfinished(value)
            line = dump({**head, "value": encode(value)}, allow_nan=False, separators=(",", ":"))
        except BaseException as exc:  # noqa: BLE001 - an answer we cannot read is reported as such
            what = {"__opaque__": {"type": "unreadable", "repr": f"{type(exc).__name__}: {exc}"[:REPR_CHARS]}}
            line = dump({**head, "callable": False, "value": what})
        write(fd, (line + "\n").encode())

    return collect


# --- decoding ------------------------------------------------------------------------------------

def _reject_constant(name: str):
    raise DecodeError(f"{name} is not strict JSON")


def parse(text: str | bytes):
    """Strict JSON (no NaN/Infinity), within the size limit; raises DecodeError."""
    if isinstance(text, bytes):
        if len(text) > MAX_TEXT:
            raise DecodeError(f"a message of {len(text):,} bytes is over the {MAX_TEXT:,}-byte limit")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8 ({exc.reason})") from None
    if not isinstance(text, str):
        raise DecodeError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise DecodeError(f"a message of {len(text):,} characters is over the limit")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise DecodeError("nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc.msg} at character {exc.pos}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise DecodeError(str(exc).split(";")[0][:200]) from None


def from_plain(data, *, objects: bool = False, tensors: bool = True, callback=None, _depth: int = 0,
               _count: list | None = None):
    """The grader's own built-in values for tagged plain data; anything off-shape is a DecodeError.

    `objects` (the worker's side only) rebuilds labsupport's transportable objects, and `callback`
    turns a ``__callback__`` number into something callable.
    """
    count = _count_item(_count, _depth, DecodeError)
    rec = lambda v: from_plain(v, objects=objects, tensors=tensors, callback=callback, _depth=_depth + 1,  # noqa: E731
                               _count=count)
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is float:
        if not math.isfinite(data):
            raise DecodeError("a non-finite float outside its tag")
        return data
    if type(data) is list:
        return [rec(v) for v in data]
    if type(data) is not dict:
        raise DecodeError(f"unexpected JSON type {type(data).__name__}")
    if len(data) == 1:
        (tag, body), = data.items()
        if tag.startswith("__") and tag.endswith("__"):
            if tag == "__callback__" and callback is not None and type(body) is int:
                return callback(body)
            return _decode_tag(tag, body, rec, objects, tensors, count)
    if any(k.startswith("__") for k in data):
        raise DecodeError(f"unknown tag among {sorted(data)[:3]}")
    return {k: rec(v) for k, v in data.items()}


def _decode_tag(tag, body, rec, objects, tensors, count):
    if tag == "__tuple__" and type(body) is list:
        return tuple(rec(v) for v in body)
    if tag in ("__set__", "__frozenset__") and type(body) is list:
        try:
            items = [rec(v) for v in body]
            return set(items) if tag == "__set__" else frozenset(items)
        except TypeError:
            raise DecodeError("a set holds an unhashable value") from None
    if tag == "__dict__" and type(body) is list:
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise DecodeError("a dict entry is not a [key, value] pair")
            try:
                out[rec(pair[0])] = rec(pair[1])
            except TypeError:
                raise DecodeError("a dict key is unhashable") from None
        return out
    if tag == "__float__" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "__bytes__" and type(body) is str:
        return _b64(body)
    if tag == "__callable__" and type(body) is str:
        return HandedFunction(body[:REPR_CHARS])
    if tag == "__unfinished__" and type(body) is str:
        return Unfinished(body[:REPR_CHARS])
    if tag == "__opaque__" and type(body) is dict and type(body.get("type")) is str and type(body.get("repr")) is str:
        return Opaque(body["type"][:REPR_CHARS], body["repr"][:REPR_CHARS])
    if tag == "__tensor__" and tensors and type(body) is dict:
        return _decode_tensor(body, count)
    if tag == "__obj__" and objects and type(body) is dict:
        return _decode_object(body, rec)
    raise DecodeError(f"tag {tag} is not allowed here")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise DecodeError("bad base64 data") from None


def _decode_tensor(body: dict, count: list):
    import torch

    dtype, shape, data = body.get("dtype"), body.get("shape"), body.get("data")
    if dtype not in TENSOR_DTYPES or type(shape) is not list or type(data) is not str:
        raise DecodeError("a tensor needs a known dtype, a shape and its data")
    if len(shape) > 16 or any(type(s) is not int or s < 0 for s in shape):
        raise DecodeError(f"bad tensor shape {shape!r}")
    numel = math.prod(shape)
    count[0] += numel
    if count[0] > MAX_ITEMS:
        raise DecodeError("tensor too large")
    raw = _b64(data)
    if len(raw) != numel * TENSOR_DTYPES[dtype]:
        raise DecodeError(f"tensor data holds {len(raw)} bytes, its shape {shape} and {dtype} need "
                          f"{numel * TENSOR_DTYPES[dtype]}")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape).clone()


def _decode_object(body: dict, rec):
    import importlib

    name, state = body.get("type"), body.get("state")
    if name not in TRANSPORTABLE or type(state) is not dict:
        raise DecodeError(f"object type {name!r} is not transportable")
    module, _, qualname = name.partition(":")
    cls = getattr(importlib.import_module(module), qualname)
    fields = {k: rec(v) for k, v in state.items()}
    if dataclasses.is_dataclass(cls):
        return cls(**fields)
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def loads(text: str | bytes, *, objects: bool = False, callback=None):
    """Parse and decode in one step (see `parse` and `from_plain`)."""
    return from_plain(parse(text), objects=objects, callback=callback)
