"""Lab 05's checkoffs on the new grading design.

5.3 (reference counts after a divergence), posed on lab 05's givens: two different correct derivations pass
on the lecture's givens and on hidden ones; each plausible wrong picture of the pool is rejected with a
remark that names it.  Expected numbers here are worked by hand from the mechanism.

5.1 runs scripted fork/append/free histories through the student's function (a harness, on plain data) and
compares with the real allocator's run up to renaming of block ids; 5.2 and 5.4 are cases of plain data,
5.4's long history the same whether or not the Mooncake trace is on the machine.
"""
from __future__ import annotations

import json
import random
import re

import pytest

from labsupport.course import checkoff as C
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch, close
from labsupport.course.registry import GIVENS, case_rng, namespace

pytestmark = pytest.mark.usefixtures("fresh_results")

LECTURE = dict(N_BRANCHES=8, BLOCK=16, PROMPT_TOKENS=100, WRITERS=5)


def closed_form(g):
    """Full blocks stay shared by all; each writer that finds the tail shared takes a private copy."""
    full, tail = divmod(g["PROMPT_TOKENS"], g["BLOCK"])
    n, w = g["N_BRANCHES"], g["WRITERS"]
    if not tail:
        return {"refcounts": [n] * full + [1] * w, "copies": 0}
    return {"refcounts": [n] * full + [n - w] * (n > w) + [1] * w, "copies": n - 1}


def by_hand_simulation(g):
    """A second derivation: walk the writes one by one on a dict of block -> holders."""
    n, b, p, w = g["N_BRANCHES"], g["BLOCK"], g["PROMPT_TOKENS"], g["WRITERS"]
    blocks = -(-p // b)
    holders = {i: set(range(n)) for i in range(blocks)}
    tables = {br: list(range(blocks)) for br in range(n)}
    nxt, copies, snapshot = blocks, 0, None
    for k, br in enumerate(range(n)):
        if k == w:
            snapshot = sorted(len(h) for h in holders.values() if h)
        last = tables[br][-1]
        if p % b == 0:  # the token starts a new block
            holders[nxt] = {br}
            tables[br].append(nxt)
            nxt += 1
        elif len(holders[last]) > 1:  # shared: copy it
            holders[last].discard(br)
            holders[nxt] = {br}
            tables[br][-1] = nxt
            nxt += 1
            copies += 1
    if snapshot is None:
        snapshot = sorted(len(h) for h in holders.values() if h)
    return {"refcounts": snapshot, "copies": copies}


def test_the_lecture_case_by_hand():
    # 100 tokens at b = 16: 6 full blocks (8 holders each) and a 4-token tail; 5 writers copy it away
    # (5 private blocks), 3 holders stay on the original; once all 8 write, 7 copies (the last writes in place).
    assert sorted(closed_form(LECTURE)["refcounts"]) == [1, 1, 1, 1, 1, 3, 8, 8, 8, 8, 8, 8]
    assert closed_form(LECTURE)["copies"] == 7


@pytest.mark.parametrize("derive", [closed_form, by_hand_simulation])
def test_two_correct_derivations_pass_on_the_lecture_and_hidden_givens(derive, capsys):
    check("5.3", derive(LECTURE))
    assert capsys.readouterr().out == "✅ Checkoff 5.3 passed\n"
    c = get("5.3")
    for g in GIVENS[5].draw(case_rng("givens", b"lab05 test", "x"), 4) + [
            dict(N_BRANCHES=4, BLOCK=8, PROMPT_TOKENS=32, WRITERS=2)]:  # a full last block: nothing copied
        c.verdict(derive(g), c.expect(namespace(g)))
        assert derive(g) == by_hand_simulation(g) or sorted(derive(g)["refcounts"]) == by_hand_simulation(g)["refcounts"]


def test_a_typed_lecture_answer_fails_on_hidden_givens():
    c = get("5.3")
    for g in GIVENS[5].draw(random.Random(7), 2):
        with pytest.raises(Mismatch):
            c.verdict(closed_form(LECTURE), c.expect(namespace(g)))


@pytest.mark.parametrize("answer, names", [
    ({"refcounts": [8] * 7 + [1] * 5, "copies": 7}, "each copy moves one reference off the original"),
    ({"refcounts": [8] * 6 + [1] * 5, "copies": 7}, "original tail block is missing"),
    ({"refcounts": [3] * 7 + [1] * 35, "copies": 7}, "copied the full blocks too"),
    # 8 copies is the lecture's Exercise 3 count (the prompt kept alive as a ninth holder): the remark names the
    # convention of this lab, where the prompt's own sequence is the first branch and the last writer copies nothing
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 8}, "prompt's own sequence is the first branch.*writes in place"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 5}, "once every branch has written"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 56}, "full blocks are never written again"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 0}, "needs a private copy"),
])
def test_each_plausible_wrong_picture_is_named(answer, names, fails):
    with fails(names):
        check("5.3", answer)


