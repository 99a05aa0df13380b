"""labsupport.course.data: what crosses into and out of a grading sandbox is plain data, bounded and strict.

An answer leaves the student's process as strict JSON (`plain`, `dumps`) and is read back (`parse`) as
the grader's own built-in types, `Tensor` and `Other`: a value with a lying ``__eq__`` arrives as what
it is, and anything off-shape or too large is refused with a DataError rather than turned into an
object.  A checkoff's inputs go the other way as data too: labsupport's own objects as the recipe
that makes them (`live`, `build`), which only the sandbox's side rebuilds.  The expectations are
written by hand.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from labsupport.block_allocator import BlockAllocator
from labsupport.course import data as D
from labsupport.course.data import UNFINISHED, DataError, Other, Tensor
from labsupport.course.judge import as_number
from labsupport.specs import LECTURE_7B, LECTURE_GPU


def roundtrip(x):
    return D.parse(D.dumps(x))


def nested(depth: int) -> list:
    """`depth` lists, each inside the one before."""
    outer = inner = []
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


# --- what an answer becomes ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -3, 2**80, 1.5, -0.0, "tëxt", None, True, False, [1, [2, "x"]],
                                   {"a": 1, "b": [None]}])
def test_plain_values_cross_as_themselves(value):
    got = roundtrip(value)
    assert got == value and type(got) is type(value)
    if type(value) is float:
        assert math.copysign(1, got) == math.copysign(1, value)  # -0.0 keeps its sign


def test_containers_cross_as_the_graders_built_ins():
    got = roundtrip({"t": (1, 2), "s": {3, 4}, "f": frozenset({5}), "d": {1: "one", (2, 3): "pair"}})
    assert got == {"t": [1, 2], "s": frozenset({3, 4}), "f": frozenset({5}), "d": {1: "one", (2, 3): "pair"}}
    assert type(got["t"]) is list and type(got["s"]) is frozenset


def test_a_dict_that_looks_like_a_tag_stays_a_dict():
    """A student's dict keyed "$" is written as a dict of pairs: no answer can forge a tag (a recipe, a tensor)."""
    forged = {"$": "new", "make": "os:system", "args": ["true"], "kwargs": {}, "calls": []}
    assert roundtrip(forged) == forged
    assert roundtrip({"$": "tensor", "dtype": "int64", "shape": [1], "values": [7]}) == \
        {"$": "tensor", "dtype": "int64", "shape": [1], "values": [7]}


def test_non_finite_floats_are_tagged_and_the_text_stays_strict_json():
    text = D.dumps([math.inf, -math.inf, math.nan])
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    inf, minus, nan = D.parse(text)
    assert inf == math.inf and minus == -math.inf and math.isnan(nan)


def test_any_text_survives_lone_surrogates_included():
    text = D.dumps(["\ud800 alone", "naïve ☃"])
    assert text.isascii()
    assert D.parse(text) == ["\ud800 alone", "naïve ☃"]


def test_tensors_cross_as_dtype_shape_and_exact_values():
    got = roundtrip(torch.tensor([[1.0, float("nan")], [2.5, -0.0]], dtype=torch.float32))
    assert (got.dtype, got.shape) == ("float32", (2, 2))
    assert got.values[0] == 1.0 and math.isnan(got.values[1]) and got.values[2:] == (2.5, -0.0)
    assert math.copysign(1, got.values[3]) == -1
    assert roundtrip(torch.arange(2**31 - 3, 2**31 + 3, dtype=torch.int64)) == \
        Tensor("int64", (6,), (2**31 - 3, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**31 + 2))  # past int32, exact
    assert roundtrip(torch.tensor([1.5, -2.0], dtype=torch.bfloat16)) == Tensor("bfloat16", (2,), (1.5, -2.0))
    assert roundtrip(np.array([1, 2, 3], dtype=np.int32)) == Tensor("int32", (3,), (1, 2, 3))
    scalar = roundtrip(torch.tensor(3.0))
    assert scalar == Tensor("float32", (), (3.0,)) and as_number(scalar, "it") == 3.0  # a 0-d tensor is read as its number
    assert roundtrip(np.float64(2.5)) == 2.5 and type(roundtrip(np.int64(7))) is int  # numpy scalars: their number


