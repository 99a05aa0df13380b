"""labsupport.course.build: one source -> an executed solution notebook and a student notebook, and --check.

Most tests build a small lab in a temporary root without a kernel; one executes it for real.  The
last ones check the repository itself: the committed notebooks are what the sources generate, and
labsupport's source never spells the to-do word.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import nbformat
import pytest

from labsupport.course import build as B
from labsupport.course import record
from labsupport.course import registry as R
from labsupport.course.expect import expect_passes

ROOT = Path(__file__).resolve().parents[1]
WORD = "TO" + "DO"

DEMO = '''# %% [markdown]
# # Demo lab
# Prose.

# %%
import os
from labsupport.course.checkoff import check
print("cwd is", os.path.basename(os.getcwd()))

# %% tags=["solution-only"]
secret = "instructors only"

# %%
### BEGIN SOLUTION 0.1: set kib to 512 KiB in bytes
kib = 512 * 1024
### END SOLUTION
check("0.1", kib)

# %%
def per_token(layers, heads, dim, nbytes):
    """Docstring stays."""
    ### BEGIN SOLUTION 0.2: return the KV bytes per token
    k = layers * heads * dim * nbytes
    return 2 * k
    ### END SOLUTION

# %% tags=["keep-me"]
check("0.2", per_token)

# %%
from labsupport.viz import roofline
roofline.kv_heads_panel()

# %% tags=["givens"]
KV_KIB = 512
'''
# (lab 00 declares givens, so its demo has the one givens cell the build requires; it comes last so that
# the cell numbers the tests below read are those of the lab's own cells)


def card_kv_kib() -> int:
    """Lab 00's KV_KIB as its graders declare it (the repository's 00_setup givens cell, on the course card): the card's
    model's KV per token in KiB, 2 x L x n_kv x d x b / 1,024, by hand: 512 on the lecture's card, 56 on Qwen2.5-7B."""
    from labsupport import card

    m = card.card().model
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes // 1024


def demo_on_the_card() -> str:
    """The demo with 0.1 answered as its executed check() grades it: on the KV_KIB of lab 00's record in the package
    (the course card's, once built for it; 512 x 1,024 on the lecture's), whatever the demo's own givens cell (512) and
    prompt say."""
    return DEMO.replace("kib = 512 * 1024", f"kib = {record.read(0)['givens']['KV_KIB']} * 1024")


def make_lab(tmp_path: Path, text: str = DEMO, name: str = "00_demo") -> B.Lab:
    (tmp_path / "solutions").mkdir(exist_ok=True)
    (tmp_path / "solutions" / f"{name}.py").write_text(text)
    (lab,) = B.discover(tmp_path, [name])
    return lab


def code_cells(nb):
    """The lab's own code cells (the build's Colab cell, first of them, left out)."""
    return [c for c in nb.cells if c.cell_type == "code" and "front-end" not in c.metadata.get("tags", [])]


# --- the student copy ------------------------------------------------------------------------------

def test_student_copy_cuts_solutions_and_stores_no_pass_line(tmp_path):
    parsed = B.parse(make_lab(tmp_path))
    sol, stu = parsed.solution, parsed.student
    # the solution-only cell is gone; the build adds the Colab cell and the two scoreboard cells to both
    assert len(sol.cells) == 11 and len(stu.cells) == 10
    assert [c.metadata.get("tags") for c in stu.cells[:2]] == [None, ["front-end"]]
    assert all("instructors only" not in c.source for c in stu.cells)
    value_cell, function_cell, check_cell = code_cells(stu)[1:4]
    # A top-level region becomes a placeholder for the name it defines: nothing raises under Run All.
    assert value_cell.source == (
        f"# {WORD} 0.1: set kib to 512 KiB in bytes\n"
        "kib = ...\n"
        'check("0.1", kib)')
    # In a function body it raises when the function is called (check() reports "not attempted").
    assert function_cell.source == (
        'def per_token(layers, heads, dim, nbytes):\n    """Docstring stays."""\n'
        f"    # {WORD} 0.2: return the KV bytes per token\n"
        f'    raise NotImplementedError("{WORD} 0.2: return the KV bytes per token")')
    # Nothing in a student copy looks passed before it runs: no stored output, no execution count.
    assert all(c.outputs == [] and c.execution_count is None for c in code_cells(stu))
    assert value_cell.metadata.tags == ["checkoff", "nbval-check-output"]
    assert check_cell.metadata.tags == ["keep-me", "checkoff", "nbval-check-output"]
    assert function_cell.metadata == {}
    # `expect` writes each checkoff cell's pass lines back (with its code-cell number), for pytest --nbval-lax.
    expecting = expect_passes(stu)
    assert [c.outputs for c in code_cells(expecting)][1:4] == [
        [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.1 passed\n")], [],
        [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.2 passed\n")]]
    assert [c.execution_count is not None for c in code_cells(expecting)] == [False, True, False, True] + [False] * 3
    assert all(c.outputs == [] for c in code_cells(stu))  # the copy is new; the student copy is unchanged
    # The solution keeps its code and its markers; nothing is executed yet.
    assert "### BEGIN SOLUTION 0.1" in code_cells(sol)[2].source and "kib = 512 * 1024" in code_cells(sol)[2].source
    assert all(c.outputs == [] for c in code_cells(sol))
    assert [r.checkoff_id for r in parsed.regions] == ["0.1", "0.2"]
    assert parsed.checkoffs == {"0.1": 3, "0.2": 5}


def test_both_copies_end_with_the_scoreboard(tmp_path):
    parsed = B.parse(make_lab(tmp_path))
    for nb in (parsed.solution, parsed.student):
        heading, board = nb.cells[-2:]
        assert heading.cell_type == "markdown" and "python -m labsupport grade" in heading.source
        assert board.source.endswith("scoreboard('00_demo')") and board.metadata.tags == ["scoreboard"]
    assert parsed.solution.cells[-1].id == parsed.student.cells[-1].id
    board = "# %% [markdown]\n# # The board\n\n# %%\nprint('segment 1')\n"
    instructors = B.parse(make_lab(tmp_path, board, name="99_board")).solution
    assert "scoreboard" not in instructors.cells[-1].source  # the board has no checkoffs to score


def _student_cell(tmp_path, cell: str, later: str = "") -> str:
    """The student copy of `cell` in a lab whose 0.2 exercise is the demo's and whose later cell is `later`."""
    text = DEMO.replace('### BEGIN SOLUTION 0.1: set kib to 512 KiB in bytes\nkib = 512 * 1024\n### END SOLUTION\ncheck("0.1", kib)',
                        cell + '\ncheck("0.1", kib)')
    if later:
        text += f"\n# %%\n{later}\n"
    return code_cells(B.parse(make_lab(tmp_path, text)).student)[1].source


