"""No import circles in labsupport: every import counts, at the top of a module, inside a function, or
under `if TYPE_CHECKING:` (a circle hidden in a function is still a circle for the reader)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "labsupport"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module and package of the tree rooted at `root`."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that `name` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from a.b import c` imports a.b.c when c is a module, else a name of a.b
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name: the nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    names = module_names(root)
    return {name: imports_of(name, path, set(names)) for name, path in names.items()}


def test_the_checker_finds_circles_of_every_kind(tmp_path):
    """A function-level import, a TYPE_CHECKING one and a relative one each close a circle here."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import d\n")
    (pkg / "sub" / "d.py").write_text("from .. import c\n")
    (pkg / "sub" / "e.py").write_text("from . import d\nimport pkg.a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]


def test_labsupport_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 40 and "labsupport.course.judge" in graph["labsupport.course.grade"]
    assert "labsupport.course.judge" in graph["labsupport.course.harness"]
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" <-> ".join(group) for group in found)


def test_layers_by_role():
    """The course tooling grades with the mechanisms, never with the figures; benchmarks measure the
    mechanisms, not a command; mechanisms import neither; one class is named Replay."""
    graph = import_graph(PACKAGE)
    role = lambda name: name.split(".")[1] if name.count(".") >= 1 else ""
    offences = [(a, b) for a, targets in graph.items() for b in targets
                if (role(a) == "course" and role(b) == "viz")
                or (role(a) == "bench" and b == "labsupport.cli.simulate")
                or (a.count(".") == 1 and role(a) not in ("viz", "course", "bench", "cli", "__main__")
                    and role(b) in ("viz", "course", "bench"))]
    assert offences == [], offences
    replays = [path for path in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ClassDef) and node.name == "Replay"]
    assert [p.relative_to(PACKAGE).as_posix() for p in replays] == ["measure/replay.py"]


# The house's floors, lowest first: the mechanisms and their measurements at the top of the package, the labs' UI
# (viz), the commands and their parser (cli), the course tooling (course: build, check, grade) and the benchmarks
# (bench).  A module imports its own floor and the floors below; `labsupport.__main__` is the front door.
FLOORS = ("top", "measure", "viz", "cli", "course", "bench")


def _floor(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "top"


def upward_imports(root: Path) -> list[str]:
    """`module -> target` for each import of a floor above the module's own (the front door aside)."""
    return [f"{name} -> {target}" for name, targets in import_graph(root).items() if name != "labsupport.__main__"
            for target in sorted(targets) if FLOORS.index(_floor(target)) > FLOORS.index(_floor(name))]


def test_no_module_imports_a_floor_above_its_own():
    upward = upward_imports(PACKAGE)
    assert not upward, upward


def test_the_floor_check_sees_an_upward_import(tmp_path):
    """The check above can fail: a mechanism that imports the labs' UI is caught, and the UI importing a mechanism
    is not."""
    pkg = tmp_path / "labsupport"
    (pkg / "viz").mkdir(parents=True)
    for rel, text in (("__init__.py", ""), ("viz/__init__.py", ""), ("ledger.py", ""),
                      ("kvcache.py", "from labsupport.viz import panel\n"),
                      ("viz/panel.py", "from labsupport import ledger\n")):
        (pkg / rel).write_text(text)
    assert upward_imports(pkg) == ["labsupport.kvcache -> labsupport.viz.panel"]


def test_the_readers_map_matches_the_folders():
    """labsupport/README.md names every mechanism at the top of the package and every measurement in measure/, each
    where it is, and no file that is not there (issue 37: the map matches the folders)."""
    text = (PACKAGE / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:measure/)?[a-z_0-9]+\.py)`", text))
    present = {p.relative_to(PACKAGE).as_posix() for p in [*PACKAGE.glob("*.py"), *PACKAGE.glob("measure/*.py")]
               if p.name not in ("__init__.py", "__main__.py")}
    assert sorted(named - present) == [], "the map names files that are not there"
    assert sorted(present - named) == [], "files the map does not name"
    for role in ("viz", "course", "bench", "cli", "measure"):
        assert (PACKAGE / role / "__init__.py").is_file() and f"`{role}/`" in text, role
