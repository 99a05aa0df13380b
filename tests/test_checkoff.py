"""check() in the notebook (labsupport.course.checkoff), the registry the graders declare checkoffs with
(labsupport.course.registry), and labs 00–01's checkoffs.

check() reads the lab's public record; the registry's Checkoff judges in this process what `grade`
judges outside the sandbox.  Expected values are written out by hand here (524,288 B; 295.2; 29),
never read from the graders.
"""
from __future__ import annotations

import contextlib
import io
import json
import linecache
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from labsupport.course import checkoff as C
from labsupport.course import judge, record
from labsupport.course import registry as R
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get as grader
from labsupport.course.checkoffs import load_lab as graders_of
from labsupport.course.data import contains_unfinished
from labsupport.course.judge import Mismatch
from labsupport.specs import GB, GPUS, LECTURE_7B, LECTURE_GPU

pytestmark = pytest.mark.usefixtures("fresh_results")


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
    assert first.startswith(f"❌ Checkoff {checkoff_id}: ") and f" Hint: {C.get(checkoff_id)['hint']}" in first, text
    assert C.results()[checkoff_id]["status"] == "failed"
    return text


def _kv_kib() -> int:
    """0.1's given, KV_KIB, as the lab's record publishes it (check() reads that record): the lecture's 512 on its
    card.  0.1 asks for it in bytes: KV_KIB x 1,024."""
    return record.read(0)["givens"]["KV_KIB"]


def _as_a_cell(source: str, number: int = 7) -> str:
    """Run `source` as a notebook cell would run: its text in linecache (IPython puts it there); what it printed."""
    filename = f"<cell {number} of a test notebook>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, filename, "exec"), {"check": check})
    finally:
        linecache.cache.pop(filename, None)
    return out.getvalue()


# --- the one-line pass, and failures that teach --------------------------------------------------

def test_pass_prints_exactly_one_line(capsys):
    check("0.1", _kv_kib() * 1024)
    assert capsys.readouterr().out == "✅ Checkoff 0.1 passed\n"
    assert C.results() == {"0.1": {"status": "passed", "detail": ""}}


def test_wrong_value_names_the_problem_not_the_answer():
    kib = _kv_kib()
    text = _fail("0.1", kib * 1000)  # 512,000 on the lecture's givens
    assert text.count("\n") == 1  # one line: nothing of the student's raised
    assert f"{kib * 1000:,}" in text and "too low" in text and "decimal kB" in text and "KiB" in text
    assert f"{kib * 1024:,}" not in text and str(kib * 1024) not in text  # the answer (524,288) is never printed
    assert "passed" not in text
    assert C.results()["0.1"]["status"] == "failed"


def test_units_slip_is_named():
    assert "KiB" in str(_fail("0.1", _kv_kib() * 1000 * 1.024 * 1.024))  # off by 1.024 from 524,288 (lecture)
    assert "GB" in judge.units_slip(2.147e9 / 2**30 * 1e9, 2.147e9)  # GiB figure read as GB
    assert "factor of 2" in judge.units_slip(10, 20)
    assert judge.units_slip(21, 20) == ""
    assert judge.units_slip(-5, 5) == ""


def test_a_units_remark_needs_the_exact_factor_and_a_quantity_it_can_happen_to():
    """Issue 20's two false diagnoses: neither answer is a unit slip, so neither is told it is one."""
    assert judge.units_slip(727 / 3, 745, "") == ""  # 2.8 by the lecture's method: exact bytes plus one tail block
    assert judge.units_slip(159, 155) == ""  # 7.2 forgetting whole blocks at b = 256: 2.6% off, not 2.4%
    assert "KiB" in judge.units_slip(4096 * 512_000, 4096 * 524_288, " B")  # the real slip, in bytes
    assert judge.units_slip(4096 * 512_000, 4096 * 524_288, "") == ""  # a count cannot suffer a byte-prefix slip
    assert "factor of 2" in judge.units_slip(10, 20, "")


@pytest.mark.parametrize("answer, words", [("524288", "'524288', not a number"), (None, "None"), (True, "True"),
                                           (lambda: 1, "function"), (math.nan, "finite"),
                                           (np.array([1.0, 2.0]), "tensor of shape [2], not a number")])