def test_placeholders_name_only_what_later_code_reads(tmp_path):
    region = ("### BEGIN SOLUTION 0.1: set kib\nslot = 512\nfor i in range(3):\n    scratch = i\n"
              "kib, extra = slot * 1024, 0\n### END SOLUTION")
    # kib is read by the check; slot by a later cell; scratch, i and extra by nothing after the region.
    got = _student_cell(tmp_path, region, later="print(slot)")
    assert got == f"# {WORD} 0.1: set kib\nslot = ...\nkib = ...\ncheck(\"0.1\", kib)"
    # A later cell that sets a name before reading it does not need the placeholder.
    got = _student_cell(tmp_path, region, later="slot = 3\nprint(slot)")
    assert got == f"# {WORD} 0.1: set kib\nkib = ...\ncheck(\"0.1\", kib)"
    # A loop variable a later cell reads again only after its own `for` binds it.
    got = _student_cell(tmp_path, region, later="for i in range(2):\n    print(i)")
    assert "i = ..." not in got


def test_a_region_inside_a_top_level_block_keeps_the_block_valid(tmp_path):
    region = ("if True:\n    ### BEGIN SOLUTION 0.1: say hello\n    print('hello')\n    ### END SOLUTION\n"
              "kib = 512 * 1024")
    got = _student_cell(tmp_path, region)
    assert got == f"if True:\n    # {WORD} 0.1: say hello\n    pass\nkib = 512 * 1024\ncheck(\"0.1\", kib)"
    compile(got, "cell", "exec")


