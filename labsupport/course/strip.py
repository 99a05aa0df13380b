"""labsupport's source with a checkoff's forbidden names cut out (the copy `grade`'s worker imports).

A checkoff forbids library names whose use would hand over the answer (``labsupport.ledger.
naive_utilization``, ``labsupport.contiguous.ContiguousAllocator.stats``, the package
``labsupport.course``).  The worker's private labsupport is written without them: the ``def`` or
``class`` is gone from the module text, a method from its class, the name from every ``from ...
import`` that re-exports it and from ``__all__``.  Whatever module-level code needed a removed
name at import goes too (``specs.LECTURE_7B`` without ``ModelSpec``), and so on until nothing
left needs one.  A forbidden package is not in the copy at all.  The originals are never
imported: there is nothing to reach, by ``getattr``, ``exec`` of the file, or a frame walk.

Each module that lost a name gets a ``__getattr__`` that reports an attempt to use it (an audit
event, "labsupport.removed") before failing as any missing name fails.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping

PACKAGE = "labsupport"
ALWAYS_ABSENT = ("labsupport.course",)  # the graders and the grader's own tooling: never in a student's copy
AUDIT_EVENT = "labsupport.removed"


def module_name(rel: str) -> str | None:
    """'viz/slo.py' -> 'labsupport.viz.slo' ('__init__.py' names its package); None for a data file."""
    if not rel.endswith(".py"):
        return None
    parts = [PACKAGE, *rel[:-3].split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=256)
def _parse(text: str, rel: str) -> ast.Module:
    return ast.parse(text, filename=rel)  # read, never changed: one parse serves every strip of a run


def _under(name: str, prefixes: Iterable[str]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


class _Module:
    def __init__(self, name: str, rel: str, text: str):
        self.name, self.rel, self.text = name, rel, text
        self.tree = _parse(text, rel)
        self.package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
        self.lazy_annotations = any(isinstance(s, ast.ImportFrom) and s.module == "__future__"
                                    and any(a.name == "annotations" for a in s.names) for s in self.tree.body)
        self.removed: dict[str, str] = {}  # top-level name -> the forbidden name it went with
        self.methods: dict[str, dict[str, str]] = {}  # class -> {method: forbidden name}
        self.defs = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

        self.others: dict[str, _Module] = {}  # every module of the copy, by name (set by strip)

    def needs(self, node: ast.AST) -> str | None:
        """The forbidden name behind a removed name that running `node` at import may load (through the module's
        own functions it refers to, and attributes of other labsupport modules), or None."""
        names = set(_import_time_names(node, self.lazy_annotations))
        for name in [n for n in names if n in self.defs]:
            names |= self.reach(name)
        for name in sorted(names):  # the same cause named every run
            if name in self.removed:
                return self.removed[name]
            head, _, attr = name.partition(".")
            target = self.others.get(self.aliases.get(head, "")) if attr else None
            if target is not None and attr in target.removed:
                return target.removed[attr]
        return None

    def reach(self, name: str) -> frozenset[str]:
        """Every name the module's function `name` may load when called, through the module's functions it calls."""
        node = self.defs[name]
        if not hasattr(node, "_reach"):
            found, todo = set(), [name]
            while todo:
                for n in _names_in(self.defs[todo.pop()]):
                    if n not in found:
                        found.add(n)
                        if n in self.defs:
                            todo.append(n)
            node._reach = frozenset(found)
        return node._reach

    @functools.cached_property
    def aliases(self) -> dict[str, str]:
        """What the names this module imports at the top are, in full (``ledger`` -> ``labsupport.ledger``)."""
        out = {}
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    out[a.asname or a.name] = f"{self.absolute(node)}.{a.name}"
            elif isinstance(node, ast.Import):
                out.update({a.asname: a.name for a in node.names if a.asname})
        return out

    def absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
        return ".".join([*base, node.module] if node.module else base)


def strip(files: Mapping[str, bytes], forbidden: Iterable[str]) -> tuple[dict[str, bytes], dict[str, str]]:
    """(labsupport's files without the forbidden names, {each removed dotted name: the forbidden name behind it}).

    `files` maps paths inside the package ('ledger.py', 'viz/slo.py', 'viz/board_data.json') to their bytes.
    """
    forbidden = list(dict.fromkeys(forbidden))
    names = {rel: module_name(rel) for rel in files}
    present = {n for n in names.values() if n}
    absent = tuple(p for p in (*ALWAYS_ABSENT, *forbidden) if any(m == p or m.startswith(p + ".") for m in present)
                   and p.count(".") >= 1)
    modules = {n: _Module(n, rel, files[rel].decode("utf-8")) for rel, n in names.items()
               if n and not _under(n, absent)}
    for module in modules.values():
        module.others = modules
    for name in forbidden:
        owner = max((m for m in modules if name.startswith(m + ".")), key=len, default=None)
        rest = name[len(owner) + 1:].split(".") if owner else []
        if len(rest) == 1:
            modules[owner].removed[rest[0]] = name
        elif len(rest) == 2:
            modules[owner].methods.setdefault(rest[0], {})[rest[1]] = name
    while _cascade(modules, absent):
        pass
    out: dict[str, bytes] = {}
    removed = {p: p for p in absent}
    for rel, data in files.items():
        folder = PACKAGE + "".join("." + part for part in rel.split("/")[:-1])
        if _under(names[rel] or folder, absent):
            continue
        module = modules.get(names[rel])
        if module is not None:
            data = _rewrite(module).encode("utf-8")
            removed.update({f"{module.name}.{k}": v for k, v in module.removed.items() if "." not in k})
            removed.update({f"{module.name}.{c}.{m}": v for c, ms in module.methods.items() for m, v in ms.items()})
        out[rel] = data
    return out, removed


# --- what a statement needs while its module is imported ----------------------------------------------------

def _import_time_names(node: ast.AST, lazy_annotations: bool) -> frozenset[str]:
    """Names a top-level statement loads when it runs (function bodies run later, and are left out)."""
    if not hasattr(node, "_import_time_names"):
        node._import_time_names = frozenset(_find_import_time_names(node, lazy_annotations))
    return node._import_time_names


def _find_import_time_names(node: ast.AST, lazy_annotations: bool) -> set[str]:
    found: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                visit(d)
            for d in (*n.args.defaults, *n.args.kw_defaults):
                if d is not None:
                    visit(d)
            if not lazy_annotations:
                for a in (*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs, n.args.vararg, n.args.kwarg):
                    if a is not None and a.annotation is not None:
                        visit(a.annotation)
                if n.returns is not None:
                    visit(n.returns)
            return
        if isinstance(n, ast.Lambda):
            for d in (*n.args.defaults, *n.args.kw_defaults):
                if d is not None:
                    visit(d)
            return
        if isinstance(n, ast.AnnAssign) and lazy_annotations:
            visit(n.target)
            if n.value is not None:
                visit(n.value)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            found.add(f"{n.value.id}.{n.attr}")
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return found


def _names_in(node: ast.AST) -> frozenset[str]:
    if not hasattr(node, "_names_in"):  # the trees are parsed once a run (_parse): so is this
        node._names_in = frozenset(n.id if isinstance(n, ast.Name) else f"{n.value.id}.{n.attr}" for n in ast.walk(node)
                                   if isinstance(n, ast.Name) or isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name))
    return node._names_in


def _bound_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    bound = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
    return bound


def _statements(body: list[ast.stmt], module: _Module):
    """Top-level statements, inside module-level if/try blocks too (they may hold defs) unless the head needs a
    removed name (then the whole block is one statement)."""
    for node in body:
        if _compound(node) and not module.needs(_head(node)):
            for block in _blocks(node):
                yield from _statements(block, module)
        else:
            yield node


def _alias_cause(module: _Module, modules: dict[str, _Module], node, alias, absent) -> str | None:
    """The forbidden name behind an imported alias that no longer exists, or None."""
    if isinstance(node, ast.Import):
        return _under(alias.name, absent)
    source = module.absolute(node)
    cause = _under(f"{source}.{alias.name}", absent)
    if cause:
        return cause
    return modules[source].removed.get(alias.name) if source in modules else None


def _cascade(modules: dict[str, _Module], absent) -> bool:
    """Remove one more round of names that need removed ones; True if anything changed."""
    changed = False
    for module in modules.values():
        for node in _statements(module.tree.body, module):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bound = _alias_bound(node, alias)
                    cause = bound and bound not in module.removed and _alias_cause(module, modules, node, alias, absent)
                    if cause:
                        module.removed[bound] = cause
                        changed = True
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in module.removed:
                continue
            cause = module.needs(node)
            if cause:
                for name in _bound_names(node) - set(module.removed):
                    module.removed[name] = cause
                    changed = True
    return changed


# --- writing the text --------------------------------------------------------------------------------------

def _rewrite(module: _Module) -> str:
    if not module.removed and not module.methods:
        return module.text
    data = module.text.encode("utf-8")  # ast's columns count UTF-8 bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    removed = set(module.removed)

    def span(node: ast.stmt) -> tuple[int, int]:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return starts[first - 1], starts[node.end_lineno - 1] + node.end_col_offset

    def edit(body: list[ast.stmt]) -> None:
        kept = 0
        for node in body:
            start, end = span(node)
            if _compound(node) and not module.needs(_head(node)):
                for block in _blocks(node):
                    edit(block)
                kept += 1
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a for a in node.names if _alias_bound(node, a) not in removed]
                if names != node.names:
                    edits.append((start, end, ast.unparse(_with_names(node, names)) if names else ""))
                kept += bool(names)
            elif _bound_names(node) & removed or module.needs(node):
                edits.append((start, end, ""))
            else:
                if _is_all(node):
                    elts = [e for e in node.value.elts if not (isinstance(e, ast.Constant) and e.value in removed)]
                    edits.append((start, end, f"__all__ = {ast.unparse(ast.List(elts=elts, ctx=ast.Load()))}"))
                if isinstance(node, ast.ClassDef) and node.name in module.methods:
                    _drop_methods(node, f"{module.name}.{node.name}", module.methods[node.name], span, edits)
                kept += 1
        if not kept and body:
            start, _ = span(body[0])
            edits.append((start, start, " " * body[0].col_offset + "pass  # all of this needed what the exercise forbids\n"))

    edit(module.tree.body)
    for start, end, new in sorted(edits, reverse=True):
        data = data[:start] + new.encode("utf-8") + data[end:]
    out = data.decode("utf-8")
    gone = {n: f"{module.name}.{n}" for n in sorted(removed) if not n.startswith("__") and "." not in n}
    if gone and not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in module.tree.body):
        out += _MODULE_GETATTR.format(names=gone, event=AUDIT_EVENT)
    return out


def _compound(node: ast.stmt) -> bool:
    return isinstance(node, (ast.If, ast.Try))


def _head(node: ast.stmt) -> ast.AST:
    """What a module-level if/try evaluates itself (not its blocks): the test, the handlers' types."""
    if isinstance(node, ast.If):
        return node.test
    return ast.Tuple(elts=[h.type for h in node.handlers if h.type is not None], ctx=ast.Load())


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(node, ast.If):
        return [b for b in (node.body, node.orelse) if b]
    return [b for b in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody) if b]