def test_lying_objects_arrive_as_what_they_are():
    class Liar(float):
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    class Anything:
        def __eq__(self, other):
            return True

    got = roundtrip([Liar(1.0), Anything()])
    assert got == [Other("object", "Liar"), Other("object", "Anything")]
    assert got[0] != 1.0 and got[1] != 1


def test_functions_and_placeholders_are_named_not_sent():
    def per_token(*a):
        return 1

    got = roundtrip([per_token, ..., {"inner": ...}])
    assert got == [Other("function", "per_token"), UNFINISHED, {"inner": UNFINISHED}]
    assert not callable(got[0])


# --- a checkoff's inputs: labsupport's objects as recipes, rebuilt only where the student's code runs ----------

def test_labsupport_objects_travel_only_towards_the_sandbox():
    text = D.dumps([LECTURE_7B, LECTURE_GPU])
    model, gpu = D.build(json.loads(text))
    assert model == LECTURE_7B and gpu == LECTURE_GPU
    # the grader's side never rebuilds an object: one handed back is named by its type, and nothing runs
    assert D.parse(text) == [D.Other("object", "ModelSpec"), D.Other("object", "GPUSpec")]
    assert D.parse('{"$": "new", "make": "os:system", "args": ["rm -rf /"], "kwargs": {}, "calls": []}') == \
        D.Other("object", "system")


def test_a_live_object_is_rebuilt_in_the_state_its_calls_left_it():
    alloc = D.live(BlockAllocator, 8, 4)  # 8 blocks of 4 tokens
    alloc.allocate("a", 6)  # 2 blocks
    alloc.allocate("b", 3)  # 1 block
    alloc.free("a")
    alloc.allocate("c", 9)  # 3 blocks: 8 - 1 - 3 = 4 left
    recipe = json.loads(D.dumps(alloc))
    assert [call[0] for call in recipe["calls"]] == ["allocate", "allocate", "free", "allocate"]
    rebuilt = D.build(recipe)
    assert type(rebuilt) is BlockAllocator and rebuilt.num_free_blocks == 4
    assert rebuilt.table("c") == alloc.real.table("c") and len(rebuilt.table("b")) == 1


@pytest.mark.parametrize("make", ["os:system", "subprocess:run", "labsupport.course.checkoffs.lab00:G"])
def test_a_recipe_makes_only_labsupports_public_objects(make):
    with pytest.raises(DataError, match="may only make labsupport's objects"):
        D.build({"$": "new", "make": make, "args": [], "kwargs": {}, "calls": []})


def test_build_makes_tensors_sets_and_dicts():
    t = D.build({"$": "tensor", "dtype": "int32", "shape": [2, 2], "values": [1, 2, 3, 4]})
    assert t.dtype == torch.int32 and t.tolist() == [[1, 2], [3, 4]]
    nan = D.build({"$": "tensor", "dtype": "float32", "shape": [1], "values": [{"$": "float", "v": "nan"}]})
    assert math.isnan(nan.item())
    assert D.build({"$": "set", "items": [1, [2, 3]]}) == {1, (2, 3)}
    assert D.build({"$": "dict", "items": [[[1, 2], "pair"]]}) == {(1, 2): "pair"}


# --- strictness: what is not plain data in the agreed shape is refused -----------------------------------

@pytest.mark.parametrize("text, words", [
    ("[NaN]", "strict"), ('{"x": Infinity}', "strict"), ("[1,", "not strict JSON"), (b"\xff\xfe", "not strict JSON"),
    ('{"$": "pickle", "v": "gASV"}', "unknown tag 'pickle'"),
    ('{"$": "tensor", "dtype": "int32", "shape": [3], "values": [1]}', "malformed .tensor."),
    ('{"$": "tensor", "dtype": "int32", "shape": [1], "values": ["x"]}', "malformed .tensor."),
    ('{"$": "tensor", "dtype": "int32", "shape": [-1], "values": []}', "malformed .tensor."),
    ('{"$": "float", "v": "1e999"}', "malformed 'float'"), ('{"$": "set"}', "malformed 'set'"),
    ('{"$": "dict", "items": [[1]]}', "malformed 'dict'"),
    ("[" * 5000 + "]" * 5000, "not strict JSON"),
])
def test_off_shape_data_is_refused(text, words):
    with pytest.raises(DataError, match=words):
        D.parse(text)