def test_value_rejects_non_numbers_with_a_reason(answer, words):
    assert words in str(_fail("0.1", answer))


def test_value_accepts_numpy_and_torch_scalars(capsys):
    check("0.1", np.int64(_kv_kib() * 1024))
    check("0.1", torch.tensor(_kv_kib() * 1024.0))
    assert capsys.readouterr().out.count("✅ Checkoff 0.1 passed") == 2


def test_an_answer_that_is_not_plain_data_fails_and_never_raises():
    """One of labsupport's objects is named by its type; what cannot cross as plain data at all (a list that
    contains itself) fails its checkoff with one line, as grade fails it; check() never raises for an answer."""
    assert "your answer is a ModelSpec, not a number" in _fail("0.1", LECTURE_7B)  # named by its type
    loop: list = []
    loop.append(loop)
    assert "could not be read as plain data" in _fail("0.1", loop)


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
    assert ("kv_bytes_per_token(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2) raised NameError"
            in text.splitlines()[0])
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

    # no prompt in the message or the calling cell: the exercise's prompt from the lab's record
    prompt = "return the KV bytes per token from the four arguments"
    assert _printed("0.2", unfinished) == f"⬜ Checkoff 0.2 not attempted — {prompt}\n"
    assert C.results()["0.2"] == {"status": "not attempted", "detail": prompt}
    word = "TO" + "DO"

    def the_build_s(*_):
        raise NotImplementedError(f"{word} 0.2: return the KV bytes per token")

    assert _printed("0.2", the_build_s) == "⬜ Checkoff 0.2 not attempted — return the KV bytes per token\n"


def test_the_prompt_comes_from_the_cell_that_holds_the_placeholder():
    word = "TO" + "DO"
    out = _as_a_cell(f"# {word} 0.1: set kib to 512 KiB, in bytes\nkib = ...\ncheck('0.1', kib)\n")
    assert out == "⬜ Checkoff 0.1 not attempted — set kib to 512 KiB, in bytes\n"


@pytest.mark.parametrize("answer", [..., [1, ...], (..., 2), {"a": ...}, {3, ...}, [[...]]])
def test_the_placeholder_alone_or_inside_a_container_is_not_attempted(answer):
    # the lab's record holds the student copy's prompt for 0.1
    assert _printed("0.1", answer) == ("⬜ Checkoff 0.1 not attempted — set kv_bytes to KV_KIB KiB in bytes, as a "
                                       "Python expression of KV_KIB\n")
    assert C.results()["0.1"]["status"] == "not attempted"


def test_an_object_of_the_students_is_judged_as_what_it_is_not_as_the_placeholder():
    class Unfinished:
        pass

    assert "a Unfinished, not a number" in _fail("0.1", Unfinished())


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
    check("0.1", _kv_kib() * 1024)
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


# --- derive, don't call: the scan of the exercise's own cells ---------------------------------------

def test_a_direct_call_the_exercise_forbids_fails_with_what_to_derive():
    """1.2 forbids the ledger's ridge_batch: calling it, through an alias made in the same cell, fails with the
    derivation the checkoff asks for, although the number it returns is right."""
    out = _as_a_cell("from labsupport.ledger import ridge_batch as rb\n\n"
                     "def ridge(model, gpu):\n    return rb(model, gpu)\n\ncheck('1.2', ridge)\n")
    assert out.startswith("❌ Checkoff 1.2: your code for 1.2 calls labsupport.ledger.ridge_batch, which answers "
                          "this exercise in one call. Derive it instead: set the step's FLOP per byte"), out
    out = _as_a_cell("import labsupport.ledger\n\ncheck('1.2', lambda m, g: labsupport.ledger.ridge_batch(m, g))\n")
    assert out.startswith("❌ Checkoff 1.2: your code for 1.2 calls labsupport.ledger.ridge_batch"), out


