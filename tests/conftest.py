"""Shared fixtures."""
from __future__ import annotations

import contextlib
import io
import re

import pytest


# Longest first.  pytest-xdist deals the groups out in collection order, so a long group dealt late is the run's tail
# (with test_retarget.py collected near the end, `make test` ran for minutes on one worker).  These modules' groups
# are the longest chains of the slow tier, in this order; every other test follows in its own order.
LONGEST_FIRST = ("test_retarget", "test_browser", "test_browser_a11y", "test_browser_board", "test_browser_present",
                 "test_browser_reopen", "test_grade_solutions", "test_notebooks", "test_answer_scan", "test_pretrained",
                 "test_one_call_answers", "test_givens_styles", "test_grade_plan", "test_grade_bounds",
                 "test_grade_runs", "test_bench_smollm2")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test`), the browser tests keep to two workers: the labs' Run All with its audit on
    one, the board and the other pages on the other (each drives its own server and Chromium).  The tests that read
    a student copy's Run All (the `run_all` fixture runs each copy once a session) share a worker, and so do a
    module's tests that share an expensive fixture."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.xdist_group(_browser_group(item)))
        elif "run_all" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("run-all"))  # each student copy's Run All once, for every test
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(getattr(getattr(item, "module", None), "__name__", ""), len(rank)))  # stable: order kept within


def pytest_configure(config):
    """`--dist loadgroup` on a pytest whose node ids pytest-xdist cannot suffix would spread every group over the
    workers: module fixtures built once per worker, browser tests racing each other.  That run stops here, in one
    line, rather than running slow and flaky (tests/test_suite.py checks the grouping itself)."""
    if (why := lost_groups(config)):
        raise pytest.UsageError(why)


def lost_groups(config, reads_nodeid: bool | None = None) -> str:
    """Why `--dist loadgroup` would lose its groups here ('' when it keeps them, or is not asked for).  pytest-xdist
    (to 3.8 at least) groups a test by writing "@group" into its `_nodeid`; from pytest 9.2 a node's id is read from
    another field, so the write is lost (pytest-dev/pytest-xdist#1386)."""
    if hasattr(config, "workerinput") or config.getvalue("dist") != "loadgroup":
        return ""
    if reads_nodeid is None:
        from _pytest.nodes import Node
        reads_nodeid = "_nodeid" in Node.nodeid.fget.__code__.co_names
    if reads_nodeid:
        return ""
    return (f"pytest {pytest.__version__} keeps pytest-xdist's --dist loadgroup from grouping any test "
            f"(pytest-dev/pytest-xdist#1386): install pytest<9.2 (`make test` does), or run with JOBS=1")


# The labs' Run All in Chromium and its accessibility audit share one Run All per notebook (test_browser.AFTER_CHECKS):
# one worker.  The board's, present mode's and the reopen tests start JupyterLab or Voila of their own: a second one.
_RUN_ALL_BROWSER = ("test_browser", "test_browser_a11y")


def _browser_group(item) -> str:
    return "browser" if item.module.__name__ in _RUN_ALL_BROWSER else "browser-board"


def _shares_a_module_fixture(item) -> bool:
    """Whether the test uses a module- or session-scoped fixture of its own module (a batch graded once, a model
    trained once): its module's tests then share one worker, or each worker would build the fixture again."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    if info is None or module is None:
        return False
    return any(defs and defs[-1].scope in ("module", "session") and getattr(defs[-1].func, "__module__", "") ==
               module.__name__ for defs in info.name2fixturedefs.values())


@pytest.fixture
def fresh_results():
    """No checkoff result of another test is seen, and none of this one's is left behind."""
    from labsupport.course import checkoff

    checkoff.reset_results()
    yield
    checkoff.reset_results()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids oversubscribing a shared CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def gguf_read_once():
    """Within a module, transformers' GGUF loads share gguf's reading of the file.  transformers parses the whole
    file at each load (its config, its weights and its tokenizer: three parses of SmolLM2's 98 MB, each about
    3.5 CPU-s) and builds gguf's tensor-name map once per tensor (397 times, 4.7 CPU-s); both are pure reads of a
    file that does not change, so each is made once here (13.7 -> 5.6 CPU-s for the tokenizer and the model,
    the same weights bit for bit).  transformers' own loading and arithmetic are untouched: the reference stays
    independent of labsupport.pretrained."""
    import os

    gguf = pytest.importorskip("gguf")
    readers, maps = {}, {}
    read, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = read(path, mode)
        return readers[key]

    def tensor_name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    with pytest.MonkeyPatch.context() as patch:  # transformers imports both from gguf at each load
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", tensor_name_map)
        yield


@pytest.fixture
def fails():
    """`with fails("too low"): check(...)`: the block must print one ❌ line (check() never raises for
    an answer) whose text matches the pattern; the context's value collects everything it printed."""

    @contextlib.contextmanager
    def expect(match: str = ""):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            yield out
        text = out.getvalue()
        assert text.startswith("❌ Checkoff "), text
        assert "Hint: " in text.splitlines()[0], text
        assert re.search(match, text), f"{match!r} not in {text!r}"

    return expect


def _traces_line() -> str:
    """One line: whether the real traces are here, and what the tests compare without them."""
    from labsupport import workloads

    missing = [name for name in workloads.TRACES if workloads.find_trace(name) is None]
    if not missing:
        return "traces: the real traces are present; every stored notebook output is compared"
    why = (f"hidden by ${workloads.HIDE_TRACES_ENV}" if workloads.traces_hidden()
           else "not in $LABSUPPORT_DATA, data/ or ../shared/traces/")
    return (f"traces: {len(missing)} of {len(workloads.TRACES)} {why}, so the labs run on labelled stand-ins and the "
            f"outputs of cells tagged needs-traces are not compared (`{workloads.FETCH_COMMAND}` fetches them)")


def pytest_report_header(config):
    return _traces_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "traces are present" not in (line := _traces_line()):
        terminalreporter.write_line(line)


_RUN_ALL: dict = {}


@pytest.fixture(scope="session")
def run_all():
    """`run_all(path)`: a student copy executed top to bottom in a fresh kernel, as Run All does (stopping at the
    first error), with every exercise unfinished; each copy runs once a session, whichever test asks first."""
    import time

    from labsupport.course import build

    def execute(path):
        if path not in _RUN_ALL:
            import nbformat

            start = time.perf_counter()
            nb = nbformat.read(path, as_version=4)
            _RUN_ALL[path] = build.execute(nb, path.parent, progress=False, allow_errors=False, label=path.name)
            print(f"{path.name}: Run All reached its last cell in {time.perf_counter() - start:.1f} s")
        return _RUN_ALL[path]

    return execute