def test_a_region_that_opens_a_function_body_or_a_method_raises(tmp_path):
    for body in ("def f(x):\n    ### BEGIN SOLUTION 0.1: return it\n    return x\n    ### END SOLUTION\nkib = f(1)",
                 "class C:\n    def f(self, x):\n        ### BEGIN SOLUTION 0.1: return it\n        return x\n"
                 "        ### END SOLUTION\nkib = 1"):
        got = _student_cell(tmp_path, body)
        assert f'raise NotImplementedError("{WORD} 0.1: return it")' in got and " = ..." not in got


def test_a_region_that_is_not_whole_statements_is_rejected(tmp_path):
    text = DEMO.replace("kib = 512 * 1024\n### END SOLUTION", "kib = (512 *\n### END SOLUTION\n 1024)")
    with pytest.raises(B.BuildError, match="whole statements|plain Python"):
        B.parse(make_lab(tmp_path, text))


def test_student_prompt_is_valid_python_for_awkward_prompts(tmp_path):
    awkward = 'say "hi" \\ and 20% more'
    text = DEMO.replace("set kib to 512 KiB in bytes", awkward).replace("return the KV bytes per token", awkward)
    stu = B.parse(make_lab(tmp_path, text)).student
    value_source, function_source = code_cells(stu)[1].source, code_cells(stu)[2].source
    namespace = {}
    exec(value_source.replace('check("0.1", kib)', ""), namespace)
    assert namespace["kib"] is Ellipsis
    exec(function_source, namespace)
    with pytest.raises(NotImplementedError, match=r'0\.2: say "hi" \\ and 20% more'):
        namespace["per_token"](1, 2, 3, 4)


def test_a_cell_inserted_or_edited_changes_only_its_own_id(tmp_path):
    """Issue 37: a rebuild's diff is the change, not every later cell's id (ids come from a cell's text)."""
    before = [c.id for c in B.parse(make_lab(tmp_path)).solution.cells]
    inserted = DEMO.replace("# %%", "# %% [markdown]\n# A new paragraph.\n\n# %%", 1)
    after = [c.id for c in B.parse(make_lab(tmp_path, inserted)).solution.cells]
    assert len(after) == len(before) + 1 and set(before) <= set(after)
    first_code = DEMO.index("# %%\n")
    edited = DEMO[:first_code] + DEMO[first_code:].replace("\n", "\n# one more comment line\n", 2)
    changed = [c.id for c in B.parse(make_lab(tmp_path, edited)).solution.cells]
    assert len(changed) == len(before) and sum(a != b for a, b in zip(before, changed)) == 1


def test_two_equal_cells_still_get_two_ids(tmp_path):
    twice = DEMO + "\n# %%\nprint('again')\n\n# %%\nprint('again')\n"
    ids = [c.id for c in B.parse(make_lab(tmp_path, twice)).solution.cells]
    assert len(set(ids)) == len(ids)


