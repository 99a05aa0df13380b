"""Adding a checkoff, as COURSE_AUTHORING.md tells course staff to: two files, and the build says what is wrong.

The scaffold writes both parts with `...` where the author's work goes; the build refuses them until
every one is filled, and refuses a value checkoff whose hidden givens leave its answer unchanged,
naming it.  The guide's own example (3.12, a block table's bytes) is followed in a copy of the
repository's lab 03 and must give a record check() passes and fails as the guide says.
"""
from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from labsupport.course import build as B
from labsupport.course import scaffold
from labsupport.course.registry import GIVENS, REGISTRY, Givens, givens, value

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registry():
    """The checkoff registry and the givens, put back whole after the test whatever it did or however it ended:
    a made-up lab or a copy's lab 03 never leaks into a later test."""
    saved, saved_givens = dict(REGISTRY), dict(GIVENS)
    try:
        yield REGISTRY
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)
        GIVENS.clear()
        GIVENS.update(saved_givens)


def free_id(lab: int, *sources: Path) -> str:
    """The next checkoff number of `lab` that neither the registry nor `sources` uses: a course that already has
    the guide's 3.12 (an author followed the guide) leaves these tests a number of their own."""
    taken = {int(c.split(".")[1]) for c in REGISTRY if c.startswith(f"{lab}.")}
    for source in sources:
        taken |= {int(n) for n in re.findall(rf'"{lab}\.(\d+)"', source.read_text(encoding="utf-8"))}
    return f"{lab}.{max(taken, default=0) + 1}"


@pytest.fixture
def repo(tmp_path):
    """solutions/ and the graders of a copy of the repository (the scaffold writes nothing else)."""
    (tmp_path / "solutions").mkdir()
    shutil.copyfile(ROOT / "solutions" / "03_block_tables.py", tmp_path / "solutions" / "03_block_tables.py")
    graders = tmp_path / "labsupport" / "course" / "checkoffs"
    graders.mkdir(parents=True)
    shutil.copyfile(ROOT / "labsupport" / "course" / "checkoffs" / "lab03.py", graders / "lab03.py")
    return tmp_path


@pytest.mark.parametrize("kind", ["value", "function", "choice"])
def test_the_scaffold_writes_both_files_and_nothing_else(repo, kind):
    before = {p: p.read_text() for p in repo.rglob("*.py")}
    new = free_id(3, *before)
    written = scaffold.scaffold(new, kind, "Block-table bytes of a long sequence", root=repo)
    assert sorted(written) == sorted(before)  # the lab source and its graders, nothing else
    source, grader = (p.read_text() for p in written)
    assert source.startswith(before[written[0]]) and grader.startswith(before[written[1]])  # appended only
    assert f"### BEGIN SOLUTION {new}:" in source and f'check("{new}"' in source
    assert f'"{new}", "Block-table bytes of a long sequence"' in grader and "..." in grader


def test_the_scaffold_refuses_a_bad_id_a_taken_id_and_a_missing_lab(repo, capsys):
    assert scaffold.main(["new", "3.x", "--title", "t"]) == 2  # refused before any file is touched
    assert capsys.readouterr().err.strip() == "checkoff: the id is lab.number, e.g. 3.12; got '3.x'"
    with pytest.raises(scaffold.UsageError, match="already exists"):
        scaffold.scaffold("3.1", "value", "t", root=repo)
    with pytest.raises(scaffold.UsageError, match="no source"):
        scaffold.scaffold("42.1", "value", "t", root=repo)
    with pytest.raises(scaffold.UsageError, match="lab.number"):
        scaffold.scaffold("3.x", "value", "t", root=repo)


def test_a_scaffolds_placeholder_is_refused_until_it_is_written(registry):
    GIVENS.setdefault(96, Givens(96, {"N": 3}, lambda rng: {"N": rng.randint(4, 9)}))
    with pytest.raises(ValueError, match="still holds the scaffold's `...`"):
        value("96.1", "title", expected=..., hint="h", fixed="nothing")
    with pytest.raises(ValueError, match="still holds the scaffold's `...`"):
        value("96.1", "title", expected=lambda g: g.N, hint="...")
    assert "96.1" not in REGISTRY


