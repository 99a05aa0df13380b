"""Labs 00 and 01's rewritten exercises: 0.1 is posed on its given (KV_KIB) and names the units slips,
0.2 names what a wrong count left out (checked against the case, not guessed from a ratio), and 1.1's
options no longer spell out a job's name."""
from __future__ import annotations

import pytest

from labsupport import card
from labsupport.course.checkoff import check
from labsupport.course.checkoffs import get
from labsupport.course.judge import Mismatch
from labsupport.course.registry import GIVENS, case_rng, namespace

# The lab's given, by hand from the course card's model (§10.1): K and V, per layer, per KV head, head_dim elements of
# dtype_bytes bytes each; in KiB (2**10 bytes).  The lecture's card: 2 x 32 x 32 x 128 x 2 B = 512 KiB.
_M = card.card().model
KV_BYTES = 2 * _M.num_layers * _M.num_kv_heads * _M.head_dim * _M.dtype_bytes
KIB = KV_BYTES // 1024 if KV_BYTES % 1024 == 0 else KV_BYTES / 1024


def _problem(cid: str, answer) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(answer, checkoff.prepare(case_rng(cid)))
    return str(err.value)


def test_0_1_two_derivations_pass_on_every_set_of_givens():
    checkoff = get("0.1")
    sets = [GIVENS[0].lecture, *GIVENS[0].draw(case_rng("givens", b"feedback test", "lab00"), 3)]
    assert sets[0] == {"KV_KIB": KIB}  # the card's given (512 on the lecture's card)
    for g in sets:
        want = checkoff.expect(namespace(g))
        checkoff.verdict(g["KV_KIB"] * 1024, want)
        checkoff.verdict(g["KV_KIB"] << 10, want)
    assert checkoff.prepare(None) == KV_BYTES  # the card's bytes per token (512 x 1,024 = 524,288 on the lecture's)


@pytest.mark.parametrize("answer, words", [(KIB * 1000, "decimal kB"), (KIB * 2**20, "MiB"), (KIB * 1024 * 8, "bits")])
def test_0_1_names_the_units_slip(answer, words):
    """On the card's given (the lecture's 512 KiB: 512,000, 512 MiB, 512 x 1,024 x 8)."""
    assert words in _problem("0.1", answer)


@pytest.mark.parametrize("fn, words", [
    (lambda l, h, d, b: l * h * d * b, "two tensors"),
    (lambda l, h, d, b: 2 * h * d * b, "one layer's K and V"),
    (lambda l, h, d, b: 2 * l * h * d, "elements without their bytes"),
])
def test_0_2_names_what_the_count_left_out(fn, words):
    text = _problem("0.2", fn)
    assert words in text and "too low" in text


def test_0_2_accepts_two_derivations(capsys):
    check("0.2", lambda l, h, d, b: 2 * l * h * d * b)
    check("0.2", lambda l, h, d, b: sum(h * d * b for _ in range(l) for _tensor in ("K", "V")))
    assert capsys.readouterr().out.count("passed") == 2


def test_1_1_options_do_not_name_a_job():
    options = ("memory", "arithmetic", "places", "latency")
    jobs = ("admit", "allocate", "batch", "run", "stream")
    assert not any(job in option for job in jobs for option in options)
    right = {"admit": "memory", "allocate": "memory", "batch": "places", "run": "arithmetic", "stream": "latency"}
    get("1.1").verdict(right, get("1.1").prepare(None))
    assert "is not one of: memory, arithmetic, places, latency" in _problem("1.1", dict(right, batch="batch slots"))
    assert get("1.1").fixed  # a map of names: nothing for givens to vary


def test_1_1_glosses_do_not_mirror_the_job_table():
    """Each option's gloss describes the resource, not the job: none of the table's own words reappear."""
    import re
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "solutions" / "01_five_jobs.py").read_text()
    prompt = source[source.index("### Exercise 1.1"):source.index("### BEGIN SOLUTION 1.1")]
    prompt = re.sub(r"\s*\n#\s*", " ", prompt)
    found = re.findall(r'`"(?:memory|arithmetic|places|latency)"` \(([^)]*)\)', prompt)
    assert len(found) == 4, found
    glosses = " ".join(found).lower()
    for table_words in ("forward pass", "kv", "kernel", "token", "iteration", "prefill", "decode", "sequence",
                        "flops", "bandwidth", "per-step"):
        assert table_words not in glosses, table_words


def test_0_2_prompt_does_not_list_the_factors():
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "solutions" / "00_setup.py").read_text()
    prompt = source[source.index("### Exercise 0.2"):source.index("check(\"0.2\"")]
    for spelled in ("keys\n# and the values", "and so is\n# its value", "every layer**", "K and V"):
        assert spelled not in prompt, spelled


@pytest.mark.parametrize("dropped, derive", [
    ("KiB as 2**10 bytes (read as 10**3)", lambda g: g["KV_KIB"] * 1000),
    ("KiB, not MiB", lambda g: g["KV_KIB"] * 2**20),
    ("bytes, not bits", lambda g: g["KV_KIB"] * 2**10 * 8),
    ("the given itself (the lecture's 512 typed in)", lambda g: 512 * 2**10),
    ("the given itself (the card's KV_KIB typed in)", lambda g: KV_BYTES),
])
def test_0_1_each_named_step_fails_on_every_hidden_set(dropped, derive):
    """0.1 names one step (KV_KIB KiB in bytes); every way of dropping it fails on hidden givens."""
    checkoff = get("0.1")
    for secret in (b"grade-1", b"grade-2", b"grade-3"):
        for g in GIVENS[0].draw(case_rng("givens", secret, "lab00"), 2):
            with pytest.raises(Mismatch):
                checkoff.verdict(derive(g), checkoff.expect(namespace(g)))