def test_a_rebuild_stores_one_stream_per_run_of_prints():
    """How the kernel chunked its prints is timing, not content: the stored outputs coalesce them."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1); print(2)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                           nbformat.v4.new_output("stream", name="stdout", text="2\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="w\n"),
                           nbformat.v4.new_output("stream", name="stdout", text="3\n")]
    out = B.finalize(nb).cells[0].outputs
    assert [(o.name, o.text) for o in out] == [("stdout", "1\n2\n"), ("stderr", "w\n"), ("stdout", "3\n")]


def test_ids_and_metadata_are_deterministic(tmp_path):
    lab = make_lab(tmp_path)
    one, two = B.parse(lab), B.parse(lab)
    assert B.dumps(one.solution) == B.dumps(two.solution) and B.dumps(one.student) == B.dumps(two.student)
    sol_ids = [c.id for c in one.solution.cells]
    assert len(set(sol_ids)) == len(sol_ids)
    assert sol_ids[0] == B.cell_id("00_demo", B.content_key("markdown", one.solution.cells[0].source, {}))
    assert [c.id for c in one.student.cells] == [i for k, i in enumerate(sol_ids) if k != 3]  # shared ids
    other = B.parse(make_lab(tmp_path, name="00_other"))
    assert other.solution.cells[0].id != sol_ids[0]  # ids come from the file name too
    meta = one.solution.metadata
    assert set(meta) == {"kernelspec", "language_info"}
    assert meta.kernelspec == {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    assert "version" not in meta.language_info
    assert (one.solution.nbformat, one.solution.nbformat_minor) == (4, 5)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("    ### END SOLUTION\n", "", 1), "never closed"),
    (lambda t: t.replace("### BEGIN SOLUTION 0.1: set kib to 512 KiB in bytes", "### BEGIN SOLUTION"), "N.M: <prompt"),
    (lambda t: t.replace("### BEGIN SOLUTION 0.1: set kib to 512 KiB in bytes\n", ""), "without a matching"),
    (lambda t: t.replace('check("0.2", per_token)', 'check("0.9", per_token)'), "not registered"),
    (lambda t: t.replace('check("0.2", per_token)', "per_token"), r"registered checkoffs \['0.2'\] have no check"),
    (lambda t: t.replace('check("0.2", per_token)', 'check("1.1", per_token)'), "belongs to lab 1"),
    (lambda t: t.replace("SOLUTION 0.2:", "SOLUTION 0.3:"), r"checkoffs \['0.2'\] have no"),
    (lambda t: t.replace('secret = "instructors only"', 'check("0.1", 1)'), "solution-only cell cannot"),
    (lambda t: t + '\n# %%\ncheck("0.1", kib)\n', "checked twice"),
    (lambda t: t + "\n# %% [markdown]\n# ### BEGIN SOLUTION 0.1: x\n# ### END SOLUTION\n", "code cells"),
    (lambda t: t.replace('# %% tags=["givens"]\nKV_KIB = 512', "# %%\nKV_KIB = 512"), r"exactly one code cell .*\(found 0\)"),
    (lambda t: t + '\n# %% tags=["givens"]\nKV_KIB = 256\n', r"exactly one code cell .*\(found 2\)"),
    (lambda t: t.replace("KV_KIB = 512", "KV_KIB = int('512')"), "must be a constant"),
    (lambda t: t.replace("KV_KIB = 512", "KV_KIB = 512\nprint(KV_KIB)"), "only 'NAME = value' lines"),
])
def test_broken_sources_are_rejected_with_a_reason(tmp_path, edit, message):
    with pytest.raises(B.BuildError, match=message):
        B.parse(make_lab(tmp_path, edit(DEMO)))


# --- writing, rebuilding, --check --------------------------------------------------------------

def test_build_check_and_rebuild_without_executing(tmp_path, capsys):
    lab = make_lab(tmp_path)
    root = str(tmp_path)
    assert B.main(["--root", root, "--no-execute"]) == 0
    student = lab.student_path.read_text()
    solution = lab.solution_path.read_text()
    # the lab's public record, beside its notebooks in this root (never the repository's)
    record_file = tmp_path / "labsupport" / "course" / "records" / "lab00.json"
    written = json.loads(record_file.read_text())
    kv_kib = card_kv_kib()  # lab 00's givens as its graders declare them, whatever the demo's own cell types
    assert written["givens"] == {"KV_KIB": kv_kib}
    assert [(e["id"], e["kind"], e["prompts"]) for e in written["checkoffs"]] == [
        ("0.1", "value", ["set kib to 512 KiB in bytes"]), ("0.2", "function", ["return the KV bytes per token"])]
    student_ids = {c.id for c in nbformat.read(lab.student_path, as_version=4).cells}
    assert all(set(e["cells"]) <= student_ids for e in written["checkoffs"])
    assert record.unseal(written["checkoffs"][0]["sealed"], 0)["spec"]["want"] == kv_kib * 1024  # 524,288 (lecture)
    assert B.main(["--root", root, "--no-execute", "00"]) == 0
    assert lab.student_path.read_text() == student and lab.solution_path.read_text() == solution
    capsys.readouterr()

    # Never executed: --check says so, cell by cell.
    assert B.main(["--root", root, "--check"]) == 1
    out = capsys.readouterr().out
    assert "solutions/00_demo.ipynb, cell 2: not executed" in out

    # Pretend it was executed, then edit the student copy, add a stray notebook, drop a source.
    nb = nbformat.read(lab.solution_path, as_version=4)
    for n, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        cell.execution_count = n
    B.write(nb, lab.solution_path)
    assert B.main(["--root", root, "--check"]) == 0
    stu = nbformat.read(lab.student_path, as_version=4)
    stu.cells[3].source += "\nprint('edited')"
    B.write(stu, lab.student_path)
    B.write(stu, tmp_path / "notebooks" / "05_orphan.ipynb")
    capsys.readouterr()
    assert B.main(["--root", root, "--check"]) == 1
    out = capsys.readouterr().out
    assert "notebooks/00_demo.ipynb, cell 4: source differs from the generated cell" in out
    assert "notebooks/05_orphan.ipynb: no source" in out
    lab.student_path.unlink()
    assert B.main(["--root", root, "--check"]) == 1
    assert "notebooks/00_demo.ipynb: missing" in capsys.readouterr().out

    # A record edited by hand, or none: stale either way.
    record_file.write_text(record_file.read_text().replace("set kib to 512 KiB in bytes", "set kib"))
    assert B.main(["--root", root, "--check"]) == 1
    assert "labsupport/course/records/lab00.json: the lab's public record is missing or stale" in capsys.readouterr().out
    record_file.unlink()
    assert B.main(["--root", root, "--check"]) == 1
    assert "labsupport/course/records/lab00.json: the lab's public record is missing or stale" in capsys.readouterr().out
    assert B.main(["--root", root, "--no-execute"]) == 0 and json.loads(record_file.read_text()) == written


def test_no_execute_keeps_outputs_of_unchanged_cells_only(tmp_path):
    lab = make_lab(tmp_path)
    B.main(["--root", str(tmp_path), "--no-execute"])
    nb = nbformat.read(lab.solution_path, as_version=4)
    for cell in code_cells(nb):
        cell.execution_count = 7
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="old\n")]
    B.write(nb, lab.solution_path)
    make_lab(tmp_path, DEMO.replace("kib = 512 * 1024", "kib = 2**19"))
    B.main(["--root", str(tmp_path), "--no-execute"])
    cells = code_cells(nbformat.read(lab.solution_path, as_version=4))
    assert [c.execution_count for c in cells] == [7, 7, None, 7, 7, 7, 7, 7]
    assert cells[2].outputs == [] and cells[0].outputs[0].text == "old\n"


MADE_UP = '''# %%
from labsupport.course.checkoff import check

# %% tags=["givens"]
A = 2

# %%
### BEGIN SOLUTION 88.1: set twice_a to twice A
twice_a = 2 * A
### END SOLUTION
check("88.1", twice_a)
'''


@pytest.fixture
def lab_88():
    """A made-up lab 88 (no grader module: its graders are registered here), its one given A = 2."""
    yield
    R.REGISTRY.pop("88.1", None)
    R.GIVENS.pop(88, None)


def test_the_build_refuses_hidden_givens_that_leave_an_answer_unchanged(tmp_path, lab_88):
    R.givens(lab=88, lecture=dict(A=2), hidden=lambda rng: dict(A=rng.randint(3, 50)))
    R.value("88.1", "a constant posing as a formula", expected=lambda g: 4, hint="twice A")
    with pytest.raises(B.BuildError, match=r"checkoff 88.1 has the same answer on the lecture's givens and on hidden "
                                           r"givens \{'A': \d+\}"):
        B.parse(make_lab(tmp_path, MADE_UP, name="88_made_up"))
    R.REGISTRY.pop("88.1")
    R.value("88.1", "twice A", expected=lambda g: 2 * g.A, hint="twice A")
    parsed = B.parse(make_lab(tmp_path, MADE_UP, name="88_made_up"))
    (entry,) = B.record_of(parsed)["checkoffs"]
    assert record.unseal(entry["sealed"], 88)["spec"]["want"] == 4  # 2 x 2, on the lecture's givens


def test_the_build_refuses_hidden_givens_that_never_differ(tmp_path, lab_88):
    R.givens(lab=88, lecture=dict(A=2), hidden=lambda rng: dict(A=2))  # the lecture's value, every draw
    R.value("88.1", "twice A", expected=lambda g: 2 * g.A, hint="twice A")
    with pytest.raises(B.BuildError, match="never differ from the lecture's in every given"):
        B.parse(make_lab(tmp_path, MADE_UP, name="88_made_up"))


def test_a_givens_cell_needs_declared_givens(tmp_path, lab_88):
    R.value("88.1", "four", expected=lambda: 4, hint="twice two")
    with pytest.raises(B.BuildError, match="tagged 'givens' but .*lab88.py declares no givens"):
        B.parse(make_lab(tmp_path, MADE_UP, name="88_made_up"))


def test_a_lab_without_checkoffs_builds_only_as_the_instructors_board(tmp_path):
    board = "# %% [markdown]\n# # The board\n\n# %%\nprint('segment 1')\n"
    lab = make_lab(tmp_path, board, name="99_board")
    assert lab.instructor
    assert B.main(["--root", str(tmp_path), "--no-execute", "99"]) == 0
    assert lab.solution_path.exists() and lab.student_path.exists()
    with pytest.raises(B.BuildError, match="has no checkoffs"):
        B.parse(make_lab(tmp_path, board, name="09_no_checkoffs"))


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    make_lab(tmp_path)
    assert B.main(["--root", str(tmp_path), "--no-execute", "07"]) == 2
    err = capsys.readouterr().err
    assert "no lab source matches '07'" in err and err.count("\n") == 1
    empty = tmp_path / "empty"
    (empty / "solutions").mkdir(parents=True)
    assert B.main(["--root", str(empty)]) == 2
    assert B.main(["--root", str(tmp_path / "nowhere")]) == 2
    assert "--root" in capsys.readouterr().err
    assert B.main(["--root", str(tmp_path), "--frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "--frobnicate" in err and err.count("\n") == 1 and "usage" not in err
    # A lab source that is not UTF-8 names the file and the byte; nothing is written.
    (tmp_path / "solutions" / "00_demo.py").write_bytes(DEMO.encode("utf-8") + b"\n# caf\xe9\n")
    assert B.main(["--root", str(tmp_path), "--no-execute"]) == 2
    err = capsys.readouterr().err
    assert "00_demo.py: not UTF-8" in err and "0xe9" in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "notebooks").exists()
    # A source that breaks a rule of the pipeline is bad input too.
    make_lab(tmp_path, DEMO.replace("    ### END SOLUTION\n", "", 1))
    assert B.main(["--root", str(tmp_path), "--no-execute"]) == 2
    assert "never closed" in capsys.readouterr().err


def test_checkoff_cells_must_print_only_their_line(tmp_path):
    parsed = B.parse(make_lab(tmp_path))
    executed = copy.deepcopy(parsed.solution)
    for cell in code_cells(executed):
        cell.execution_count = 1
    code_cells(executed)[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.1 passed\n")]
    code_cells(executed)[4].outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Checkoff 0.2 passed\n")]
    B.validate_outputs(parsed, executed)
    code_cells(executed)[4].outputs[0].text = "debug 42\n✅ Checkoff 0.2 passed\n"
    with pytest.raises(B.BuildError, match="must print only"):
        B.validate_outputs(parsed, executed)
    code_cells(executed)[4].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])]
    with pytest.raises(B.BuildError, match="raised ValueError: bad"):
        B.validate_outputs(parsed, executed)


@pytest.mark.slow
def test_build_executes_the_solution_in_its_folder(tmp_path, capsys):
    lab = make_lab(tmp_path, demo_on_the_card())
    assert B.main(["--root", str(tmp_path)]) == 0
    assert "the student copy's Run All reached its end" in capsys.readouterr().out
    nb = nbformat.read(lab.solution_path, as_version=4)
    cells = code_cells(nb)
    assert cells[0].outputs[0].text == "cwd is solutions\n"
    assert cells[2].outputs[0].text == "✅ Checkoff 0.1 passed\n"
    assert cells[4].outputs[0].text == "✅ Checkoff 0.2 passed\n"
    assert all(c.execution_count for c in cells)
    assert set(nb.metadata) == {"kernelspec", "language_info"} and "widgets" not in nb.metadata
    # a widget keeps its plain text, not a view of a model nobody stored; then its note and static copy
    panel, note, copy_ = cells[5].outputs
    assert set(panel.data) == {"text/plain"} and panel.data["text/plain"].startswith("Fewer KV heads")
    assert "Run the cell to make it live" in note.data["text/plain"]
    assert "application/vnd.plotly.v1+json" in copy_.data and "transient" not in copy_
    (board,) = cells[7].outputs
    assert board.data["text/plain"].startswith("Checkoffs of 00_demo: 2 of 2 passed, 0 failed, 0 not attempted")
    assert "python -m labsupport grade notebooks/00_demo.ipynb" in board.data["text/html"]
    before = lab.solution_path.read_text()
    assert B.main(["--root", str(tmp_path), "00"]) == 0
    assert lab.solution_path.read_text() == before  # rebuilding changes nothing
    assert B.main(["--root", str(tmp_path), "--check"]) == 0


@pytest.mark.slow
def test_build_fails_when_run_all_of_the_student_copy_stops(tmp_path, capsys):
    """A cell after an exercise that uses the student's unfinished function stops Run All: exit 1, and
    the message names the student copy's cell and the error."""
    make_lab(tmp_path, demo_on_the_card() + "\n# %%\nprint(per_token(32, 32, 128, 2))\n")
    assert B.main(["--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "notebooks/00_demo.ipynb, cell 9: execution stops here with NotImplementedError" in err, err


def test_a_student_run_must_show_one_not_attempted_line_per_checkoff(tmp_path):
    parsed = B.parse(make_lab(tmp_path))
    executed = copy.deepcopy(parsed.student)
    cells = code_cells(executed)
    cells[1].outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="⬜ Checkoff 0.1 not attempted — set kib to 512 KiB in bytes\n")]
    cells[3].outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="⬜ Checkoff 0.2 not attempted — return the KV bytes per token\n")]
    B.validate_student_run(parsed, executed)
    cells[3].outputs[0].text = "❌ Checkoff 0.2: wrong. Hint: h\n"
    with pytest.raises(B.ExecutionFailure, match="cell 6: with the exercise unfinished"):
        B.validate_student_run(parsed, executed)


