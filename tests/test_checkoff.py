"""labsupport.course.checkoff: the registry, value/choice/function checkoffs, and labs 00–01's checkoffs.

Expected values are written out by hand here (524,288 B; 295.2; 29), never read from the graders.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from labsupport.course import checkoff as C
from labsupport.course.checkoff import check
from labsupport.course.codec import contains_unfinished
from labsupport.specs import GB, GPUS, LECTURE_7B, LECTURE_GPU


@pytest.fixture(autouse=True)
def _fresh_results():
    C.reset_results()
    yield
    C.reset_results()


def _printed(checkoff_id, answer) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check(checkoff_id, answer) is None  # never raises for an answer, returns nothing to display
    return out.getvalue()


def _fail(checkoff_id, answer) -> str:
    """What check() prints for a wrong answer: one ❌ line with the problem and the hint (then, maybe,
    the student's own frames)."""
    text = _printed(checkoff_id, answer)
    first = text.splitlines()[0]
    assert first.startswith(f"❌ Checkoff {checkoff_id}: ") and f" Hint: {C.get(checkoff_id).hint}" in first, text
    assert C.results()[checkoff_id]["status"] == "failed"
    return text


# --- the one-line pass, and failures that teach --------------------------------------------------

def test_pass_prints_exactly_one_line(capsys):
    check("0.1", 512 * 1024)
    assert capsys.readouterr().out == "✅ Checkoff 0.1 passed\n"
    assert C.results() == {"0.1": {"status": "passed", "detail": ""}}


def test_wrong_value_names_the_problem_not_the_answer():
    text = _fail("0.1", 512_000)
    assert text.count("\n") == 1  # one line: nothing of the student's raised
    assert "512,000" in text and "too low" in text and "decimal kB" in text and "KiB" in text
    assert "524,288" not in text and "524288" not in text  # the answer is never printed
    assert "passed" not in text
    assert C.results()["0.1"]["status"] == "failed"


def test_units_slip_is_named():
    assert "KiB" in str(_fail("0.1", 512 * 1000 * 1.024 * 1.024))  # off by 1.024 from 524,288
    assert "GB" in C.units_slip(2.147e9 / 2**30 * 1e9, 2.147e9)  # GiB figure read as GB
    assert "factor of 2" in C.units_slip(10, 20)
    assert C.units_slip(21, 20) == ""
    assert C.units_slip(-5, 5) == ""


def test_a_units_remark_needs_the_exact_factor_and_a_quantity_it_can_happen_to():
    """Issue 20's two false diagnoses: neither answer is a unit slip, so neither is told it is one."""
    assert C.units_slip(727 / 3, 745, "") == ""  # 2.8 by the lecture's method: exact bytes plus one tail block
    assert C.units_slip(159, 155) == ""  # 7.2 forgetting whole blocks at b = 256: 2.6% off, not 2.4%
    assert "KiB" in C.units_slip(4096 * 512_000, 4096 * 524_288, " B")  # the real slip, in bytes
    assert C.units_slip(4096 * 512_000, 4096 * 524_288, "") == ""  # a count cannot suffer a byte-prefix slip
    assert "factor of 2" in C.units_slip(10, 20, "")


@pytest.mark.parametrize("answer, words", [("524288", "str"), (None, "None"), (True, "True"),
                                           (lambda: 1, "function"), (math.nan, "finite"),
                                           (np.array([1.0, 2.0]), "several")])
def test_value_rejects_non_numbers_with_a_reason(answer, words):
    assert words in str(_fail("0.1", answer))


def test_value_accepts_numpy_and_torch_scalars(capsys):
    check("0.1", np.int64(524_288))
    check("0.1", torch.tensor(524_288.0))
    assert capsys.readouterr().out.count("✅ Checkoff 0.1 passed") == 2


# --- function checkoffs ------------------------------------------------------------------------

def test_function_checkoff_runs_the_student_function(capsys):
    check("0.2", lambda layers, heads, dim, nbytes: 2 * layers * heads * dim * nbytes)
    assert capsys.readouterr().out == "✅ Checkoff 0.2 passed\n"


def test_function_checkoff_reports_the_failing_call():
    text = str(_fail("0.2", lambda layers, heads, dim, nbytes: layers * heads * dim * nbytes))
    assert "kv_bytes_per_token(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2)" in text
    assert "262,144" in text and "too low" in text and "two tensors" in text  # K and V: the factor of 2, named


def test_function_checkoff_reports_student_exceptions():
    def broken(layers, heads, dim, nbytes):
        return layers * heads * dim * nbytes * undefined_name  # noqa: F821

    text = _fail("0.2", broken)
    assert "broken(32, 32, 128, 2) raised NameError" in text.splitlines()[0]
    # Then the student's frame, with its line, and the error; never a frame of labsupport's.
    assert "in broken" in text and "undefined_name" in text.splitlines()[2]
    assert text.splitlines()[-1] == "   NameError: name 'undefined_name' is not defined"
    assert "labsupport" not in "\n".join(text.splitlines()[1:])


def test_student_frames_stop_where_labsupport_begins():
    """A student function that misuses a labsupport mechanism: its own frame is shown, the library's are not."""
    from labsupport.block_allocator import BlockAllocator

    def student_helper(layers):
        return BlockAllocator(-layers, 16)  # a bad pool size: the allocator raises deep inside labsupport

    def student_fn(layers, heads, dim, nbytes):
        return student_helper(layers)

    lines = _fail("0.2", student_fn).splitlines()
    frames = [line for line in lines[1:] if line.startswith("   ") and not line.startswith("       ")]
    assert [f.rsplit(", in ", 1)[1] for f in frames[:-1]] == ["student_fn", "student_helper"]
    assert all("test_checkoff.py" in f for f in frames[:-1])
    assert frames[-1].startswith("   ValueError")
    assert "labsupport/" not in "\n".join(lines[1:]) and "block_allocator" not in "\n".join(lines[1:])


def test_not_attempted_is_one_line_and_the_run_goes_on():
    def unfinished(*_):
        raise NotImplementedError("exercise 0.2 waiting")

    assert _printed("0.2", unfinished) == "⬜ Checkoff 0.2 not attempted — KV bytes per token\n"  # the title
    assert C.results()["0.2"] == {"status": "not attempted", "detail": "exercise 0.2 waiting"}
    word = "TO" + "DO"

    def the_build_s(*_):
        raise NotImplementedError(f"{word} 0.2: return the KV bytes per token")

    assert _printed("0.2", the_build_s) == "⬜ Checkoff 0.2 not attempted — return the KV bytes per token\n"


def test_the_prompt_comes_from_the_cell_that_holds_the_placeholder():
    """As a notebook cell: its source is in linecache (IPython puts it there), the comment above `...`."""
    import linecache

    word = "TO" + "DO"
    source = f"# {word} 0.1: set kib to 512 KiB, in bytes\nkib = ...\ncheck('0.1', kib)\n"
    filename = "<cell 7 of a test notebook>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, filename, "exec"), {"check": check})
    finally:
        linecache.cache.pop(filename, None)
    assert out.getvalue() == "⬜ Checkoff 0.1 not attempted — set kib to 512 KiB, in bytes\n"


@pytest.mark.parametrize("answer", [..., [1, ...], (..., 2), {"a": ...}, {3, ...}, [[...]]])
def test_the_placeholder_alone_or_inside_a_container_is_not_attempted(answer):
    assert _printed("0.1", answer) == "⬜ Checkoff 0.1 not attempted — KV per token in bytes\n"
    assert C.results()["0.1"]["status"] == "not attempted"


def test_a_student_object_is_never_asked_whether_it_is_the_placeholder():
    class Liar:
        def __eq__(self, other):
            raise AssertionError("asked")

        def __iter__(self):
            raise AssertionError("iterated")

    class LiarDict(dict):
        def values(self):
            raise AssertionError("opened")

    assert not any(contains_unfinished(x) for x in (Liar(), [Liar()], LiarDict(a=...)))


def test_passed_and_unlocked_follow_this_kernels_results(capsys):
    assert not C.passed("0.1") and not C.unlocked("0.1", "0.2")
    assert capsys.readouterr().out == ("⬜ This cell runs your answers to 0.1, 0.2: run it again once checkoffs "
                                       "0.1, 0.2 pass.\n")
    check("0.1", 512 * 1024)
    capsys.readouterr()
    assert C.passed("0.1") and C.unlocked("0.1") and capsys.readouterr().out == ""
    assert not C.unlocked("0.1", "0.2")
    assert capsys.readouterr().out == "⬜ This cell runs your answer to 0.2: run it again once checkoff 0.2 passes.\n"
    assert not C.revealed("0.2")
    assert capsys.readouterr().out == "⬜ This cell shows the answer to 0.2: run it again once checkoff 0.2 passes.\n"
    _fail("0.1", 1)
    assert not C.passed("0.1")


def test_function_checkoff_wants_the_function_itself():
    assert "no parentheses" in str(_fail("0.2", 524_288))


# --- lab 01 ------------------------------------------------------------------------------------

def _ridge(model, gpu):  # derived in the test: B * 2N FLOP over N * b bytes = peak / bandwidth
    return gpu.peak_flops / gpu.hbm_bandwidth * model.dtype_bytes / 2


def _memory(model, gpu, s_max):
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4e9
    return max(0, math.floor(budget / (s_max * kv)))


def test_lab01_hand_numbers():
    assert _ridge(LECTURE_7B, LECTURE_GPU) == pytest.approx(989 / 3.35)  # 295.2
    assert _memory(LECTURE_7B, LECTURE_GPU, 4096) == 29  # 62.52e9 // 2,147,483,648


def test_ridge_checkoff(capsys):
    check("1.2", _ridge)
    check("1.2", lambda m, g: math.floor(_ridge(m, g)))  # a whole batch is fine either way
    assert capsys.readouterr().out.count("passed") == 2
    text = str(_fail("1.2", lambda m, g: 295.2))  # typed-in constants fail on the other cards
    assert "ridge_batch(" in text
    text = str(_fail("1.2", lambda m, g: g.peak_flops / g.hbm_bandwidth))  # ignores bytes per weight
    assert "fp32" in text or "fp8" in text


def test_memory_checkoff(capsys):
    check("1.3", _memory)
    assert capsys.readouterr().out == "✅ Checkoff 1.3 passed\n"
    assert "whole slots" in str(_fail("1.3", lambda m, g, s: _memory(m, g, s) + 0.5))
    negative = lambda m, g, s: (g.hbm_bytes - m.weight_bytes - 4e9) // (s * m.kv_bytes_per_token)  # noqa: E731
    assert "negative" in str(_fail("1.3", negative))
    gib = lambda m, g, s: max(0, int((g.hbm_bytes - m.weight_bytes - 4 * 2**30) // (s * m.kv_bytes_per_token)))  # noqa: E731
    _fail("1.3", gib)


# §10.1, by hand: admit and allocate are memory, run is arithmetic, batch hands out places in the next
# forward pass, stream is the latency the user sees.
LECTURE_RESOURCES = {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic",
                     "stream": "latency"}


def test_resource_map_checkoff(capsys):
    check("1.1", LECTURE_RESOURCES)
    check("1.1", {" Admit": "MEMORY", "allocate": "memory ", "batch": "Places", "run": "arithmetic",
                  "stream": "latency"})  # case and spaces do not matter
    assert capsys.readouterr().out.count("passed") == 2
    text = _fail("1.1", dict(LECTURE_RESOURCES, batch="memory"))  # the classic slip: batching "is" memory
    assert "1 of the five is not right (batch)" in text and "place in the next forward pass" in text
    assert "memory" not in text.split("Hint:")[0].split("(batch)")[0]  # the problem names no right answer
    assert "missing: stream" in _fail("1.1", {k: v for k, v in LECTURE_RESOURCES.items() if k != "stream"})
    assert "not one of the five jobs" in _fail("1.1", dict(LECTURE_RESOURCES, schedule="memory"))
    assert "is not one of: memory" in _fail("1.1", dict(LECTURE_RESOURCES, run="compute"))
    assert "a dict from each" in _fail("1.1", {"admit", "allocate"})
    assert "2 of the five are not right (run, stream)" in _fail(
        "1.1", dict(LECTURE_RESOURCES, run="latency", stream="arithmetic"))


def test_choice_checkoffs(capsys):
    C.choice("98.4", "two of three", answer={"admit", "allocate"}, options=("admit", "allocate", "run"), hint="h",
             mistakes={"run": "Running the kernels contends for compute."})
    try:
        check("98.4", {"Admit", " allocate"})
        check("98.4", ["allocate", "admit"])
        check("1.4", "ADMIT ")
        assert capsys.readouterr().out.count("passed") == 3
        text = str(_fail("98.4", {"admit", "run"}))
        assert "1 of your choices does not belong" in text and "1 is missing" in text and "compute" in text
        assert "set of options" in str(_fail("98.4", "admit"))
    finally:
        C.REGISTRY.pop("98.4", None)
    assert "re-chosen" in str(_fail("1.4", "batch"))
    assert "not one of" in str(_fail("1.4", "schedule"))


# --- the registry -------------------------------------------------------------------------------

def test_labs_register_their_checkoffs_in_order():
    assert [c.id for c in C.load_lab(0)] == ["0.1", "0.2"]
    assert [c.id for c in C.load_lab(1)] == ["1.1", "1.2", "1.3", "1.4"]
    assert C.load_lab(97) == []
    for lab in (0, 1):
        for c in C.load_lab(lab):
            assert c.module == f"labsupport.course.checkoffs.lab{lab:02d}"
            assert len(c.hint) > 60 and c.title


def test_unknown_and_malformed_ids():
    with pytest.raises(KeyError, match="lab 1 registers: 1.1, 1.2, 1.3, 1.4"):
        check("1.9", 1)
    with pytest.raises(ValueError, match="lab.number"):
        check("one", 1)


def test_a_later_lab_registers_a_checkoff():
    try:
        C.value("98.1", "a test checkoff", expected=lambda: 2 * GB, rel_tol=0.01, hint="two decimal gigabytes")
        check("98.1", 2.01e9)
        assert "within 1.00%" in _fail("98.1", 2.1e9)

        @C.function("98.2", "a test function", hint="return the square")
        def _grader(fn):
            for x in (2, 3):
                C.expect_close(C.call(fn, x), x * x, f"square({x})")

        check("98.2", lambda x: x * x)
        assert "square(2) returned 5" in _fail("98.2", lambda x: x * x + 1)
        with pytest.raises(ValueError, match="registered twice"):
            C.register(replace(C.REGISTRY["98.1"], module="somewhere.else"))
    finally:
        C.REGISTRY.pop("98.1", None)
        C.REGISTRY.pop("98.2", None)


def test_choice_rejects_an_answer_outside_its_options():
    with pytest.raises(ValueError, match="not among the options"):
        C.choice("98.3", "bad", answer="maybe", options=("yes", "no"), hint="h")
    assert "98.3" not in C.REGISTRY


def test_registration_requires_a_hint():
    with pytest.raises(ValueError, match="hint"):
        C.value("98.4", "no hint", expected=1, hint="  ")
    assert "98.4" not in C.REGISTRY


def test_memory_checkoff_covers_a_card_the_weights_overflow():
    # Llama 3 70B's 141.2 GB of bf16 weights do not fit an 80 GB H100: the answer there is 0.
    assert _memory(replace(LECTURE_7B, num_params=70.6e9), GPUS["h100"], 4096) == 0


# --- prepared cases, hidden inputs, placeholders (what grade relies on) ---------------------------

def _stable(cases) -> list[str]:
    """Cases as text, with objects plain data has no word for reduced to their type (addresses vary)."""
    from labsupport.course import codec

    def strip(x):
        if isinstance(x, dict) and set(x) == {"__opaque__"}:
            return {"__opaque__": x["__opaque__"]["type"]}
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return [json.dumps(strip(codec.to_plain(case, objects=True)), sort_keys=True) for case in cases]


FUNCTION_CHECKOFFS = [c for lab in range(9) for c in C.load_lab(lab) if c.kind == "function" and "open" not in c.formative]


@pytest.mark.parametrize("checkoff", FUNCTION_CHECKOFFS, ids=lambda c: c.id)
def test_function_checkoffs_draw_hidden_cases_from_the_secret(checkoff):
    public = _stable(checkoff.prepare(C.case_rng(checkoff.id)))
    assert public == _stable(checkoff.prepare(C.case_rng(checkoff.id)))  # the notebook's feedback is repeatable
    one = _stable(checkoff.prepare(C.case_rng(checkoff.id, b"secret one", "alice/02.ipynb")))
    two = _stable(checkoff.prepare(C.case_rng(checkoff.id, b"secret two", "alice/02.ipynb")))
    other = _stable(checkoff.prepare(C.case_rng(checkoff.id, b"secret one", "bob/02.ipynb")))
    assert one != two and one != other, "no case depends on the grading secret"
    assert one == _stable(checkoff.prepare(C.case_rng(checkoff.id, b"secret one", "alice/02.ipynb")))


def test_placeholders_are_not_attempted(capsys):
    class Unfinished:
        pass

    for placeholder in (..., Unfinished()):
        check("0.1", placeholder)
        assert C.results()["0.1"]["status"] == "not attempted"
        assert capsys.readouterr().out.startswith("⬜ Checkoff 0.1 not attempted — ")


def test_forbidden_names_must_be_dotted_and_always_include_the_course_tooling():
    with pytest.raises(ValueError, match="dotted"):
        C.function("98.5", "bad forbid", hint="h", forbid=("ridge_batch",))
    assert "98.5" not in C.REGISTRY
    ridge = C.get("1.2")
    assert "labsupport.ledger.ridge_batch" in ridge.forbidden
    assert {"labsupport.course", "labsupport.ledger.exercise1"} <= set(ridge.forbidden)


# --- the two utilization conventions (§10.2, §10.3) and the brochure, by hand ----------------------------
# 62.52e9 B of KV hold 29 slots of 4,096 x 524,288 B; over a life a sequence holds 512 ... 639 tokens
# while its 128 steps run, (512 + 639) / 2 = 575.5 on average; at the end of life it holds 640.
_HAND_BUDGET, _HAND_KV = 62_520_000_000, 524_288


def test_naive_utilization_over_the_life_checkoff():
    over_life = 29 * 575.5 * _HAND_KV / _HAND_BUDGET  # 0.139957, the timing plan's 14%
    assert f"{over_life:.2%}" == "14.00%"
    check("2.4", over_life)
    check("2.4", 29 * 576.5 * _HAND_KV / _HAND_BUDGET)  # reading after each step's token: the same convention
    assert "end of life" in _fail("2.4", 29 * 640 * _HAND_KV / _HAND_BUDGET)  # 15.56%, 2.3's reading
    assert "one slot's mean occupancy" in _fail("2.4", 575.5 / 4096)  # 14.05%: the slot, not the budget


def test_paged_utilization_over_the_life_checkoff():
    # ceil(n / 16) * 16 slots for n = 512 ... 639: 16 lengths in each of 8 block counts 33 ... 40 (n = 512 is 32)
    slots = 32 * 16 + sum(16 * 16 * k for k in range(33, 40)) + 15 * 16 * 40
    tokens = 128 * 575.5
    pool = 7452 * 16 * _HAND_KV / _HAND_BUDGET  # 62.52e9 // 8 MiB whole blocks
    assert f"{tokens / slots * pool:.2%}" == "98.70%"
    check("3.6", tokens / slots * pool)
    check("3.6", tokens / slots)  # the blocks' own fill, 98.71%: the pool's 99.99% share left out is fine
    assert "end of life" in _fail("3.6", 186 * 640 * _HAND_KV / _HAND_BUDGET)  # 99.83%


def test_brochure_cost_is_exact():
    # GQA-8: 131,072 B per token; 62.52e9 // (16 x 131,072) = 29,811 blocks // 40 = 745 sequences paged,
    # against 62.52e9 // (131,072 x 131,072) = 3 reserve-to-max slots: 745 / 3 = 248.33
    check("2.8", 745 / 3)
    assert "744 is the sketch's approximate count" in _fail("2.8", 248.0)