def test_the_build_names_a_checkoff_whose_hidden_givens_leave_its_answer_unchanged(registry):
    givens(lab=95, lecture=dict(N=3, M=4), hidden=lambda rng: dict(N=rng.randint(4, 9), M=rng.randint(5, 9)))
    value("95.1", "uses N", expected=lambda g: g.N * 2, hint="h")
    lab = B.Lab(Path("95_made_up.py"), ROOT)
    B.check_hidden_givens(lab, [REGISTRY["95.1"]])  # every hidden N differs from 3: fine
    value("95.2", "uses neither", expected=lambda g: 7, hint="h")  # a number typed into the grader itself
    with pytest.raises(B.BuildError, match=r"checkoff 95\.2 has the same answer on the lecture's givens and on hidden"):
        B.check_hidden_givens(lab, [REGISTRY["95.1"], REGISTRY["95.2"]])
    value("95.3", "N, rounded away on some draws", expected=lambda g: g.N // 10, hint="h")
    with pytest.raises(B.BuildError, match=r"checkoff 95\.3"):
        B.check_hidden_givens(lab, [REGISTRY["95.3"]])


def test_the_guides_example_becomes_a_record_check_reads(repo, registry, monkeypatch, capsys):
    """COURSE_AUTHORING.md's 3.12, typed in as the guide shows it (both files), built without running; under a
    number of its own when the course already has a 3.12."""
    guide = (ROOT / "COURSE_AUTHORING.md").read_text(encoding="utf-8")
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", guide, re.S)]
    lab_cells = next(b for b in blocks if "BEGIN SOLUTION 3.12" in b)
    grader = next(b for b in blocks if 'value(\n    "3.12"' in b)
    source = repo / "solutions" / "03_block_tables.py"
    new = free_id(3, source, repo / "labsupport" / "course" / "checkoffs" / "lab03.py")
    lab_cells, grader = (b.replace("3.12", new) for b in (lab_cells, grader))
    text = source.read_text(encoding="utf-8")
    text = text.replace("TAIL_SHARE = 0.05", "TAIL_SHARE = 0.05\nLONG_TOKENS = 32_768  # a long sequence's tokens")
    source.write_text(text + "\n" + lab_cells, encoding="utf-8")
    graders = repo / "labsupport" / "course" / "checkoffs" / "lab03.py"
    module = graders.read_text(encoding="utf-8").replace(
        "TAIL_SHARE=rng.choice((0.01, 0.02, 0.1)))", "TAIL_SHARE=rng.choice((0.01, 0.02, 0.1)),\n"
        "                 LONG_TOKENS=rng.choice((8_000, 65_536, 100_000)))")
    assert "LONG_TOKENS=" in module
    graders.write_text(module + "\n" + grader, encoding="utf-8")
    # the copy's graders and source stand in for the repository's: a fresh registry for lab 03
    import importlib.util

    for cid in [c for c in REGISTRY if c.startswith("3.")]:
        del REGISTRY[cid]
    monkeypatch.setattr("labsupport.course.registry.ROOT", repo)
    spec = importlib.util.spec_from_file_location("labsupport.course.checkoffs.lab03", graders)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "labsupport.course.checkoffs.lab03", module)
    spec.loader.exec_module(module)
    assert REGISTRY[new].expect() == 2048 * 4  # 32,768 tokens / 16 per block = 2,048 int32 entries, by hand
    parsed = B.parse(B.Lab(source, repo))
    rec = B.record_of(parsed)
    entry = next(e for e in rec["checkoffs"] if e["id"] == new)
    assert entry["prompts"] == ["set table_bytes_32k to the table's bytes for LONG_TOKENS tokens"]
    from labsupport.course import checkoff, record

    entry.update(record.unseal(entry.pop("sealed"), 3))
    checkoff.verdict(entry, 8192)  # passes
    with pytest.raises(checkoff.Mismatch, match="That is the number of entries"):
        checkoff.verdict(entry, 2048)


def test_the_guide_names_every_list_a_new_value_checkoff_must_join():
    """A feedback test that fails until each value checkoff has a DROPPED row is a step the guide tells an author
    about (a TA's trip-up: the test said so only when it failed)."""
    guide = (ROOT / "COURSE_AUTHORING.md").read_text(encoding="utf-8")
    listing = [p for p in sorted((ROOT / "tests").glob("test_lab*_feedback.py"))
               if "\nDROPPED = [" in p.read_text(encoding="utf-8")]
    assert listing, "no feedback test keeps a DROPPED list: this test has nothing to hold the guide to"
    paragraph = next((p for p in guide.split("\n\n") if "joins `DROPPED`" in p), "")
    assert "test_every_value_checkoff_has_a_dropped_step" in paragraph, "the guide does not name DROPPED"
    for path in listing:
        lab = re.search(r"test_lab(\d\d)_feedback", path.name).group(1)
        assert re.search(rf"\b{lab}\b", paragraph), f"the guide's DROPPED paragraph does not name lab {lab}"


def test_a_taken_number_is_skipped(repo):
    """The guide's 3.12 already in the course (an author followed it): these tests take the next number."""
    source = repo / "solutions" / "03_block_tables.py"
    first = free_id(3, source)
    source.write_text(source.read_text(encoding="utf-8") + f'\ncheck("{first}", 8192)\n', encoding="utf-8")
    assert free_id(3, source) == f"3.{int(first.split('.')[1]) + 1}"