# --- the repository itself ------------------------------------------------------------------------

def test_committed_notebooks_match_their_sources(capsys):
    assert B.discover(ROOT), "no lab sources in solutions/"
    assert B.main(["--root", str(ROOT), "--check"]) == 0, capsys.readouterr().out


def test_every_lab_has_a_todo_per_checkoff():
    for lab in B.discover(ROOT):
        parsed = B.parse(lab)
        assert set(parsed.checkoffs) == {r.checkoff_id for r in parsed.regions}
        student_text = "\n".join(c.source for c in parsed.student.cells)
        for checkoff_id in parsed.checkoffs:
            assert f"# {WORD} {checkoff_id}: " in student_text


def test_labsupport_source_never_spells_the_word():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "labsupport").rglob("*.py") if WORD in p.read_text()]
    assert offenders == []


def test_the_colab_cell_does_nothing_elsewhere_and_explains_its_url_on_colab(tmp_path, monkeypatch, capsys):
    import sys
    import types

    lab = make_lab(tmp_path)
    cell = B.parse(lab).student.cells[1]
    assert cell.metadata.tags == ["front-end"] and B.REPO_PLACEHOLDER in cell.source
    exec(cell.source, {})  # not on Colab: nothing happens
    assert capsys.readouterr().out == ""
    calls = []
    colab = types.ModuleType("google.colab")
    colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append("widgets"))
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    exec(cell.source, {})
    assert calls == ["widgets"] and "set LABS_REPO" in capsys.readouterr().out
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[project.urls]\n'
                                             'Repository = "https://example.org/course/labs.git"\n')
    assert 'LABS_REPO = "https://example.org/course/labs.git"' in B.parse(lab).solution.cells[1].source


