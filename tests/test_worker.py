"""labsupport.course.worker: the throw-away process a function answer runs in while grade tries it.

One worker (a Python process, about a second to start here) serves several answers in turn, as
in grading, each in a child of its own on a labsupport written without that checkoff's forbidden
names; each test hands it a small program and checks what comes back to this side: plain results,
forbidden names reported whatever the code catches, a failed answer after a crash and a fresh
process after a timeout, and prints that never reach the channel.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import labsupport
from labsupport.course import checkoff as C
from labsupport.course.grade import Snapshot
from labsupport.course.worker import WorkerClient
from labsupport.specs import LECTURE_7B, LECTURE_GPU

pytestmark = pytest.mark.slow
FORBID = ("labsupport.ledger.ridge_batch", "labsupport.contiguous.ContiguousAllocator.stats", *C.ALWAYS_FORBIDDEN)


def start_worker(tmp: Path) -> WorkerClient:
    """A worker on a private copy of labsupport, written as grade writes one for a notebook."""
    site = Snapshot(Path(labsupport.__file__).resolve().parent).write(tmp / "site")
    return WorkerClient(tmp / "worker", site)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    client = start_worker(tmp_path_factory.mktemp("worker"))
    yield client
    client.close()


def load(worker, source, checkoff="9.1", budget=60.0, forbid=FORBID):
    return worker.load(checkoff, source + "\n__answer__ = f\n", forbid, source, budget)


def test_results_come_back_as_plain_data_and_arguments_changed_in_place_too(worker):
    fn = load(worker, "def f(model, gpu, table, take):\n"
                      "    print('the student prints a lot', 'x' * 10000)\n"
                      "    table.append(take())\n"
                      "    return (model.num_layers, gpu.peak_flops / gpu.hbm_bandwidth, {3: 'three'})")
    table = [4, 5]
    got = C.call(fn, LECTURE_7B, LECTURE_GPU, table, lambda: 99)
    assert got == (32, 989 / 3.35, {3: "three"}) and type(got) is tuple
    assert table == [4, 5, 99]  # the grader's own list, edited as the student's function edited its copy
    assert fn.info["callable"] and fn.__name__ == "f"


def test_tensors_in_and_out(worker):
    fn = load(worker, "def f(t):\n    t.mul_(2)\n    return t.sum().long()")
    t = torch.arange(4, dtype=torch.int32)
    assert C.call(fn, t).item() == 12 and t.tolist() == [0, 2, 4, 6]


def test_a_forbidden_call_is_reported_whatever_the_code_catches(worker):
    sources = [
        "from labsupport import ledger\ndef f(m, g):\n    try:\n        return ledger.ridge_batch(m, g)\n"
        "    except BaseException:\n        return 295.2",
        "import labsupport.ledger as L\ndef f(m, g):\n    name = 'ridge' + '_' + 'batch'\n    return getattr(L, name)(m, g)",
    ]
    for source in sources:
        fn = load(worker, source)
        with pytest.raises(C.Forbidden, match="ridge_batch"):
            C.call(fn, LECTURE_7B, LECTURE_GPU)


def test_a_forbidden_method_is_missing_on_the_grader_s_own_objects(worker):
    from labsupport.contiguous import ReserveToMaxAllocator

    alloc = ReserveToMaxAllocator.from_budget(10**9, 2**10, s_max=64)
    alloc.allocate(0, num_tokens=5)
    fn = load(worker, "def f(alloc, budget):\n    return alloc.stats().occupied_bytes / budget")
    with pytest.raises(C.Forbidden, match="stats"):
        C.call(fn, alloc, 10**9)
    fn = load(worker, "def f(alloc, budget):\n    return sum(s.length for s in alloc.slots.values()) * 1024 / budget")
    assert C.call(fn, alloc, 10**9) == 5 * 1024 / 10**9


def test_the_graders_cannot_be_imported_in_the_worker(worker):
    with pytest.raises(C.Forbidden, match="labsupport.course"):  # they are not in the worker's copy at all
        load(worker, "import labsupport.course.checkoffs.lab01 as grader\ndef f(m, g):\n    return 0")


def test_unfinished_is_not_attempted_and_errors_name_the_call(worker):
    fn = load(worker, "def f(x):\n    raise NotImplementedError('TO' 'DO 9.1: write it')")
    with pytest.raises(NotImplementedError, match="write it"):
        C.call(fn, 1)
    fn = load(worker, "def f(x):\n    return 1 / x")
    with pytest.raises(C.Mismatch, match=r"f\(0\) raised ZeroDivisionError"):
        C.call(fn, 0)
    fn = load(worker, "def f(x):\n    class Odd:\n        pass\n    return Odd()")
    assert "Odd" in repr(C.call(fn, 0))  # an object of the student's class arrives as a stand-in


def test_a_crash_or_a_hang_fails_that_answer_and_the_next_one_still_runs(worker):
    fn = load(worker, "import os\ndef f():\n    os._exit(7)")
    with pytest.raises(C.Mismatch, match="exited with code 7"):
        C.call(fn)
    with pytest.raises(C.Mismatch, match="exited with code 7"):  # the same answer stays failed
        C.call(fn)
    fn = load(worker, "def f():\n    while True:\n        pass", budget=3)
    with pytest.raises(C.Mismatch, match="did not finish within 3 s"):
        C.call(fn)
    fn = load(worker, "def f():\n    return 'alive'")
    assert C.call(fn) == "alive"


def test_writing_to_the_channel_only_claims_a_result(worker):
    # a function that forges a reply frame on the worker's channel can only claim what it could return
    fn = load(worker, "import os, struct, sys\ndef f():\n"
                      "    channel = int(sys.argv[2])  # the worker's reply channel, as its command line names it\n"
                      "    os.write(channel, struct.pack('>I', 5) + b'oops!')\n"
                      "    return 1")
    with pytest.raises(C.Mismatch):
        C.call(fn)
    fn = load(worker, "def f():\n    return 2")
    assert C.call(fn) == 2