@pytest.mark.parametrize("answer, names", [
    ({"refcounts": [8] * 6 + [3, 0] + [1] * 5, "copies": 7}, "ref_count 0; a block nobody names is free"),
    ({"refcounts": [8] * 6 + [2, 2] + [1] * 4, "copies": 7}, "right number of blocks in use, but not their"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5}, "exactly the keys"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 9}, "9 block copies is too many for all 8 branches"),
    ({"refcounts": [8] * 6 + [3] + [1] * 5, "copies": 6}, "too few for all 8 branches"),
])
def test_the_pool_picture_problems_are_named(answer, names, fails):
    with fails(names):
        check("5.3", answer)


def test_no_listed_mistake_is_right_on_any_givens():
    c = get("5.3")
    for g in [GIVENS[5].lecture, *GIVENS[5].draw(case_rng("givens", b"lab05 mistakes", "x"), 8)]:
        spec = c.value_spec(namespace(g))
        for key, sub in spec["keys"].items():
            assert not any(close(w, spec["want"][key]) for w, _ in sub["mistakes"]), (g, key)


# --- 5.1: copy-on-write append, beside the real allocator -------------------------------------------

def cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    table, n = tables[seq], seq_lens[seq]
    offset, cow = n % block_size, None
    if offset == 0:  # the last block is full (or there is none): a fresh block, nothing copied
        block = free_blocks.pop(0)
        ref_counts[block] = 1
        table.append(block)
    else:
        block = table[-1]
        if ref_counts[block] > 1:  # someone else still names it: copy before writing
            new = free_blocks.pop(0)
            ref_counts[new], ref_counts[block] = 1, ref_counts[block] - 1
            table[-1], cow, block = new, (block, new), new
    seq_lens[seq] = n + 1
    return block * block_size + offset, cow