# --- bounds: depth, items and characters, on both sides ---------------------------------------------------------

def test_depth_is_bounded_both_ways():
    deepest = nested(D.MAX_DEPTH + 1)  # the outer list at depth 0, the innermost at MAX_DEPTH
    assert D.parse(D.dumps(deepest)) == deepest
    with pytest.raises(DataError, match="too deeply nested"):
        D.dumps(nested(D.MAX_DEPTH + 2))
    with pytest.raises(DataError, match="too deeply nested"):
        D.parse("[" * (D.MAX_DEPTH + 2) + "]" * (D.MAX_DEPTH + 2))


def test_an_answer_that_contains_itself_is_refused_not_followed():
    loop: list = []
    loop.append(loop)
    with pytest.raises(DataError, match="too large or too deeply nested"):
        D.dumps(loop)


def test_items_are_bounded_both_ways():
    # the list itself counts as one item: MAX_ITEMS - 1 numbers in a list fit, MAX_ITEMS do not
    assert len(D.plain([0] * (D.MAX_ITEMS - 1))) == D.MAX_ITEMS - 1
    with pytest.raises(DataError, match="too large"):
        D.plain([0] * D.MAX_ITEMS)
    with pytest.raises(DataError, match="too large"):
        D.plain(torch.zeros(D.MAX_ITEMS))
    with pytest.raises(DataError, match="too large"):
        D.parse("[" + ",".join(["0"] * D.MAX_ITEMS) + "]")


def test_text_read_back_is_bounded():
    with pytest.raises(DataError, match="more than the"):
        D.parse('"' + "x" * D.MAX_TEXT + '"')


def test_the_placeholder_is_found_only_in_built_in_containers():
    assert D.contains_unfinished(...) and D.contains_unfinished({"a": [1, (2, {...})]})
    assert not D.contains_unfinished({"a": [1, 2]}) and not D.contains_unfinished("...")

    class Box(list):  # a student's own container is never opened
        pass

    assert not D.contains_unfinished(Box([...]))


@pytest.mark.parametrize("leaf", [None, True, False, 0, -7, 2**62, 2**64, 2**4000 - 1, 2**4000, -(2**5000), 1.5,
                                  -0.0, math.nan, math.inf, -math.inf, "", "text", "$new"])
def test_a_case_inputs_leaves_are_plain_data_as_plain_writes_them(leaf):
    """as_input reads an engine run's leaves on a path of its own (most of a plan's time was spent there): each
    leaf, alone, in a list, as a dict value and in a labsupport dataclass, is the data `plain` makes of it."""
    import dataclasses

    @dataclasses.dataclass
    class Held:  # as a labsupport dataclass would hold it
        value: object
        seen: int = dataclasses.field(default=0, init=False)

    Held.__module__ = "labsupport.stand_in"
    want = D.plain(leaf)
    assert json.dumps(D.as_input(leaf)) == json.dumps(want)
    assert json.dumps(D.as_input([leaf, {"k": leaf}])) == json.dumps([want, {"k": want}])
    made = D.as_input(Held(leaf))
    assert made["make"].endswith(":test_a_case_inputs_leaves_are_plain_data_as_plain_writes_them.<locals>.Held")
    assert json.dumps(made["kwargs"]) == json.dumps({"value": want})  # the constructor's fields only


def test_a_case_input_nested_past_the_bound_is_refused_at_its_leaf():
    nested = 1
    for _ in range(D.MAX_DEPTH + 1):
        nested = [nested, "x"]  # mixed: not the all-numbers list fast path
    with pytest.raises(DataError, match="too deeply nested"):
        D.as_input(nested)