def test_building_a_lab_on_stand_in_traces_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """The tag needs-traces is kept in both copies; building such a lab without the traces warns."""
    lab = make_lab(tmp_path, DEMO.replace('# %% tags=["keep-me"]', '# %% tags=["keep-me", "needs-traces"]'))
    parsed = B.parse(lab)
    for nb in (parsed.solution, parsed.student):
        assert [c.metadata["tags"] for c in nb.cells if "needs-traces" in c.metadata.get("tags", [])] == \
            [["keep-me", "needs-traces", "checkoff", "nbval-check-output"]]
    monkeypatch.delenv("LABSUPPORT_HIDE_TRACES", raising=False)
    monkeypatch.setenv("LABSUPPORT_DATA", str(tmp_path))
    B._say_if_on_stand_ins(lab, parsed.solution)
    present = capsys.readouterr().err
    monkeypatch.setenv("LABSUPPORT_HIDE_TRACES", "1")
    B._say_if_on_stand_ins(lab, parsed.solution)
    hidden = capsys.readouterr().err
    assert hidden == ("build: 00_demo: 4 of 4 real traces are missing, so the outputs of its 1 cell(s) tagged "
                      "needs-traces come from synthetic stand-ins: do not commit them (`python -m labsupport "
                      "traces` fetches the traces)\n")
    from labsupport.workloads import TRACES, find_trace
    if all(find_trace(name) for name in TRACES):  # ../shared/traces here: nothing to say
        assert present == ""


