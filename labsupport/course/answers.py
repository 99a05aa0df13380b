"""A student's notebook as the grader reads it: its code, its check() calls, and each answer's program.

Nothing here runs the student's code.  `read` turns the file into code cells (IPython's syntax
made plain Python) and finds every ``check("N.M", answer)`` call, whatever ``check`` is bound to
in the notebook: the call site is the hand-in.  For each answer, `program` cuts the notebook's
code down to what that answer depends on, the statements before it that bind (or mutate) the
names it reads, transitively; that cut is

  * the program a function answer is rebuilt from in the grader's worker (labsupport.course.worker),
    so a function is graded on the source the notebook shows, not on an object its kernel made;
  * what `inspect` reads for "derive, don't call": a reference to a name the checkoff forbids
    (through imports, aliases, attribute chains and ``getattr`` with a constant), or a construct
    that hides which code runs (exec, eval, importlib, sys.modules, ``__dict__``, subprocess,
    reading files, ...), fails the answer with a hint saying what to derive instead.
"""
from __future__ import annotations

import ast
import builtins
import copy
import json
import re
import symtable
import sys
from dataclasses import dataclass, field
from pathlib import Path

ID_RE = re.compile(r"^\d+\.\d+$")
MAX_NOTEBOOK_BYTES = 64 * 2**20
LAB_NAME_RE = re.compile(r"^(\d\d)_")

# Names IPython puts in every kernel's namespace.
IPYTHON_NAMES = frozenset({"In", "Out", "_", "__", "___", "_i", "_ii", "_iii", "_ih", "_oh", "_dh", "get_ipython",
                           "exit", "quit", "display"})
KNOWN_NAMES = frozenset(dir(builtins)) | IPYTHON_NAMES | {"__name__", "__file__", "__builtins__", "__doc__"}

# Constructs that decide at run time which code runs or which object is reached: the grader could
# not tell what such an answer calls, so an answer that needs one is not accepted as derived.
DYNAMIC_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "breakpoint",
                              "open", "memoryview"})
DYNAMIC_ATTRIBUTES = frozenset({
    "__dict__", "__globals__", "__builtins__", "__code__", "__closure__", "__getattribute__", "__subclasses__",
    "__bases__", "__base__", "__mro__", "__import__", "__loader__", "__spec__", "__self__", "__func__",
    "__wrapped__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__defaults__", "__kwdefaults__",
    "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "cr_frame", "tb_frame", "tb_next",
    "read_text", "read_bytes",
})
DYNAMIC_MODULES = ("importlib", "imp", "runpy", "inspect", "ctypes", "gc", "pickle", "marshal", "shelve", "dill",
                   "cloudpickle", "builtins", "subprocess", "multiprocessing", "concurrent", "pty", "socket", "urllib",
                   "http", "requests", "io", "codecs", "linecache", "code", "codeop", "pkgutil", "zipimport", "site",
                   "threading", "_thread", "types", "operator.attrgetter", "operator.methodcaller",
                   "sys.modules", "sys.path", "sys.meta_path", "sys.path_hooks", "sys._getframe", "sys.settrace",
                   "sys.setprofile", "sys.addaudithook", "os.system", "os.popen", "os.fork", "os.spawnv", "os.execv",
                   "os.execl", "os.posix_spawn", "torch.load", "numpy.load", "json.load")


# Builtins that never change the objects handed to them (a call to anything else might).
PURE_BUILTINS = frozenset({"print", "display", "len", "repr", "str", "int", "float", "bool", "abs", "round", "min",
                           "max", "sum", "sorted", "isinstance", "type", "format", "list", "tuple", "set", "dict",
                           "range", "enumerate", "zip", "any", "all", "hash", "id"})


class NotebookError(ValueError):
    """The file cannot be graded as a notebook; the message is one line saying why."""


@dataclass
class CodeCell:
    number: int  # 1-based position among all the notebook's cells
    source: str  # as written
    python: str  # after IPython's transforms (magics become get_ipython() calls)
    tree: ast.Module | None  # None when the cell does not parse
    tags: tuple[str, ...] = ()  # the cell's metadata tags ("givens" marks the lab's givens cell)


@dataclass
class CheckCall:
    checkoff_id: str
    cell: CodeCell
    statement: int  # index of the cell's top-level statement holding the call
    expr: ast.expr  # the answer expression
    line: int
    column: int = 0
    index: int = 0  # its place among the notebook's calls for this checkoff