def cow_append_from_the_end(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    """The other derivation: blocks taken from the END of the free list (other ids; the same sharing)."""
    n = seq_lens[seq]
    table = tables[seq]
    cow = None
    if n == len(table) * block_size:
        table.append(free_blocks.pop())
        ref_counts[table[-1]] = 1
    elif ref_counts[table[-1]] != 1:
        old = table[-1]
        table[-1] = free_blocks.pop()
        ref_counts[table[-1]] = 1
        ref_counts[old] -= 1
        cow = (old, table[-1])
    seq_lens[seq] = n + 1
    return table[n // block_size] * block_size + n % block_size, cow


def test_5_1_two_derivations_pass_on_the_labs_and_on_hidden_scripts():
    c = get("5.1")
    for rng in (case_rng("5.1"), case_rng("5.1", b"a grading secret", "nb")):
        cases = c.prepare(rng)
        for fn in (cow_append, cow_append_from_the_end):
            c.verdict(fn, cases)


def test_5_1_cases_are_scripts_as_data():
    cases = get("5.1").prepare(case_rng("5.1"))
    assert len(cases) == 8  # the lab's six situations, then two random histories
    for k in cases:
        assert k.harness == "cow_append" and set(k.data) == {"block_size", "num_blocks", "ops"}
        assert '"want"' not in json.dumps(k.input())
    # by hand, the first script (block size 4): p holds 6 tokens in 2 blocks, forked twice (3 holders each);
    # a's first append lands in the shared half-filled tail: a copy
    first = cases[0]
    assert first.want[3]["returned"][1] is not None and first.want[2]["ref_counts"].count(3) == 2


def _always_copies(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    n, table = seq_lens[seq], tables[seq]
    if n % block_size == 0:
        return cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size)
    old = table[-1]
    table[-1] = free_blocks.pop(0)
    ref_counts[table[-1]], ref_counts[old] = 1, ref_counts[old] - 1
    seq_lens[seq] = n + 1
    return table[-1] * block_size + n % block_size, (old, table[-1])


def _keeps_the_reference(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    old = tables[seq][-1] if tables[seq] else None
    slot, cow = cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size)
    if cow is not None:
        ref_counts[old] += 1  # the copy never moved a reference off the old block
    return slot, cow


def _forgets_the_length(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    out = cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size)
    seq_lens[seq] -= 1
    return out


def _writes_in_place(seq, tables, seq_lens, ref_counts, free_blocks, block_size):
    n, table = seq_lens[seq], tables[seq]
    if n % block_size == 0:
        return cow_append(seq, tables, seq_lens, ref_counts, free_blocks, block_size)
    seq_lens[seq] = n + 1
    return table[-1] * block_size + n % block_size, None


@pytest.mark.parametrize("fn, words", [
    (_always_copies, "you copied a block; this append must write without copying"),
    (_writes_in_place, "did not copy; this append lands in a block someone else still names"),
    (_keeps_the_reference, "ref_count"),
    (_forgets_the_length, "the append must count the token it placed"),
    (lambda *args: cow_append(*args)[0], "return a pair (slot, cow)"),
    (lambda seq, *args: {}[seq], "cow_append raised KeyError"),
])
def test_5_1_names_the_slip(fn, words):
    c = get("5.1")
    with pytest.raises(Mismatch, match=re.escape(words)):
        c.verdict(fn, c.prepare(case_rng("5.1")))


# --- 5.2 and 5.4 ----------------------------------------------------------------------------------------

def fanout_blocks(n, prompt, output, block_size):
    per_branch = -(-(prompt + output) // block_size)
    full = prompt // block_size
    return n * per_branch, full + n * (per_branch - full)


def fanout_by_walking(n, prompt, output, block_size):
    """The other derivation: walk one branch's tokens block by block; full prompt blocks counted once."""
    own = sum(1 for start in range(0, prompt + output, block_size) if start + block_size > prompt)
    return n * -(-(prompt + output) // block_size), (prompt // block_size) + n * own


def test_5_2_by_hand_and_two_derivations():
    # n = 8, prompt 100, output 40, b = 16: 140 tokens are 9 blocks a branch (72 unshared); the 6 full prompt
    # blocks are shared once and each branch owns its 3 others: 6 + 8 x 3 = 30
    assert fanout_blocks(8, 100, 40, 16) == (72, 30)
    c = get("5.2")
    for rng in (case_rng("5.2"), case_rng("5.2", b"a grading secret", "nb")):
        for fn in (fanout_blocks, fanout_by_walking):
            c.verdict(fn, c.prepare(rng))


@pytest.mark.parametrize("fn, words", [
    (lambda n, p, o, b: (n * -(-(p + o) // b), -(-p // b) + n * -(-o // b)), "stayed shared"),
    (lambda n, p, o, b: (n * (p + o), p + n * o), "count of tokens"),
    (lambda n, p, o, b: (n * -(-(p + o) // b), 0), "your shared count is 0, the allocator holds a different number"),
    (lambda n, p, o, b: n * -(-(p + o) // b), "return a pair"),
])
def test_5_2_names_the_slip(fn, words, fails):
    with fails(words):
        check("5.2", fn)


def prefix_hit_blocks(requests):
    seen, hits = set(), 0
    for ids in requests:
        key, leading = None, True
        for block_id in ids:
            key = (key, block_id)
            leading = leading and key in seen
            hits += leading
            seen.add(key)
    return hits


def prefix_by_chain_ids(requests):
    """The other derivation: a trie of dicts, one level per block."""
    root, hits = {}, 0
    for ids in requests:
        node, leading = root, True
        for block_id in ids:
            leading = leading and block_id in node
            hits += leading
            node = node.setdefault(block_id, {})
    return hits


def test_5_4_by_hand_and_two_derivations():
    # [1,2,3] misses all; [1,2,4] hits 1,2; [5,2,3] misses (2 after 5 is new); [1,2,3,9] hits 3; [1] hits 1;
    # [2,3] misses: 0 + 2 + 0 + 3 + 1 + 0 = 6
    assert prefix_hit_blocks([[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2, 3, 9], [1], [2, 3]]) == 6
    c = get("5.4")
    for rng in (case_rng("5.4"), case_rng("5.4", b"a grading secret", "nb")):
        for fn in (prefix_hit_blocks, prefix_by_chain_ids):
            c.verdict(fn, c.prepare(rng))


def test_5_4_an_id_counted_without_its_prefix_is_wrong(fails):
    def by_id(requests):
        seen, hits = set(), 0
        for ids in requests:
            for block_id in ids:
                hits += block_id in seen
                seen.add(block_id)
        return hits

    with fails("the allocator's prefix index serves fewer"):
        check("5.4", by_id)


def test_5_4_public_cases_do_not_depend_on_the_traces(monkeypatch):
    """`build --check` must write the same record on a machine without the traces."""
    from labsupport.workloads import HIDE_TRACES_ENV

    def public():
        cases = get("5.4").prepare(case_rng("5.4"))
        return json.dumps([[k.input(), k.public_spec("prefix_hit_blocks")] for k in cases], sort_keys=True)

    monkeypatch.delenv(HIDE_TRACES_ENV, raising=False)
    with_traces = public()
    monkeypatch.setenv(HIDE_TRACES_ENV, "1")
    assert public() == with_traces
    long = get("5.4").prepare(case_rng("5.4"))[3]
    assert len(long.args[0].real) == 2000 and 0 < long.want < sum(map(len, long.args[0].real))


# --- item 4: each step 5.3's prompt names changes the answer on hidden givens --------------------------------

def _always_a_tail(g):
    """Drops "a written token goes into the slot after the branch's last token": treats the last prompt block as
    a shared tail to copy even when the prompt fills it."""
    full, n, w = -(-g["PROMPT_TOKENS"] // g["BLOCK"]) - 1, g["N_BRANCHES"], g["WRITERS"]
    return {"refcounts": [n] * full + [n - w] * (n > w) + [1] * w, "copies": n - 1}


def _full_blocks_copied_too(g):
    """Drops "full blocks are never written again": every prompt block is copied by every writer."""
    right, blocks = closed_form(g), -(-g["PROMPT_TOKENS"] // g["BLOCK"])
    n, w = g["N_BRANCHES"], g["WRITERS"]
    return {"refcounts": [n - w] * blocks + [1] * (w * blocks), "copies": right["copies"] * blocks}


def _last_writer_copies_too(g):
    """Drops "a branch may write into a block only if no other branch still names it" for the last branch."""
    right = closed_form(g)
    return dict(right, copies=g["N_BRANCHES"] if g["PROMPT_TOKENS"] % g["BLOCK"] else 0)


def _copies_of_the_writers_only(g):
    """Drops "once all N_BRANCHES branches have written": counts the first WRITERS' copies."""
    right = closed_form(g)
    return dict(right, copies=g["WRITERS"] if g["PROMPT_TOKENS"] % g["BLOCK"] else 0)


def _original_tail_forgotten(g):
    """Drops "every block in use": leaves out the original tail, still named by the branches yet to write."""
    right = closed_form(g)
    n, w = g["N_BRANCHES"], g["WRITERS"]
    refs = list(right["refcounts"])
    if g["PROMPT_TOKENS"] % g["BLOCK"]:
        refs.remove(n - w)
    return dict(right, refcounts=refs)


@pytest.mark.parametrize("sloppy", [_always_a_tail, _full_blocks_copied_too, _last_writer_copies_too,
                                    _copies_of_the_writers_only, _original_tail_forgotten])
def test_5_3_each_named_step_fails_on_hidden_givens(sloppy):
    """Each derivation that drops one named step fails `verdict` on some hidden set of a few grading secrets'
    draws (two sets a grade), and each is a different answer from the right one somewhere."""
    c = get("5.3")
    failed = 0
    for secret in (b"grade-1", b"grade-2", b"grade-3"):
        for g in GIVENS[5].draw(case_rng("givens", secret, "lab05"), 2):
            try:
                c.verdict(sloppy(g), c.expect(namespace(g)))
            except Mismatch:
                failed += 1
    assert failed, sloppy.__name__


def test_5_3_hidden_sets_end_the_prompt_both_ways():
    """Half the hidden sets end the prompt on a block boundary: a derivation that always copies is caught."""
    sets = GIVENS[5].draw(case_rng("givens", b"lab05 shapes", "x"), 12)
    assert any(g["PROMPT_TOKENS"] % g["BLOCK"] == 0 for g in sets)
    assert any(g["PROMPT_TOKENS"] % g["BLOCK"] for g in sets)


# --- issue 35: no readout answers 5.3 or 5.4 before its checkoff ----------------------------------------------

def _outputs_before(check_id):
    """The text of every executed solution cell above the one that calls check(check_id)."""
    import nbformat
    from pathlib import Path

    nb = nbformat.read(Path(__file__).resolve().parents[1] / "solutions" / "05_copy_on_write.ipynb", as_version=4)
    out = []
    for cell in nb.cells:
        if f'check("{check_id}"' in cell.source:
            return "\n".join(out)
        out.append(cell.source)
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + "".join(str(v) for v in (o.get("data") or {}).values()))
    raise AssertionError(f"no check({check_id!r}) cell")


def test_5_3_refcounts_and_copies_show_only_after_it():
    """Section 1's write leaves block 2 at refcount 7 and its copy at 1 (8 holders, 1 wrote), and the fan-out of
    section 2 makes 7 copies (8 branches off a prompt ending mid-block, the last writes in place): both are 5.3's
    picture, so neither shows above 5.3's checkoff."""
    text = _outputs_before("5.3")
    assert not re.search(r"7 \+ 1|ref 7\b|refcount 7|copy-on-write copies|ref counts \[", text), text[-2000:]
    assert "LEDGER" not in text


def test_5_4_hit_rate_shows_only_after_it():
    """The conversation trace's unbounded prefix hits (105,710 of 288,500 blocks = 36.64%, the allocator's
    replay) are 5.4's answer on the trace: nothing above 5.4's checkoff prints or states them."""
    text = _outputs_before("5.4")
    assert not re.search(r"36\.6|105,710|served by the prefix index", text)