def test_prose_fields_state_the_cards_numbers(tmp_path, monkeypatch):
    """Issue 37: a markdown `{{ expr }}` is the card's value at build; on H200 + Llama 3 8B the MHA form's naive
    slots at S_max = 4,096 are floor((141e9 - 2 * 8.03e9 - 4e9) / (4,096 * 524,288)) = floor(56.3) = 56."""
    card_file = tmp_path / "course.toml"
    card_file.write_text('[card]\ngpu = "h200"\nmodel = "llama-3-8b"\n')
    monkeypatch.setenv("LABSUPPORT_COURSE", str(card_file))
    text = DEMO.replace("# Prose.", "# {{ N.naive_concurrency }} slots on one {{ gpu.name }}; {{ mha.kv_bytes_per_token:, }} B.")
    first = B.parse(make_lab(tmp_path, text)).student.cells[0].source
    assert "56 slots on one h200; 524,288 B." in first


def test_a_prose_field_that_does_not_render_is_one_line_naming_the_cell(tmp_path):
    text = DEMO.replace("# Prose.", "# {{ N.no_such_number }} slots.")
    with pytest.raises(B.BuildError, match=r"00_demo.py, cell 1: the prose field \{\{ N.no_such_number \}\}"):
        B.parse(make_lab(tmp_path, text))