def _alias_bound(node, alias) -> str:
    """The name an import binds (`import a.b` binds `a`, but is known here by its whole dotted name)."""
    return alias.asname or alias.name


def _with_names(node, names):
    if isinstance(node, ast.Import):
        return ast.Import(names=names)
    return ast.ImportFrom(module=node.module, names=names, level=node.level)


def _is_all(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)))


def _drop_methods(node: ast.ClassDef, dotted: str, methods: dict[str, str], span, edits: list) -> None:
    for n in node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in methods:
            edits.append((*span(n), ""))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in node.body):
        indent = " " * node.body[0].col_offset
        hook = _CLASS_GETATTR.format(names={m: f"{dotted}.{m}" for m in methods}, event=AUDIT_EVENT)
        end = span(node)[1]
        edits.append((end, end, "\n\n" + "\n".join(indent + line if line else "" for line in hook.splitlines())))


_MODULE_GETATTR = '''

def __getattr__(name):  # written by the grader: this copy of labsupport lacks what the exercise forbids
    if name in {names!r}:
        __import__("sys").audit("{event}", {names!r}[name])
    raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
'''

_CLASS_GETATTR = '''def __getattr__(self, name):  # written by the grader: the exercise forbids these methods
    if name in {names!r}:
        __import__("sys").audit("{event}", {names!r}[name])
    raise AttributeError(f"{{type(self).__name__!r}} object has no attribute {{name!r}}")'''
