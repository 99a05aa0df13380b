"""Checkoff 4.3, posed as what one decode step's attention must move (not as its terms): two different
correct derivations pass, and the plausible wrong counts are rejected with a remark naming the slip.
By hand, the headline point (B = 64, S = 8,192, GQA-8, D = 128, bf16): K and V 2 × 64 × 8,192 × 8 × 128
× 2 = 2,147,483,648 B, query and output 2 × 64 × 32 × 128 × 2 = 1,048,576 B."""
from __future__ import annotations

import pytest

from labsupport.course import checkoff as C
from labsupport.course.checkoff import check, get
from labsupport.course.registry import Mismatch, case_rng


@pytest.fixture(autouse=True)
def _fresh_results():
    C.reset_results()
    yield
    C.reset_results()


def _problem(cid: str, answer) -> str:
    checkoff = get(cid)
    with pytest.raises(Mismatch) as err:
        checkoff.verdict(answer, checkoff.prepare(case_rng(cid)))
    return str(err.value)


def kv(b, s, hkv, d, e):
    return 2 * b * s * hkv * d * e


def q_out(b, hq, d, e):
    return 2 * b * hq * d * e


def test_4_3_headline_by_hand():
    assert kv(64, 8192, 8, 128, 2) + q_out(64, 32, 128, 2) == 2_147_483_648 + 1_048_576


def test_4_3_two_derivations_pass(capsys):
    check("4.3", lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) + q_out(b, hq, d, e))

    def per_sequence(b, s, hq, hkv, d, e):  # walk the batch: each sequence's cache, then its q row and out row
        total = 0
        for _ in range(b):
            total += sum(s * d * e for _tensor in ("K", "V") for _head in range(hkv))
            total += sum(d * e for _row in ("q", "out") for _head in range(hq))
        return total

    check("4.3", per_sequence)
    assert capsys.readouterr().out.count("passed") == 2


@pytest.mark.parametrize("fn, words", [
    (lambda b, s, hq, hkv, d, e: kv(b, s, hq, d, e) + q_out(b, hq, d, e), "once per *query* head"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e), "the query and the output cross HBM too"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) + q_out(b, hq, d, e) // 2, "not the output written"),
    (lambda b, s, hq, hkv, d, e: kv(b, s, hkv, d, e) // 2 + q_out(b, hq, d, e), "keys but not the values"),
])
def test_4_3_names_the_slip(fn, words):
    assert words in _problem("4.3", fn)