@pytest.mark.parametrize("deaths, message, ran", [
    (1, "Kernel died before replying to kernel_info", 2),  # a kernel that died as it started: a second one runs
    (2, "Kernel died before replying to kernel_info", 2),  # twice: the error stands
    (1, "Event loop stopped before Future completed.", 1),  # any other failure is not retried
])
def test_a_kernel_that_dies_as_it_starts_is_replaced_once(monkeypatch, tmp_path, capsys, deaths, message, ran):
    calls = []

    def run(client, nb, label, progress, env):
        calls.append(nb)
        nb.cells[0].outputs = ["stands for what ran"]  # what a run writes into its copy of the notebook
        if len(calls) <= deaths:
            raise RuntimeError(message)

    monkeypatch.setattr(B, "_run", run)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    if deaths < ran:
        assert B.execute(nb, tmp_path, progress=False, label="lab").cells[0].outputs == ["stands for what ran"]
        assert "lab: the kernel died as it started" in capsys.readouterr().err
    else:
        with pytest.raises(RuntimeError, match=message.split()[0]):
            B.execute(nb, tmp_path, progress=False, label="lab")
    assert len(calls) == ran and nb.cells[0].outputs == []  # each run had a fresh copy, the input is untouched
    assert calls[0] is not calls[-1] or ran == 1


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has ended: it waits only to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
@pytest.mark.parametrize("fails", [False, True])
def test_the_kernel_ends_with_its_notebook(tmp_path, fails):
    """A notebook's kernel starts with the environment it is given and ends when execute returns, or raises: a
    build runs twenty notebooks, and a kernel kept alive after its notebook held its memory, idle, until the whole
    build ended."""
    source = ("import os\nopen('kernel.pid', 'w').write(f\"{os.getpid()} {os.environ['LAB_MARK']}\")"
              + ("\n1 / 0" if fails else ""))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    env = dict(os.environ, LAB_MARK="given")
    if fails:
        with pytest.raises(B.ExecutionFailure, match="ZeroDivisionError"):
            B.execute(nb, tmp_path, progress=False, label="lab", env=env)
    else:
        B.execute(nb, tmp_path, progress=False, label="lab", env=env)
    pid, mark = (tmp_path / "kernel.pid").read_text().split()
    assert mark == "given" and int(pid) != os.getpid() and not _running(int(pid))
