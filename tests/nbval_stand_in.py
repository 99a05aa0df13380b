"""A pytest plugin for strict nbval on a machine without the real traces (``-p nbval_stand_in``).

The solutions' stored outputs were made with the real Azure and Mooncake traces.  Without them
the labs run on labelled synthetic stand-ins, so the cells whose output comes from a trace (the
lab sources tag them ``needs-traces``) are still run, and must not raise, but their outputs are
not compared, as nbval's own ``nbval-ignore-output`` tag would have it.  Every other cell is
compared as strictly as ever.  The last line of the run says how many cells were spared.
"""
from __future__ import annotations

TAG = "needs-traces"
SPARED = []


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        cell = getattr(item, "cell", None)  # an nbval IPyNbCell
        if cell is not None and TAG in cell.metadata.get("tags", []):
            item.options["check"] = False
            SPARED.append(item.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(f"nbval_stand_in: {len(SPARED)} cell(s) tagged {TAG} ran without their outputs "
                                f"compared (the real traces are missing)")
