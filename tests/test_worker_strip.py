"""A shortcut is physically absent in grade's worker: each way round "derive, don't call" finds nothing.

The worker's labsupport is written per checkoff without the names it forbids (labsupport.course.
strip).  Each attack below is one a student tried, or one of the same class; each must earn no
pass: the call fails as a missing name and comes back as Forbidden (so grade says "derive, don't
call"), or finds nothing to call.  Honest code that uses what the checkoff allows still works.
Expected numbers come from the lecture's arithmetic, not from labsupport.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import labsupport
from labsupport.course import checkoff as C
from labsupport.course import strip
from labsupport.course.grade import Snapshot
from labsupport.course.worker import WorkerClient
from labsupport.specs import LECTURE_7B, LECTURE_GPU

pytestmark = pytest.mark.slow
NAIVE = ("labsupport.ledger.naive_utilization", *C.ALWAYS_FORBIDDEN)
PACKAGE = Path(labsupport.__file__).resolve().parent
# the lecture's 7B model: 32 layers x 32 KV heads x 128 dims x 2 bytes x (K and V)
KV_BYTES_7B = 32 * 32 * 128 * 2 * 2
# one 640-token sequence in a 4096-token naive slot holds 640/4096 of what it reserves
NAIVE_SHARE = 640 / 4096


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strip")
    client = WorkerClient(tmp / "worker", Snapshot(PACKAGE).write(tmp / "site"))
    yield client
    client.close()


def run(worker, body: str, *args, forbid=NAIVE, checkoff="9.1"):
    """Load `def f(...)` (body given) as the answer to `checkoff` and call it with args."""
    source = f"import labsupport\nfrom labsupport import ledger\n{body}\n__answer__ = f\n"
    return C.call(worker.load(checkoff, source, forbid, body, 60.0), *args)


ATTACKS = {
    "plain call, error swallowed": "def f():\n    try:\n        return ledger.naive_utilization(62.52e9, 4096, 640, 524288)\n"
                                   "    except Exception:\n        return 0.15625",
    "an alias of getattr": "def f():\n    g = getattr\n    return g(ledger, 'naive_' + 'utilization')(62.52e9, 4096, 640, 524288)",
    "an exec string": "def f():\n    ns = {}\n    exec('from labsupport.ledger import naive_utilization as u', ns)\n"
                      "    return ns['u'](62.52e9, 4096, 640, 524288)",
    "functools.reduce(getattr, ...)": "import functools\ndef f():\n"
                                      "    u = functools.reduce(getattr, ['ledger', 'naive_utilization'], labsupport)\n"
                                      "    return u(62.52e9, 4096, 640, 524288)",
    "importlib": "import importlib\ndef f():\n"
                 "    return vars(importlib.import_module('labsupport.ledger'))['naive_utilization'](1, 2, 3, 4)",
    "a frame walk from a caught exception": (
        "import sys\ndef f():\n    try:\n        ledger.naive_utilization\n    except AttributeError as exc:\n"
        "        tb = exc.__traceback__\n        while tb is not None:\n"
        "            for space in (tb.tb_frame.f_globals, tb.tb_frame.f_locals):\n"
        "                if 'naive_utilization' in space:\n"
        "                    return space['naive_utilization'](62.52e9, 4096, 640, 524288)\n"
        "            tb = tb.tb_next\n    return 0.15625"),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_each_way_to_the_forbidden_function_is_reported_as_forbidden(worker, attack):
    with pytest.raises(C.Forbidden, match="labsupport.ledger.naive_utilization"):
        run(worker, ATTACKS[attack])


def test_exec_of_the_module_s_own_file_defines_nothing_forbidden(worker):
    # the file on the worker's disk is the stripped one: read and exec'd, it still has no naive_utilization
    body = ("def f():\n    path = ledger.__file__\n    text = open(path).read()\n    ns = {'__name__': 'copy'}\n"
            "    exec(compile(text, path, 'exec'), ns)\n"
            "    return ['def naive_utilization(' in text, 'naive_utilization' in ns, 'paged_utilization' in ns]")
    assert run(worker, body) == [False, False, True]


def test_no_object_of_the_forbidden_name_lives_anywhere_in_the_worker(worker):
    body = ("import gc\ndef f():\n    import labsupport.viz, labsupport.engine\n"
            "    return [o.__qualname__ for o in gc.get_objects() if callable(o)\n"
            "            and getattr(o, '__name__', '') in ('naive_utilization', 'stats', 'kv_bytes_per_token')\n"
            "            and str(getattr(o, '__module__', '')).startswith('labsupport')]")
    forbid = (*NAIVE, "labsupport.contiguous.ContiguousAllocator.stats", "labsupport.ledger.kv_bytes_per_token")
    found = run(worker, body, forbid=forbid)
    # the other allocators' own stats methods stay (only ContiguousAllocator's was forbidden)
    assert "naive_utilization" not in found and "ContiguousAllocator.stats" not in found
    assert "kv_bytes_per_token" not in found and "ModelSpec.kv_bytes_per_token" in found


@pytest.mark.parametrize("reexport, forbidden", [
    ("labsupport.kvcache.BlockAllocator", "labsupport.block_allocator.BlockAllocator"),
    ("labsupport.engine.CostModel", "labsupport.costmodel.CostModel"),
    ("labsupport.ledger.ModelSpec", "labsupport.specs.ModelSpec"),
])
def test_a_forbidden_name_reached_through_its_re_export_is_missing_too(worker, reexport, forbidden):
    module, _, name = reexport.rpartition(".")
    body = f"import importlib\ndef f():\n    return getattr(importlib.import_module({module!r}), {name!r})"
    with pytest.raises(C.Forbidden, match=forbidden.replace(".", r"\.")):
        run(worker, body, forbid=(forbidden, *C.ALWAYS_FORBIDDEN))
    body = f"def f():\n    from {module} import {name}\n    return 1"
    with pytest.raises(C.Forbidden, match=forbidden.replace(".", r"\.")):
        run(worker, body, forbid=(forbidden, *C.ALWAYS_FORBIDDEN))


def test_the_graders_are_not_in_the_worker_s_copy(worker):
    for body in ("def f():\n    import labsupport.course.checkoffs.lab02\n    return 1",
                 "def f():\n    from labsupport.course import checkoffs\n    return 1"):
        with pytest.raises(C.Forbidden, match="labsupport.course"):
            run(worker, body)
    body = ("import importlib.util, os\ndef f():\n"
            "    return [importlib.util.find_spec('labsupport.course'), os.listdir(os.path.dirname(labsupport.__file__))]")
    spec, listing = run(worker, body)
    assert spec is None and "course" not in listing and "ledger.py" in listing


def test_honest_code_that_uses_allowed_names_works(worker):
    body = "def f(model):\n    return ledger.kv_bytes_per_token(model), model.num_layers * 2"
    assert run(worker, body, LECTURE_7B) == (KV_BYTES_7B, 64)
    body = ("from labsupport.contiguous import ReserveToMaxAllocator\ndef f():\n"
            "    alloc = ReserveToMaxAllocator.from_budget(10**9, 2**10, s_max=4096)\n"
            "    alloc.allocate(0, num_tokens=640)\n"
            "    return sum(s.length for s in alloc.slots.values()) / sum(s.size for s in alloc.slots.values())")
    assert run(worker, body, forbid=(*NAIVE, "labsupport.contiguous.ContiguousAllocator.stats")) == NAIVE_SHARE


def test_a_value_answer_comes_back_as_its_value_from_the_givens_bound_at_the_top(worker):
    program = "S_MAX = 2048\nfrom labsupport import ledger\n__answer__ = S_MAX * ledger.kv_bytes_per_token(ledger.LECTURE_7B)\n"
    assert worker.value("2.1", program, NAIVE, 60.0) == 2048 * KV_BYTES_7B
    with pytest.raises(C.Forbidden, match="naive_utilization"):
        worker.value("2.3", "from labsupport import ledger\n__answer__ = ledger.naive_utilization(1, 2, 3, 4)\n",
                     NAIVE, 60.0)
    deep = "x = []\nfor _ in range(200):\n    x = [x]\n__answer__ = x\n"
    with pytest.raises(C.Mismatch, match="cannot read as plain data"):
        worker.value("2.4", deep, NAIVE, 60.0)
    with pytest.raises(NotImplementedError, match="not yet"):
        worker.value("2.5", "raise NotImplementedError('not yet')\n", NAIVE, 60.0)


def test_a_display_the_copy_cannot_run_is_skipped_but_a_value_that_needs_it_fails(worker):
    # ledger.naive_concurrency divides by naive_slot_bytes: with that removed, a bare call to it (as a lab's
    # display cell would be) is skipped, and the answer computed beside it still counts ...
    forbid = ("labsupport.ledger.naive_slot_bytes", *C.ALWAYS_FORBIDDEN)
    shown = "from labsupport import ledger\nledger.naive_concurrency(62.52e9, 4096, 524288)\n"
    assert worker.value("2.9", shown + "__answer__ = 4096 * 524288\n", forbid, 60.0) == 4096 * KV_BYTES_7B
    # ... but a value taken from it is the student's shortcut, reported as such
    with pytest.raises(C.Forbidden, match="naive_slot_bytes"):
        worker.value("2.9", "from labsupport import ledger\n__answer__ = ledger.naive_concurrency(62.52e9, 4096, 524288)\n",
                     forbid, 60.0)


def test_one_answer_s_files_are_gone_before_the_next_runs(worker):
    run(worker, "def f():\n    open('left-behind.txt', 'w').write('x')\n    return 1")
    assert run(worker, "import os\ndef f():\n    return os.path.exists('left-behind.txt')") is False


def test_every_checkoff_s_copy_imports(tmp_path):
    """Whatever a checkoff removes, the rest of its copy still imports (cascades reach everything that needed it)."""
    from labsupport.course.checkoff import load_lab
    from labsupport.course.grade import LABS

    files = {rel: data for rel, data in Snapshot(PACKAGE).files.items() if not rel.startswith("course/")}
    sets = {c.forbidden for lab in LABS for c in load_lab(lab)}
    sets.add(("labsupport.specs.ModelSpec", "labsupport.block_allocator.BlockAllocator", *C.ALWAYS_FORBIDDEN))
    script = ("import importlib, pkgutil, sys\nsys.path.insert(0, sys.argv[1])\nimport labsupport\n"
              "assert labsupport.__file__.startswith(sys.argv[1])\n"
              "for info in pkgutil.walk_packages(labsupport.__path__, 'labsupport.'):\n"
              "    if not info.name.endswith('__main__'):\n        importlib.import_module(info.name)\n")
    for number, forbidden in enumerate(sorted(sets)):
        out, removed = strip.strip(files, forbidden)
        site = tmp_path / str(number)
        for rel, data in out.items():
            (site / "labsupport" / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / "labsupport" / rel).write_bytes(data)
        assert not any(rel.startswith("course/") for rel in out)
        for name in forbidden:
            assert name in removed or not _exists(name), name
        done = subprocess.run([sys.executable, "-I", "-c", script, str(site)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
        assert done.returncode == 0, (forbidden, done.stderr[-1500:])


def _exists(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False