@dataclass
class Notebook:
    path: Path
    cells: list[CodeCell]
    calls: dict[str, list[CheckCall]] = field(default_factory=dict)

    def lab(self) -> int:
        """The lab, from the file name (NN_topic.ipynb) or, failing that, from its check() ids."""
        match = LAB_NAME_RE.match(self.path.name)
        if match:
            return int(match[1])
        labs = {int(i.split(".")[0]) for i in self.calls}
        if len(labs) == 1:
            return labs.pop()
        raise NotebookError("cannot tell which lab this is (name it NN_topic.ipynb)")


@dataclass
class Program:
    """What one answer depends on: statements in notebook order, and the answer expression.

    When the check() call sits inside a compound statement (a loop, ``with``, ``try``, ``if``,
    ``match``), that whole statement is `holder`: it runs with the call swapped for a capture, and
    the answer is the value the last capture saw, as the kernel's check() did.
    """

    statements: list[tuple[CodeCell, ast.stmt]]
    expr: ast.expr
    call: CheckCall
    unresolved: set[str]
    holder: ast.stmt | None = None

    def source(self, answer_name: str = "__answer__") -> str:
        parts = []
        for cell, stmt in self.statements:
            parts.append(f"# cell {cell.number}\n{_statement_text(cell, stmt)}")
        head = f"# cell {self.call.cell.number}: the answer handed to check({self.call.checkoff_id!r}, ...)\n"
        if self.holder is None:
            parts.append(f"{head}{answer_name} = {ast.unparse(self.expr)}")
        else:
            parts.append(f"{head}{CAPTURED} = []\n{ast.unparse(self.holder)}\n"
                         f"if not {CAPTURED}:\n    raise LookupError('re-run, your code never reached this check() call')\n"
                         f"{answer_name} = {CAPTURED}[-1]")
        return "\n\n".join(parts) + "\n"

    def function_source(self) -> str:
        """The text of the definition the answer names (for reading an unfinished exercise)."""
        if isinstance(self.expr, ast.Name):
            for cell, stmt in reversed(self.statements):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == self.expr.id:
                    return _statement_text(cell, stmt)
        return ast.unparse(self.expr)


CAPTURED = "__labsupport_captured__"


