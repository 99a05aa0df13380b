"""Derive-style value checkoffs refuse the library calls that compute their answer (labsupport.course.grade).

A red team passed lab 02's 2.2, 2.5-2.8 and 2.10 by asking labsupport for the number the exercise asks
the student to work out: an allocator's own `stats()`, `CostModel.step(...).memory_s`, the ledger's
whole-block counts, `ledger.batch_that_fits`.  Each lab that gained forbids gets one notebook here: its
solution, with the affected checkoffs' `check()` moved into a new cell after the honest one that hands
in the shortcut instead (the honest cell keeps defining its names, so the cells after it still run).
Each notebook is graded once; every shortcut must fail as "derive, don't call" naming what it used,
and every other checkoff of the solution must still pass.  Every shortcut computes the right value (it
passed before these forbids): the failure is the forbid, not a wrong number.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from labsupport.course import grade as G

pytestmark = pytest.mark.slow

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"

# lab notebook -> {checkoff: (the shortcut's code, ending in the value handed in; a word its detail names)}
SHORTCUTS = {
    "02_naive_allocator.ipynb": {
        "2.1": ("one = ReserveToMaxAllocator(S_MAX, S_MAX, kv_bytes_per_token=KV)\n"
                "one.allocate(0, num_tokens=PROMPT + OUTPUT)\n"
                "short = one.stats().internal_bytes", "stats"),
        "2.2": ("a = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX)\n"
                "while a.fits(S_MAX):\n"
                "    a.allocate(a.num_seqs, num_tokens=PROMPT + OUTPUT)\n"
                "short = a.stats().internal_bytes / BUDGET", "stats"),
        "2.5": ("from labsupport.costmodel import CostModel\n"
                "from labsupport.specs import GPUSpec, ModelSpec\n"
                "b = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX).max_seqs\n"
                "cm = CostModel(ModelSpec('m', LAYERS, KV_HEADS, KV_HEADS, HEAD_DIM, PARAMS, dtype_bytes=DTYPE_BYTES),\n"
                "               GPUSpec('g', HBM_BYTES, HBM_BW, 1e15, 64e9))\n"
                "short = b / cm.step(decode_seqs=b, decode_context_tokens=b * (PROMPT + OUTPUT)).memory_s",
                "CostModel"),
        "2.6": ("a = ReserveToMaxAllocator.from_budget(BUDGET, KV, s_max=S_MAX_LONG)\n"
                "while a.fits(S_MAX_LONG):\n"
                "    a.allocate(a.num_seqs, num_tokens=PROMPT + OUTPUT)\n"
                "short = a.stats().shares()['token_states']", "stats"),
        "2.7": ("a = ReserveToMaxAllocator.from_budget(BUDGET, KV_GQA, s_max=S_MAX_BROCHURE)\n"
                "while a.fits(S_MAX_BROCHURE):\n"
                "    a.allocate(a.num_seqs, num_tokens=PROMPT + OUTPUT)\n"
                "short = a.stats().shares()['token_states']", "stats"),
        "2.8": ("short = (ledger.num_blocks(BUDGET, BLOCK, KV_GQA) // ledger.blocks_for(PROMPT + OUTPUT, BLOCK)) / "
                "ReserveToMaxAllocator.from_budget(BUDGET, KV_GQA, s_max=S_MAX_BROCHURE).max_seqs", "num_blocks"),
        "2.10": ("short = ledger.batch_that_fits(BUDGET, sum(s * p for s, p in MIX), KV)", "batch_that_fits"),
        "2.12": ("short = ledger.tail_waste_tokens(1, BLOCK) * KV", "tail_waste_tokens"),
    },
    "03_block_tables.ipynb": {
        "3.4": ("short = sum(ledger.tail_waste_tokens(n, BLOCK) for n in range(1, BLOCK + 1)) / BLOCK",
                "tail_waste_tokens"),
        "3.5": ("short = ledger.num_blocks(BUDGET, BLOCK, KV) // ledger.blocks_for(PROMPT + OUTPUT, BLOCK)",
                "num_blocks"),
        "3.7": ("short = ledger.block_table_entries(TABLE_TOKENS, BLOCK) * ENTRY_BYTES", "block_table_entries"),
        "3.8": ("short = PRINTED_TABLE_BYTES // BlockAllocator(1, BLOCK).blocks_needed(TABLE_TOKENS)", "blocks_needed"),
    },
    "06_engine_loop.ipynb": {
        "6.3": ("_swap_bytes = ledger.group_swap_bytes(1, LONG_SEQ, 0, 1, gqa_kv_per_token)  # a group of one\n"
                "short = dict(exercise4, swap_advantage=long_recompute_s / (2 * _swap_bytes / LINK_BW),\n"
                "             breakeven_gbs=2 * _swap_bytes / long_recompute_s / 1e9)",
                "group_swap_bytes"),
    },
}


def _value_cell(cid: str, code: str) -> str:
    """The shortcut's code, then check() on the value it leaves in `short`."""
    prelude = "from labsupport import ledger\nfrom labsupport.block_allocator import BlockAllocator\n" \
              "from labsupport.contiguous import ReserveToMaxAllocator\n"
    return f"{prelude}{code}\ncheck({cid!r}, short)"


