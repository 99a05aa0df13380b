"""labsupport.course.codec: what a student's process may hand the grader arrives as the grader's own plain data.

The expectations are written by hand: a value crosses as the built-in it stands for, an object
with a lying ``__eq__`` crosses as the number (or stand-in) it really is, and anything off-shape
is refused with a DecodeError rather than turned into an object.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from labsupport.course import codec
from labsupport.course.codec import DecodeError, HandedFunction, Opaque, Unfinished
from labsupport.specs import LECTURE_7B, LECTURE_GPU


def roundtrip(x, objects=False):
    return codec.loads(codec.dumps(x, objects=objects), objects=objects)


@pytest.mark.parametrize("value", [0, -3, 2**80, 1.5, -0.0, "tëxt", None, True, False, [1, [2, "x"]],
                                   {"a": 1, "b": [None]}])
def test_plain_values_cross_as_themselves(value):
    got = roundtrip(value)
    assert got == value and type(got) is type(value)


def test_containers_keep_their_kind():
    got = roundtrip({"t": (1, 2), "s": {3, 4}, "f": frozenset({5}), "d": {1: "one", (2, 3): "pair"}})
    assert got == {"t": (1, 2), "s": {3, 4}, "f": frozenset({5}), "d": {1: "one", (2, 3): "pair"}}
    assert type(got["t"]) is tuple and type(got["s"]) is set and type(got["f"]) is frozenset
    # a text-keyed dict that looks like a tag stays a dict
    assert roundtrip({"__tuple__": [1]}) == {"__tuple__": [1]}


def test_non_finite_floats_are_tagged_and_the_text_stays_strict_json():
    text = codec.dumps([math.inf, -math.inf, math.nan])
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    inf, minus, nan = codec.loads(text)
    assert inf == math.inf and minus == -math.inf and math.isnan(nan)


def test_tensors_travel_as_raw_bytes_exactly():
    x = torch.tensor([[1.0, float("nan")], [2.5, -0.0]], dtype=torch.float32)
    got = roundtrip(x)
    assert got.dtype == torch.float32 and got.shape == (2, 2)
    assert torch.equal(got.nan_to_num(7.0), x.nan_to_num(7.0))
    big = torch.arange(2**31 - 3, 2**31 + 3, dtype=torch.int64)
    assert torch.equal(roundtrip(big), big)
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert torch.equal(roundtrip(bf), bf)
    arr = np.array([1, 2, 3], dtype=np.int32)
    assert roundtrip(arr).tolist() == [1, 2, 3]
    assert roundtrip(torch.tensor(3.0)).item() == 3.0  # a 0-d tensor stays a tensor; as_number reads it


def test_lying_objects_arrive_as_what_they_are():
    class Liar(float):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

    got = roundtrip([Liar(1.0), Anything()])
    assert type(got[0]) is float and got[0] == 1.0 and got[0] != 2.0
    assert isinstance(got[1], Opaque) and got[1] != 1 and "Anything" in got[1].type_name


def test_functions_and_placeholders_are_named_not_sent():
    def per_token(*a):
        return 1

    placeholder = type("Unfinished", (), {})()  # the student copy's placeholder, whatever module defines it

    got = roundtrip([per_token, ..., placeholder])
    assert got[0] == HandedFunction("per_token") and callable(got[0])
    assert isinstance(got[1], Unfinished) and isinstance(got[2], Unfinished)
    assert codec.contains_unfinished({"a": [1, got[2]]}) and not codec.contains_unfinished({"a": [1, 2]})


def test_labsupport_objects_travel_only_towards_a_worker():
    text = codec.dumps([LECTURE_7B, LECTURE_GPU], objects=True)
    model, gpu = codec.loads(text, objects=True)
    assert model == LECTURE_7B and gpu == LECTURE_GPU
    with pytest.raises(DecodeError, match="not allowed"):
        codec.loads(text)  # the grader's side never rebuilds objects
    assert isinstance(roundtrip([LECTURE_7B])[0], Opaque)  # returned by a student: a stand-in, not the object


@pytest.mark.parametrize("text, words", [
    ('[NaN]', "strict"), ('{"x": Infinity}', "strict"), ("[1,", "not JSON"), (b"\xff\xfe", "UTF-8"),
    ('{"__pickle__": "gASV"}', "not allowed"), ('{"__obj__": {"type": "os:system", "state": {}}}', "not allowed"),
    ('{"__tensor__": {"dtype": "object", "shape": [1], "data": ""}}', "known dtype"),
    ('{"__tensor__": {"dtype": "int32", "shape": [3], "data": "AAAA"}}', "bytes"),
    ('{"__tensor__": {"dtype": "int32", "shape": [-1], "data": ""}}', "shape"),
    ('{"__set__": [[1]]}', "unhashable"), ('{"__float__": "1e999"}', "not allowed"),
    ('[' * 5000 + ']' * 5000, "deep"),
])
def test_off_shape_data_is_refused(text, words):
    with pytest.raises(DecodeError, match=words):
        codec.loads(text)


def test_an_encoding_that_never_ends_is_refused_not_followed():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="deep"):
        codec.dumps(loop)


def test_the_collector_appends_one_plain_line_per_answer(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.touch()
    collect = codec.collector(str(path))

    class Explodes:
        def __repr__(self):
            raise RuntimeError("no")

        def __iter__(self):
            raise RuntimeError("no")

    collect("2.1", 2**31, 0)
    collect("2.3", lambda a, b: 0, 0)
    collect("2.2", ..., 1)
    collect("2.4", Explodes(), 0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["id"], r["index"], r["callable"]) for r in records] == [
        ("2.1", 0, False), ("2.3", 0, True), ("2.2", 1, False), ("2.4", 0, False)]
    assert records[0]["value"] == 2**31 and records[1]["value"] == {"__callable__": "<lambda>"}
    assert "__unfinished__" in records[2]["value"] and "__opaque__" in records[3]["value"]