def _holding(call: CheckCall) -> ast.stmt | None:
    """The call's top-level statement with the call capturing its answer, or None if the statement is the call."""
    stmt = call.cell.tree.body[call.statement]
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
            (stmt.value.lineno, stmt.value.col_offset) == (call.line, call.column):
        return None

    class Capture(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            if not _is_check(node):
                return node
            if (node.lineno, node.col_offset) == (call.line, call.column):
                grab = ast.Attribute(ast.Name(CAPTURED, ast.Load()), "append", ast.Load())
                return ast.copy_location(ast.Call(grab, [_answer_expr(node)], []), node)
            return ast.copy_location(ast.Constant(None), node)  # another checkoff's hand-in plays no part

    tree = Capture().visit(copy.deepcopy(stmt))
    return ast.fix_missing_locations(tree)


# --- reading ------------------------------------------------------------------------------------

def _text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    kind = "a number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__
    raise NotebookError(f"{where} is {kind}, not text")


def read(path: str | Path, data: bytes | None = None) -> Notebook:
    """Parse a notebook file without running anything; raises NotebookError (one line)."""
    path = Path(path)
    if data is None:
        try:
            size = path.stat().st_size
            if size > MAX_NOTEBOOK_BYTES:
                raise NotebookError(f"{size:,} bytes is over the {MAX_NOTEBOOK_BYTES:,}-byte limit for a notebook")
            data = path.read_bytes()
        except OSError as exc:
            raise NotebookError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotebookError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        raw = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except RecursionError:
        raise NotebookError("not a notebook: its JSON is nested too deeply") from None
    except ValueError as exc:
        raise NotebookError(f"not a notebook: not JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(raw, dict):
        raise NotebookError(f"not a notebook: its JSON is {'a list' if isinstance(raw, list) else type(raw).__name__}, "
                            "not an object with cells")
    if "cells" not in raw and "worksheets" in raw:
        raw = _upgrade(text)
    cells = raw.get("cells")
    if not isinstance(cells, list):
        raise NotebookError("not a notebook: it has no list of cells")
    code = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict):
            raise NotebookError(f"cell {number} is {type(cell).__name__}, not a cell")
        kind = cell.get("cell_type")
        if not isinstance(kind, str):
            raise NotebookError(f"cell {number} has no cell_type")
        source = _text(cell.get("source", ""), f"cell {number}'s source")
        if kind == "code":
            python = _python(source)
            tags = (cell.get("metadata") or {}).get("tags") if isinstance(cell.get("metadata"), dict) else None
            tags = tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()
            code.append(CodeCell(number, source, python, _parse(python), tags))
    nb = Notebook(path, code)
    for cell in code:
        for call in _check_calls(cell):
            call.index = len(nb.calls.setdefault(call.checkoff_id, []))
            nb.calls[call.checkoff_id].append(call)
    return nb


def _upgrade(text: str) -> dict:
    try:
        import nbformat

        return json.loads(nbformat.writes(nbformat.reads(text, as_version=4)))
    except Exception as exc:  # noqa: BLE001 - any failure is "not a notebook we can read"
        raise NotebookError(f"not a notebook nbformat can upgrade ({type(exc).__name__})") from None


def _python(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - leave it as written; it will not parse either
        return source


def _parse(python: str) -> ast.Module | None:
    try:
        return compile(python, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                       dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _is_check(node: ast.AST) -> str | None:
    """The checkoff id of a ``check("N.M", answer)`` call (any callee spelled check or x.check)."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    named = (isinstance(func, ast.Name) and func.id == "check") or (isinstance(func, ast.Attribute) and func.attr == "check")
    if not named or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and ID_RE.match(first.value.strip()):
        if len(node.args) >= 2 or any(k.arg == "answer" for k in node.keywords):
            return first.value.strip()
    return None


def _answer_expr(node: ast.Call) -> ast.expr:
    if len(node.args) >= 2:
        return node.args[1]
    return next(k.value for k in node.keywords if k.arg == "answer")


def _check_calls(cell: CodeCell) -> list[CheckCall]:
    if cell.tree is None:
        return []
    calls = []
    for index, stmt in enumerate(cell.tree.body):
        for node in ast.walk(stmt):
            checkoff_id = _is_check(node)
            if checkoff_id:
                calls.append(CheckCall(checkoff_id, cell, index, _answer_expr(node), node.lineno, node.col_offset))
    calls.sort(key=lambda c: (c.line, c.column))
    return calls


def collecting_source(nb: Notebook, cell: CodeCell, collector: str) -> str:
    """The cell's code with every check("N.M", answer) call replaced by ``collector("N.M", answer, k)``.

    The kernel then hands the grader each answer where the student's check() would have run (k
    says which of the notebook's calls for N.M it was); what `check` is bound to in the notebook
    (a forgery of it, say) no longer matters.
    """
    if cell.tree is None:
        return cell.source
    where = {(c.line, c.column): c.index for calls in nb.calls.values() for c in calls if c.cell is cell}
    if not where:
        return cell.source

    class Swap(ast.NodeTransformer):
        def visit_Call(self, node):
            key = (node.lineno, node.col_offset)
            self.generic_visit(node)
            checkoff_id = _is_check(node)
            if not checkoff_id:
                return node
            new = ast.Call(ast.Name(collector, ast.Load()),
                           [ast.Constant(checkoff_id), _answer_expr(node), ast.Constant(where.get(key, 0))], [])
            return ast.copy_location(new, node)

    tree = Swap().visit(copy.deepcopy(cell.tree))
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


# --- cutting a program ---------------------------------------------------------------------------

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _import_bindings(stmt) -> set[str]:
    names = set()
    for alias in stmt.names:
        if alias.name == "*":
            continue
        if isinstance(stmt, ast.Import) and alias.asname is None:
            names.add(alias.name.split(".")[0])
        else:
            names.add(alias.asname or alias.name)
    return names


def _target_names(target) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _base_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _walk_scope(node):
    """Nodes of this scope: not inside nested functions, lambdas or classes (comprehensions included,
    for the walrus binds in the enclosing scope)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, _SCOPES):
            stack.extend(ast.iter_child_nodes(child))


def bindings(stmt: ast.stmt) -> tuple[set[str], set[str], set[str]]:
    """(names the statement may bind, names it certainly rebinds, names whose objects it may change)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        declared = {n for node in ast.walk(stmt) if isinstance(node, ast.Global) for n in node.names}
        return {stmt.name} | declared, {stmt.name}, set()
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        names = _import_bindings(stmt)
        return names, names, set()
    if isinstance(stmt, ast.Assign) and not any(isinstance(n, ast.NamedExpr) for n in ast.walk(stmt.value)):
        bound = set().union(*(_target_names(t) for t in stmt.targets))
        changed = {_base_name(t) for t in stmt.targets if isinstance(t, (ast.Attribute, ast.Subscript))} - {None}
        changed |= {_base_name(e) for t in stmt.targets if isinstance(t, (ast.Tuple, ast.List))
                    for e in t.elts if isinstance(e, (ast.Attribute, ast.Subscript))} - {None}
        return bound, set(bound), changed
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return {stmt.target.id}, {stmt.target.id}, set()
    bound, changed = set(), set()
    for node in [stmt, *_walk_scope(stmt)]:
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not stmt:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= _import_bindings(node)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.NamedExpr):
            bound |= _target_names(node.target)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not _is_check(node.value):
            call = node.value  # a call made for its effect may change what it is handed, or its object
            if not (isinstance(call.func, ast.Name) and call.func.id in PURE_BUILTINS):
                changed |= {a.id for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name)}
            if isinstance(call.func, ast.Attribute):
                changed.add(_base_name(call.func.value))
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            changed.add(_base_name(node))
    return bound, set(), changed - {None}


def _star_import(stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names)


def free_names(node: ast.AST) -> set[str]:
    """Module-level names `node` reads (its functions' globals included)."""
    tree = ast.Module([node], []) if isinstance(node, ast.stmt) else ast.Module([ast.Expr(node)], [])
    try:
        table = symtable.symtable(ast.unparse(tree), "<answer>", "exec")
    except (SyntaxError, ValueError, RecursionError):
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return _table_globals(table)


def _table_globals(table) -> set[str]:
    names = set()
    top = table.get_type() == "module"
    for sym in table.get_symbols():
        if sym.is_referenced() and (top or sym.is_global()):
            names.add(sym.get_name())
    for child in table.get_children():
        names |= _table_globals(child)
    return names


def program(nb: Notebook, call: CheckCall, givens: frozenset[str] = frozenset()) -> Program:
    """The statements before `call` that its answer depends on, in notebook order.

    `givens` are names the grader binds itself: their assignments in the cell tagged ``givens``
    are left out (the grader puts the values it grades on in their place).  A statement that calls
    a function the notebook defines may change whatever that function reads; it is kept when one
    of those names is needed.
    """
    statements: list[tuple[CodeCell, ast.stmt]] = []
    for cell in nb.cells:
        if cell.number >= call.cell.number:
            break
        if cell.tree is not None:
            statements += [(cell, s) for s in cell.tree.body]
    if call.cell.tree is not None:
        statements += [(call.cell, s) for s in call.cell.tree.body[:call.statement]]
    holder = _holding(call) if call.cell.tree is not None else None
    if holder is None:
        needed = free_names(call.expr)
    else:  # what the statement binds itself needs no earlier cell, unless an earlier cell binds it too
        earlier = set().union(*(bindings(stmt)[0] for _, stmt in statements))
        needed = free_names(holder) - {CAPTURED} - (bindings(holder)[0] - earlier)
    reads_of = {stmt.name: _may_change(stmt) for _, stmt in statements
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))}
    frozen = _immutable_names(statements, givens)
    chosen, maybe_bound = [], set()
    for cell, stmt in reversed(statements):
        if not needed:
            break
        bound, definite, changed = bindings(stmt)
        if "givens" in cell.tags and _assigns_only(stmt, givens):
            needed -= bound
            continue
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            for node in _walk_scope(stmt):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in reads_of:
                    changed |= reads_of[node.func.id]
        changed -= frozen
        if _star_import(stmt) or (bound | changed) & needed:
            chosen.append((cell, stmt))
            maybe_bound |= bound
            reads = free_names(stmt) - _bound_before_read(stmt)
            needed = (needed - (definite - reads)) | reads
    chosen.reverse()
    # a name a kept loop, `with`, `try` or `match` may bind is left to the re-run to find bound or not
    return Program(chosen, call.expr, call, {n for n in needed if n not in KNOWN_NAMES | givens | maybe_bound}, holder)


def _may_change(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Module-level names whose objects the function's body may change (stores into them, calls on them)."""
    changed = set()
    for stmt in fn.body:
        changed |= bindings(stmt)[2]
    return changed & free_names(fn)


def _immutable_names(statements, givens: frozenset[str]) -> set[str]:
    """Names only ever bound to numbers, strings, functions, classes or modules.

    A call handed such a name cannot change the number (it can only rebind a name of its own), and
    a function, class or module changed through a call is a patch the re-run simply lacks."""
    frozen, spoiled = set(givens), set()

    def plain(e) -> bool:
        if isinstance(e, ast.Constant):
            return isinstance(e.value, (int, float, str)) or e.value is None
        if isinstance(e, ast.BinOp):
            return plain(e.left) and plain(e.right)
        if isinstance(e, ast.UnaryOp):
            return plain(e.operand)
        if isinstance(e, ast.Name):
            return e.id in frozen and e.id not in spoiled
        return False

    for _, stmt in statements:
        bound, _, _ = bindings(stmt)
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) and plain(stmt.value):
            frozen |= bound
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            frozen |= bindings(stmt)[1]
        else:
            spoiled |= bound
    return frozen - spoiled


def _bound_before_read(stmt: ast.stmt) -> set[str]:
    """Names a compound statement binds before its body reads them: loop targets, ``as`` names, match captures."""
    names = set()
    for node in [stmt, *_walk_scope(stmt)]:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            names |= _target_names(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            names |= _target_names(node.optional_vars)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
    return names


def _assigns_only(stmt: ast.stmt, names: frozenset[str]) -> bool:
    """A plain ``NAME = value`` (or ``A, B = ...``) binding nothing but `names`."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [stmt.target]
    else:
        return False
    bound = set().union(*(_target_names(t) for t in targets))
    plain = all(isinstance(n, ast.Name) for t in targets for n in ast.walk(t) if not isinstance(n, (ast.Tuple, ast.List, ast.expr_context)))
    return bool(bound) and plain and bound <= names


def _statement_text(cell: CodeCell, stmt: ast.stmt) -> str:
    """The statement as written (decorators included), or unparsed when it shares a line with another."""
    start = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    end = stmt.end_lineno or stmt.lineno
    siblings = [s for s in cell.tree.body if s is not stmt]
    if any(not ((s.end_lineno or s.lineno) < start or s.lineno > end) for s in siblings):
        return ast.unparse(stmt)
    lines = cell.python.splitlines()[start - 1:end]
    return "\n".join(lines)


# --- derive, don't call ---------------------------------------------------------------------------

def _aliases(nodes: list[ast.AST]) -> tuple[dict[str, str], list[str]]:
    """name -> dotted path of what it was imported (or assigned) as, and the star-imported modules."""
    alias: dict[str, str] = {}
    stars: list[str] = []
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        alias[a.asname] = a.name
                    else:
                        alias[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for a in node.names:
                    if a.name == "*":
                        stars.append(node.module)
                    else:
                        alias[a.asname or a.name] = f"{node.module}.{a.name}"
    for _ in range(6):  # x = ledger; y = x.ridge_batch ...
        grew = False
        for root in nodes:
            for node in ast.walk(root):
                if isinstance(node, (ast.Assign, ast.NamedExpr)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    path = _resolve(node.value, alias, stars)
                    for t in targets:
                        if isinstance(t, ast.Name) and path and alias.get(t.id) != path and t.id not in alias:
                            alias[t.id] = path
                            grew = True
        if not grew:
            break
    return alias, stars


def _resolve(node, alias: dict[str, str], stars: list[str]) -> str | None:
    if isinstance(node, ast.Name):
        return alias.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, alias, stars)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
        arg = node.args[1] if node.func.id == "getattr" and len(node.args) >= 2 else node.args[0]
        constant = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
        if node.func.id == "getattr" and constant:
            base = _resolve(node.args[0], alias, stars)
            return f"{base}.{constant}" if base else None
        if node.func.id == "__import__" and constant:
            return constant.split(".")[0]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = _resolve(node.func, alias, stars)
        if func == "importlib.import_module" and isinstance(node.args[0].value, str):
            return node.args[0].value
    return None


def _installed(top: str) -> bool:
    """True for a module of the environment (stdlib, site-packages); False for a file beside the notebook.

    Looked up on the interpreter's path without the current folder, and never imported."""
    import importlib.machinery
    import os

    if top in sys.builtin_module_names or top in sys.stdlib_module_names or top == "labsupport":
        return True
    here = os.getcwd()
    path = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != here]
    for finder in sys.meta_path:  # PathFinder on the cleaned path; others (an editable install's) as they are
        try:
            if finder is importlib.machinery.PathFinder:
                spec = finder.find_spec(top, path)
            elif hasattr(finder, "find_spec") and type(finder).__module__.startswith(("__editable__", "_distutils_hack")):
                spec = finder.find_spec(top, None)
            else:
                continue
        except (ImportError, ValueError, TypeError):
            continue
        if spec is not None:
            return True
    return False


def _matches(path: str, names) -> str | None:
    for name in names:
        if path == name or path.startswith(name + "."):
            return name
    return None


@dataclass
class Finding:
    """One reason an answer is not accepted as derived."""

    cell: int
    line: int
    what: str  # the name or construct, as the student wrote it
    forbidden: str  # the forbidden name it reaches, or "" for a construct that hides what runs


def inspect(prog: Program, forbidden, *, function_answer: bool = False) -> list[Finding]:
    """Every forbidden name or hiding construct in the program, in notebook order."""
    nodes = [stmt for _, stmt in prog.statements] + [prog.expr]
    cells = [cell for cell, _ in prog.statements] + [prog.call.cell]
    alias, stars = _aliases(nodes)
    findings: list[Finding] = []
    seen = set()

    def add(cell, node, what, name):
        key = (cell.number, getattr(node, "lineno", 0), what)
        if key not in seen:
            seen.add(key)
            findings.append(Finding(cell.number, getattr(node, "lineno", 0), what, name))

    for cell, root in zip(cells, nodes):
        for node in ast.walk(root):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                tops = {(module or "").split(".")[0]} if module else {a.name.split(".")[0] for a in node.names}
                for top in sorted(t for t in tops if t and not _installed(t)):
                    add(cell, node, f"import {top} (a module of its own folder, which the grader does not read)", "")
                for a in node.names:
                    full = a.name if module is None else (module if a.name == "*" else f"{module}.{a.name}")
                    hit = _matches(full, forbidden) or _matches(module or "", forbidden)
                    if hit:
                        add(cell, node, full, hit)
                    elif _matches(full, DYNAMIC_MODULES) or _matches(module or "", DYNAMIC_MODULES):
                        add(cell, node, f"import {full}", "")
            elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
                path = _resolve(node, alias, stars)
                if path is None and isinstance(node, ast.Name):
                    path = next((f"{m}.{node.id}" for m in stars if _matches(f"{m}.{node.id}", forbidden)), None)
                if path:
                    hit = _matches(path, forbidden)
                    if hit:
                        add(cell, node, ast.unparse(node), hit)
                    elif _matches(path, DYNAMIC_MODULES):
                        add(cell, node, ast.unparse(node), "")
                if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS and node.id not in alias:
                    add(cell, node, f"{node.id}()", "")
                if isinstance(node, ast.Attribute) and node.attr in DYNAMIC_ATTRIBUTES:
                    add(cell, node, f".{node.attr}", "")
            if isinstance(node, ast.Call):  # getattr(module, "name"), importlib.import_module("...")
                path = _resolve(node, alias, stars)
                hit = _matches(path, forbidden) if path else None
                if hit:
                    add(cell, node, ast.unparse(node)[:80], hit)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "setattr", "delattr", "hasattr") and node.func.id not in alias:
                name_arg = node.args[1] if len(node.args) >= 2 else None
                if not (isinstance(name_arg, ast.Constant) and isinstance(name_arg.value, str)):
                    target = _resolve(node.args[0], alias, stars) if node.args else None
                    if target is not None or node.func.id != "hasattr":
                        add(cell, node, f"{node.func.id}() with a name computed at run time", "")
    if function_answer:  # the answer names an imported callable (through any alias): not the student's own
        if _resolve(prog.expr, alias, stars) or (isinstance(prog.expr, ast.Name) and any(
                _matches(f"{m}.{prog.expr.id}", forbidden) for m in stars)):
            add(prog.call.cell, prog.expr, ast.unparse(prog.expr), HANDED_IN)
    findings.sort(key=lambda f: (f.cell, f.line))
    return findings


HANDED_IN = "<not a function of the notebook>"


def describe(finding: Finding) -> str:
    where = f"cell {finding.cell}" + (f", line {finding.line}" if finding.line else "")
    if finding.forbidden == HANDED_IN:
        return (f"the answer handed to check() is {finding.what} ({where}), not a function defined in your notebook; "
                "hand in the function you wrote")
    if finding.forbidden:
        return f"your code uses {finding.what} ({where}), which this exercise does not let an answer call"
    return f"your code uses {finding.what} ({where}), which hides from the grader what your answer runs"