def test_the_scan_reads_only_the_exercise_cells():
    """The library function used elsewhere in the lab (a figure's cell) does not fail the exercise."""
    _as_a_cell("from labsupport.specs import LECTURE_7B, LECTURE_GPU\nfrom labsupport import ledger\n"
               "shown = ledger.ridge_batch(LECTURE_7B, LECTURE_GPU)\n", number=6)
    out = _as_a_cell("def ridge(model, gpu):\n    return gpu.peak_flops / gpu.hbm_bandwidth * model.dtype_bytes / 2\n\n"
                     "check('1.2', ridge)\n")
    assert out == "✅ Checkoff 1.2 passed\n"


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
    assert "ridge_batch(" in text and "too high" in text
    text = str(_fail("1.2", lambda m, g: g.peak_flops / g.hbm_bandwidth))  # ignores bytes per weight
    assert "fp32" in text and "factor of 2" in text  # right at 2 bytes a weight: the fp32 case shows it


def test_memory_checkoff(capsys):
    check("1.3", _memory)
    assert capsys.readouterr().out == "✅ Checkoff 1.3 passed\n"
    assert "whole things" in str(_fail("1.3", lambda m, g, s: _memory(m, g, s) + 0.5))
    negative = lambda m, g, s: (g.hbm_bytes - m.weight_bytes - 4e9) // (s * m.kv_bytes_per_token)  # noqa: E731
    assert "cannot be below 0" in str(_fail("1.3", negative))
    gib = lambda m, g, s: max(0, int((g.hbm_bytes - m.weight_bytes - 4 * 2**30) // (s * m.kv_bytes_per_token)))  # noqa: E731
    assert "28, which is too low" in _fail("1.3", gib)  # the lecture's case: a 4 GiB reserve leaves 28 slots


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
    assert "1 of the 5 is not right (batch)" in text and "place in the next forward pass" in text
    assert "memory" not in text.split("Hint:")[0].split("(batch)")[0]  # the problem names no right answer
    assert "is missing: stream" in _fail("1.1", {k: v for k, v in LECTURE_RESOURCES.items() if k != "stream"})
    assert "'schedule' is not one of the jobs" in _fail("1.1", dict(LECTURE_RESOURCES, schedule="memory"))
    assert "'compute' is not one of: memory" in _fail("1.1", dict(LECTURE_RESOURCES, run="compute"))
    assert "a dict from each job" in _fail("1.1", {"admit", "allocate"})
    assert "2 of the 5 are not right (run, stream)" in _fail(
        "1.1", dict(LECTURE_RESOURCES, run="latency", stream="arithmetic"))


def test_choice_checkoffs(capsys):
    check("1.4", {"ADMIT ", "allocate"})  # measured on the engine: GQA-8 moves only the two memory jobs
    check("2.11", {"A Partly Empty Last Block ", "no room for the next token"})
    check("2.11", ["no room for the next token", "a partly empty last block"])
    assert capsys.readouterr().out.count("passed") == 3
    assert "arithmetic" in str(_fail("1.4", {"admit", "allocate", "stream"}))
    assert "not one of" in str(_fail("1.4", {"schedule"}))
    assert "set of options" in str(_fail("2.11", "a partly empty last block"))
    text = str(_fail("2.11", {"a partly empty last block", "refused with enough free in total"}))
    assert "1 of your choices does not belong" in text and "wrong size" in text


def test_a_choice_of_several_options_in_the_registry():
    try:
        R.choice("98.4", "two of three", answer={"admit", "allocate"}, options=("admit", "allocate", "run"), hint="h",
                 mistakes={"run": "Running the kernels contends for compute."})
        four = grader("98.4")
        four.grade({"Admit", " allocate"})
        four.grade(["allocate", "admit"])
        with pytest.raises(Mismatch, match="1 of your choices does not belong and 1 is missing.*compute"):
            four.grade({"admit", "run"})
        with pytest.raises(Mismatch, match="set of options"):
            four.grade("admit")
    finally:
        R.REGISTRY.pop("98.4", None)


# --- the registry (the graders' side) and the record (check()'s side) -----------------------------------

def test_labs_register_their_checkoffs_in_order():
    assert [c.id for c in graders_of(0)] == ["0.1", "0.2"]
    assert [c.id for c in graders_of(1)] == ["1.1", "1.2", "1.3", "1.4", "1.5"]
    assert graders_of(89) == [] and C.load_lab(89) == []  # a lab with neither graders nor a record
    for lab in (0, 1):
        assert [e["id"] for e in C.load_lab(lab)] == [c.id for c in graders_of(lab)]  # the record lists the same
        for c in graders_of(lab):
            assert c.module == f"labsupport.course.checkoffs.lab{lab:02d}"
            assert len(c.hint) > 60 and c.title
            assert C.get(c.id)["hint"] == c.hint and C.get(c.id)["kind"] == c.kind


def test_the_record_holds_the_lecture_expectation_sealed():
    """The record check() reads: 0.1's given is the course card's KV per token in KiB and its expected value that in
    bytes, and no search of the file finds it.  On the lecture's card: 2 x 32 x 32 x 128 x 2 B = 512 KiB, 524,288 B
    (the record is built for the card: a record of another card's build fails here)."""
    from labsupport import card

    m = card.card().model
    kib = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes // 1024
    assert record.read(0)["givens"] == {"KV_KIB": kib}
    assert C.get("0.1")["spec"]["want"] == kib * 1024
    text = record.path(0).read_text(encoding="utf-8")
    assert str(kib * 1024) not in text and f"{kib * 1024:,}" not in text
    assert record.unseal(record.seal({"want": 524_288}, 0), 0) == {"want": 524_288}
    assert record.seal({"want": 524_288}, 0) != record.seal({"want": 524_288}, 1)  # masked per lab


def test_unknown_and_malformed_ids():
    with pytest.raises(KeyError, match="lab 1 has: 1.1, 1.2, 1.3, 1.4, 1.5"):
        check("1.9", 1)
    with pytest.raises(ValueError, match="lab.number"):
        check("one", 1)
    with pytest.raises(KeyError, match="lab 1 registers: 1.1, 1.2, 1.3, 1.4, 1.5"):
        grader("1.9")
    with pytest.raises(ValueError, match="lab.number"):
        grader("1")


def test_a_later_lab_registers_a_checkoff():
    try:
        R.value("98.1", "a test checkoff", expected=lambda: 2 * GB, rel_tol=0.01, hint="two decimal gigabytes")
        grader("98.1").grade(2.01e9)
        with pytest.raises(Mismatch, match="within 1% of"):
            grader("98.1").grade(2.1e9)

        @R.function("98.2", "a test function", hint="return the square", name="square")
        def _cases(rng):
            for x in (2, 3, rng.randint(4, 99)):
                yield R.case(x, want=x * x)

        grader("98.2").grade(lambda x: x * x)
        with pytest.raises(Mismatch, match=r"square\(2\) returned 5, which is too high"):
            grader("98.2").grade(lambda x: x * x + 1)
        with pytest.raises(ValueError, match="registered twice"):
            R.register(replace(R.REGISTRY["98.1"], module="somewhere.else"))
        with pytest.raises(KeyError, match="lab 98 has: none"):  # check() knows only what the build recorded
            check("98.1", 2e9)
    finally:
        R.REGISTRY.pop("98.1", None)
        R.REGISTRY.pop("98.2", None)


def test_a_value_in_a_lab_with_givens_follows_them_or_says_why_not():
    try:
        R.givens(lab=96, lecture=dict(A=2), hidden=lambda rng: dict(A=rng.randint(3, 9)))
        with pytest.raises(ValueError, match="fixed="):
            R.value("96.1", "constant", expected=lambda: 4, hint="a number")
        assert "96.1" not in R.REGISTRY
        twice = R.value("96.1", "twice A", expected=lambda g: 2 * g.A, hint="double it")
        assert twice.expect() == 4 and twice.expect(R.namespace(dict(A=5))) == 10  # 2 x 2, 2 x 5
        assert twice.value_spec(R.namespace(dict(A=5)))["want"] == 10
        twice.grade(4)
        with pytest.raises(Mismatch, match="too high"):
            twice.grade(5)
        sets = R.GIVENS[96].draw(R.case_rng("96.1", b"secret"), 2)
        assert len(sets) == 2 and all(3 <= g["A"] <= 9 for g in sets) and sets[0] != sets[1]
        R.value("96.2", "a reading", expected=lambda: 3, fixed="a reading of a table", hint="read it")
    finally:
        for cid in ("96.1", "96.2"):
            R.REGISTRY.pop(cid, None)
        R.GIVENS.pop(96, None)


def test_choice_rejects_an_answer_outside_its_options():
    with pytest.raises(ValueError, match="not among the options"):
        R.choice("98.3", "bad", answer="maybe", options=("yes", "no"), hint="h")
    assert "98.3" not in R.REGISTRY


def test_registration_requires_a_hint_and_no_placeholder_left():
    with pytest.raises(ValueError, match="hint"):
        R.value("98.4", "no hint", expected=1, hint="  ")
    with pytest.raises(ValueError, match="scaffold's `...`"):
        R.value("98.4", "a scaffold", expected=..., hint="a real hint")
    assert "98.4" not in R.REGISTRY


def test_memory_checkoff_covers_a_card_the_weights_overflow():
    # Llama 3 70B's 141.2 GB of bf16 weights do not fit an 80 GB H100: the answer there is 0.
    assert _memory(replace(LECTURE_7B, num_params=70.6e9), GPUS["h100"], 4096) == 0


# --- the lab's own cases, and hidden ones (what grade relies on) ------------------------------------

def _stable(cases, name: str) -> str:
    """Cases as the record writes them: inputs (objects as their recipes) and specs, plain data."""
    return json.dumps([{"input": k.input(), "spec": k.public_spec(name)} for k in cases], sort_keys=True)


# 8.7's one case is the student's own workload, judged by running the engine on it: nothing is drawn for it.
FUNCTION_CHECKOFFS = [e["id"] for lab in range(9) for e in C.load_lab(lab) if e["kind"] == "function" and e["id"] != "8.7"]


@pytest.mark.parametrize("checkoff_id", FUNCTION_CHECKOFFS)
def test_function_checkoffs_draw_hidden_cases_from_the_secret(checkoff_id):
    c = grader(checkoff_id)
    public = _stable(c.cases(R.case_rng(c.id)), c.name)
    assert public == _stable(c.cases(R.case_rng(c.id)), c.name)  # the notebook's feedback is repeatable
    # and it is what check() reads: the record holds the public seed's cases
    assert json.loads(public) == json.loads(json.dumps(C.get(c.id)["cases"], sort_keys=True))
    one = _stable(c.cases(R.case_rng(c.id, b"secret one", "alice/02.ipynb")), c.name)
    two = _stable(c.cases(R.case_rng(c.id, b"secret two", "alice/02.ipynb")), c.name)
    other = _stable(c.cases(R.case_rng(c.id, b"secret one", "bob/02.ipynb")), c.name)
    assert one != two and one != other, "no case depends on the grading secret"
    assert one == _stable(c.cases(R.case_rng(c.id, b"secret one", "alice/02.ipynb")), c.name)


def test_forbidden_names_must_be_dotted():
    with pytest.raises(ValueError, match="dotted"):
        R.function("98.5", "bad forbid", hint="h", forbid=("ridge_batch",))
    assert "98.5" not in R.REGISTRY
    assert "labsupport.ledger.ridge_batch" in grader("1.2").forbid
    assert "labsupport.ledger.ridge_batch" in C.get("1.2")["forbid"]  # the record carries what check() scans for


# --- the two utilization conventions (§10.2, §10.3) and the brochure, by hand ----------------------------
# 62.52e9 B of KV hold 29 slots of 4,096 x 524,288 B; over a life a sequence holds 512 ... 639 tokens
# while its 128 steps run, (512 + 639) / 2 = 575.5 on average; at the end of life it holds 640.
# Each test pins the lecture's worked example on the lecture's specs, then checks the card's own numbers through
# check(): labs 02 and 03 pose on the course card's model in its MHA form (card.mha) and its GPU, and their record
# is built for that card (a record of another card's build fails the check() half).
_HAND_BUDGET, _HAND_KV = 62_520_000_000, 524_288
_LIFE = range(512, 512 + 128)  # the tokens held while the 128 decode steps run: 575.5 on average


def _kv_and_budget(model, gpu) -> tuple[int, float]:
    """KV bytes per token, 2 x L x n_kv x d x b, and the KV budget, HBM - weights - the 4 GB reserve."""
    return (2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes,
            gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4e9)


def _card():
    from labsupport import card

    return card.card()


def test_naive_utilization_over_the_life_checkoff():
    assert _kv_and_budget(LECTURE_7B, LECTURE_GPU) == (_HAND_KV, _HAND_BUDGET)
    assert _HAND_BUDGET // (4096 * _HAND_KV) == 29 and sum(_LIFE) / len(_LIFE) == 575.5
    assert f"{29 * 575.5 * _HAND_KV / _HAND_BUDGET:.2%}" == "14.00%"  # 0.139957, the timing plan's 14%
    kv, budget = _kv_and_budget(_card().mha, _card().gpu)
    slots = budget // (4096 * kv)  # 29 on the lecture's card
    over_life = slots * 575.5 * kv / budget
    check("2.4", over_life)
    check("2.4", slots * 576.5 * kv / budget)  # reading after each step's token: the same convention
    assert "end of life" in _fail("2.4", slots * 640 * kv / budget)  # 15.56% on the lecture's: 2.3's reading
    assert "one slot's mean occupancy" in _fail("2.4", 575.5 / 4096)  # 14.05%: the slot, not the budget


def test_paged_utilization_over_the_life_checkoff():
    # ceil(n / 16) * 16 slots for n = 512 ... 639: 16 lengths in each of 8 block counts 33 ... 40 (n = 512 is 32)
    slots = 32 * 16 + sum(16 * 16 * k for k in range(33, 40)) + 15 * 16 * 40
    assert slots == sum(-(-n // 16) * 16 for n in _LIFE)
    tokens = 128 * 575.5
    assert tokens == sum(_LIFE)
    assert _HAND_BUDGET // (16 * _HAND_KV) == 7452  # 62.52e9 // 8 MiB whole blocks
    assert f"{tokens / slots * (7452 * 16 * _HAND_KV / _HAND_BUDGET):.2%}" == "98.70%"
    kv, budget = _kv_and_budget(_card().mha, _card().gpu)
    blocks = budget // (16 * kv)  # 7,452 on the lecture's card
    pool = blocks * 16 * kv / budget  # the share of the budget the pool's whole blocks cover
    check("3.6", tokens / slots * pool)
    assert "pool's whole blocks" in _fail("3.6", tokens / slots)  # the blocks' own fill, 98.71%: the pool's share left out
    assert "end of life" in _fail("3.6", blocks // 40 * 640 * kv / budget)  # 186 sequences: 99.83% on the lecture's


def test_brochure_cost_is_exact():
    # GQA-8: 131,072 B per token; 62.52e9 // (16 x 131,072) = 29,811 blocks // 40 = 745 sequences paged,
    # against 62.52e9 // (131,072 x 131,072) = 3 reserve-to-max slots: 745 / 3 = 248.33
    kv, budget = _kv_and_budget(LECTURE_7B.with_kv_heads(8), LECTURE_GPU)
    assert (kv, budget // (16 * kv) // 40, budget // (131_072 * kv)) == (131_072, 745, 3)
    c = _card()
    kv, budget = _kv_and_budget(c.gqa, c.gpu)  # the card's model with fewer KV heads (its weights are the same)
    assert budget == _kv_and_budget(c.mha, c.gpu)[1]
    paged, naive = budget // (16 * kv) // 40, budget // (131_072 * kv)
    check("2.8", paged / naive)
    assert "without flooring" in _fail("2.8", budget / (640 * kv) / naive)  # fractional sequences paged
    if c.is_lecture:  # the sketch's 744 is a slip of the lecture's H100 alone (lab02.py: LECTURE_CARD)
        assert "744 is the sketch's approximate count" in _fail("2.8", 248.0)