def _with_shortcuts(source: Path, shortcuts: dict, dest: Path, shortcut_cell) -> Path:
    """The solution `source`, each checkoff of `shortcuts` handed in by a new cell after its honest one."""
    nb = nbformat.read(source, as_version=4)
    for cid, (code, _) in shortcuts.items():
        call = re.compile(rf"^check\(\s*[\"']{re.escape(cid)}[\"'].*$", re.M)
        at = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and call.search(c.source)]
        assert len(at) == 1, f"{source.name}: no single cell checks {cid}"
        cell = nb.cells[at[0]]
        cell.source = call.sub("", cell.source).rstrip() or "pass"
        nb.cells.insert(at[0] + 1, nbformat.v4.new_code_cell(shortcut_cell(cid, code)))
    nbformat.write(nb, dest)
    return dest


def grade_shortcuts(shortcuts_by_lab: dict, tmp_path_factory, shortcut_cell) -> dict:
    """Each lab's solution with its shortcuts, graded two at a time (as `grade --jobs 2` grades a class):
    notebook name -> checkoff id -> its result."""
    grader = G.Grader(timeout=120, secret=bytes(32))
    paths = {name: _with_shortcuts(SOLUTIONS / name, shortcuts, tmp_path_factory.mktemp(name[:2]) / name,
                                   shortcut_cell) for name, shortcuts in shortcuts_by_lab.items()}
    try:
        grades = G.grade_all(grader, [G.Submission(p, "alice") for p in paths.values()], jobs=2, progress=False)
    finally:
        grader.close()
    return {name: {c.id: c for c in g.checkoffs} for name, g in zip(paths, grades)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_shortcuts(SHORTCUTS, tmp_path_factory, _value_cell)


CASES = [(name, cid) for name, shortcuts in SHORTCUTS.items() for cid in shortcuts]


@pytest.mark.parametrize("name,cid", CASES)
def test_a_library_shortcut_fails_as_derive_dont_call(graded, name, cid):
    row = graded[name][cid]
    assert row.status == "failed", row.detail
    assert "derive, don't call" in row.detail and SHORTCUTS[name][cid][1] in row.detail, row.detail


@pytest.mark.parametrize("name", list(SHORTCUTS))
def test_the_solutions_own_answers_still_pass(graded, name):
    others = {cid: row for cid, row in graded[name].items() if cid not in SHORTCUTS[name]}
    assert others
    bad = {cid: row.detail for cid, row in others.items() if row.status != "passed"}
    assert not bad, bad
