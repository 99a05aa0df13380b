"""The worker process itself: where `grade` runs a student's answer (every lab; see worker.py).

The grader starts this file from a folder of its own (a copy of it and of codec.py, outside the
student's labsupport), so nothing here needs the graders.  The process imports torch and numpy
once, then forks one child per answer: the child imports labsupport fresh from the copy the
grader wrote for that checkoff (without the names it forbids, labsupport.course.strip), runs the
answer's program, and serves its calls until the grader says "end"; the parent reports how each
child ended.  A child that uses a removed name is reported by name, whatever its code catches.

    python -m FOLDER.worker_process IN_FD OUT_FD LOG SITE     (started by WorkerClient only)
"""
from __future__ import annotations

import ast
import importlib
import os
import select
import shutil
import struct
import sys
import time
import types
from pathlib import Path

from . import codec

HEADER = struct.Struct(">I")
MAX_FRAME = codec.MAX_TEXT
AUDIT_EVENT = "labsupport.removed"  # what labsupport.course.strip's copy reports when a removed name is asked for


# --- framing (both sides) --------------------------------------------------------------------------

def write_frame(fd: int, payload: bytes) -> None:
    data = HEADER.pack(len(payload)) + payload
    while data:
        sent = os.write(fd, data)
        data = data[sent:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> bytes:
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > MAX_FRAME:
        raise codec.DecodeError(f"a message of {size:,} bytes is over the limit")
    return _read_exact(fd, size, deadline)


def exit_text(code: int) -> str:
    """How a process ended, from its exit code (minus the signal that killed it), in words."""
    import signal

    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --- one answer (the child) --------------------------------------------------------------------------

class _Answer:
    def __init__(self, in_fd: int, out_fd: int, site: str, removed: dict[str, str]):
        self.in_fd, self.out_fd, self.removed = in_fd, out_fd, removed
        self.short = {}
        for name, cause in removed.items():
            self.short.setdefault(name.rpartition(".")[2], cause)
        self.tried: list[str] = []  # forbidden names asked for, caught or not
        sys.addaudithook(self._audit)
        # an editable install's finder would find what the copy lacks in the repository: only the copy counts
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
        sys.path.insert(0, site)
        self.library = tuple({os.path.join(folder, "labsupport") + os.sep for folder in (site, os.path.realpath(site))})
        self.answer = None

    def _audit(self, event: str, args: tuple) -> None:
        if event != AUDIT_EVENT or not args:
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name == "__getattr__":
            frame = frame.f_back  # the hook written into the copy; then whoever asked
        if frame is None or not frame.f_code.co_filename.startswith(self.library):
            self.tried.append(self.removed.get(str(args[0]), str(args[0])))  # the library's own lookups fail alone

    def _missing(self, exc: BaseException) -> list[str]:
        """The forbidden names behind a missing name this exception (or one it came from) is about."""
        found, seen = [], set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            name = getattr(exc, "name", None)
            if isinstance(exc, ImportError) and name:
                cause = next((c for n, c in self.removed.items() if name == n or name.startswith(n + ".")), None)
                text = str(exc)
                if cause is None and text.startswith("cannot import name '"):
                    cause = self.short.get(text.split("'")[1])
                found += [cause] if cause else []
            elif isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):  # vars(module)[name]
                name = exc.args[0]
            if isinstance(exc, (NameError, AttributeError, KeyError)) and isinstance(name, str) and name in self.short:
                found.append(self.short[name])
            exc = exc.__cause__ or exc.__context__
        return found

    def forbidden(self, exc: BaseException | None = None) -> list[str]:
        return sorted(set(self.tried + (self._missing(exc) if exc is not None else [])))

    def send(self, message: dict) -> None:
        message.setdefault("forbidden", self.forbidden())
        try:
            payload = codec.dumps(message).encode()
        except (ValueError, TypeError, RecursionError) as exc:
            payload = codec.dumps({"raised": {"type": "UnreadableResult", "message": str(exc)[:300],
                                              "not_implemented": False}, "forbidden": self.forbidden()}).encode()
        write_frame(self.out_fd, payload)

    def receive(self) -> dict:
        return codec.loads(read_frame(self.in_fd), objects=True, callback=self._callback_stub)

    def _callback_stub(self, number: int):
        def call_back(*args, **kwargs):
            self.send({"callback": number, "args": list(args), "kwargs": kwargs})
            reply = self.receive()
            if "raised" in reply:
                raise RuntimeError(f"the grader's callback failed: {reply['raised']}")
            return reply.get("result")

        call_back.__name__ = f"callback_{number}"
        return call_back

    def raised(self, exc: BaseException) -> dict:
        try:
            text = str(exc)
        except BaseException:  # noqa: BLE001 - a hostile __str__
            text = "<unprintable>"
        return {"raised": {"type": type(exc).__name__, "message": text[:2000],
                           "not_implemented": isinstance(exc, NotImplementedError)},
                "forbidden": self.forbidden(exc)}

    def load(self, message: dict) -> dict:
        stem = "answer_" + message["id"].replace(".", "_")
        path = Path.cwd() / f"{stem}.py"
        path.write_text(message["program"], encoding="utf-8")
        skipped: list[int] = []
        try:
            import labsupport  # noqa: F401 - first: on a CPU-only machine it routes Triton through its interpreter

            module = types.ModuleType(f"labsupport_{stem}")
            module.__file__ = str(path)
            sys.modules[module.__name__] = module
            for statement in ast.parse(message["program"], str(path)).body:
                self._run(statement, path, module, skipped)
            fn = module.__answer__
        except BaseException as exc:  # noqa: BLE001 - the student's program, whatever it raises
            return self.raised(exc)
        self.answer = fn
        if not callable(fn):
            return {"ok": True, "callable": False, "value": fn, "skipped": skipped}
        is_jit = callable(getattr(fn, "fn", None)) and type(fn).__name__ in ("JITFunction", "InterpretedFunction")
        return {"ok": True, "callable": True, "triton_jit": is_jit, "skipped": skipped,
                "name": str(getattr(getattr(fn, "fn", fn), "__name__", "your function"))}

    def _run(self, statement: ast.stmt, path: Path, module, skipped: list[int]) -> None:
        """One top-level statement of the answer's program.  A bare expression whose value is thrown
        away (a display such as ``viz_memory.naive_panel()``) that fails inside labsupport for want of
        a removed name is skipped: what it lacked never ran, and nothing of it is the answer."""
        try:
            exec(compile(ast.Module([statement], []), str(path), "exec"), module.__dict__)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is that case
            if not (isinstance(statement, ast.Expr) and self._missing(exc) and self._in_library(exc.__traceback__)):
                raise
            skipped.append(statement.lineno)

    def _in_library(self, tb) -> bool:
        """Whether the innermost frame of a traceback runs labsupport's own code (this copy's)."""
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is not None and tb.tb_frame.f_code.co_filename.startswith(self.library)

    def call(self, message: dict) -> dict:
        args, kwargs = list(message.get("args", [])), dict(message.get("kwargs", {}))
        target = None
        if message["op"] == "call_with":
            target = _target(message["target"], message.get("target_source"))
            device = message.get("device")
            if device and device != "cpu":
                args = [a.to(device) if hasattr(a, "to") and type(a).__module__.startswith("torch") else a for a in args]
        watched = {i: codec.dumps(a) for i, a in enumerate(args) if _mutable(a)}
        watched.update({k: codec.dumps(v) for k, v in kwargs.items() if _mutable(v)})
        try:
            if target is None:
                result = self.answer(*args, **kwargs)
            else:
                result = target(*args, **{message["answer_kw"]: self.answer}, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the student's code, whatever it raises
            return self.raised(exc)
        after = {}
        for key, before in watched.items():
            value = args[key] if isinstance(key, int) else kwargs[key]
            now = codec.dumps(value)
            if now != before:
                after[str(key)] = value
        return {"result": result, "after": after}

    def serve(self, first: dict) -> None:
        self.send(self.load(first))
        while True:
            try:
                message = self.receive()
            except EOFError:
                return
            op = message.get("op")
            if op in ("end", "quit"):
                return
            try:
                reply = self.call(message) if op in ("call", "call_with") else {
                    "raised": {"type": "ProtocolError", "message": f"unknown op {op!r}", "not_implemented": False}}
            except BaseException as exc:  # noqa: BLE001 - e.g. a judge's target that is not in this copy
                reply = self.raised(exc)
            self.send(reply)


def _target(name: str, source: str | None = None):
    """The library function a judge runs the answer inside.  Where the checkoff forbids the target
    itself, the grader sends its module's text with the target kept (the other forbidden names still
    cut), and it runs from a private module, never registered as labsupport's."""
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith("labsupport.") or module_name.startswith("labsupport.course"):
        raise ValueError(f"not a library function: {name}")
    if source is None:
        target = importlib.import_module(module_name)
    else:
        import linecache
        import types

        target = types.ModuleType("judge_" + module_name.replace(".", "_"))
        target.__file__ = f"<the judge's copy of {module_name}>"
        linecache.cache[target.__file__] = (len(source), None, source.splitlines(True), target.__file__)
        sys.modules[target.__name__] = target  # where dataclasses and triton look a module's names up
        exec(compile(source, target.__file__, "exec"), target.__dict__)  # noqa: S102 - the grader's own text
    for attr in qualname.split("."):
        target = getattr(target, attr)
    return target


def _mutable(value) -> bool:
    return isinstance(value, (list, dict)) or type(value).__module__.startswith("torch") and hasattr(value, "dtype")


# --- the process: one child per answer ---------------------------------------------------------------

def _serve(in_fd: int, out_fd: int, site: str) -> None:
    scratch = Path.cwd() / "answer"
    while True:
        try:
            message = codec.loads(read_frame(in_fd))
        except EOFError:
            return
        op = message.get("op") if isinstance(message, dict) else None
        if op == "quit":
            return
        if op != "load":
            reply = {"raised": {"type": "ProtocolError", "message": f"no answer is loaded for op {op!r}",
                                "not_implemented": False}}
            write_frame(out_fd, codec.dumps(reply).encode())
            continue
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        pid = os.fork()
        if pid == 0:  # the child: this answer only, then gone
            code = 0
            try:
                os.chdir(scratch)
                _Answer(in_fd, out_fd, site, dict(message.get("removed") or {})).serve(message)
            except BaseException:  # noqa: BLE001 - whatever happened, the parent says how the child ended
                code = 70
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        shutil.rmtree(scratch, ignore_errors=True)  # nothing one answer wrote is there for the next
        write_frame(out_fd, codec.dumps({"ended": exit_text(os.waitstatus_to_exitcode(status))}).encode())


def _preload() -> None:
    """The heavy third-party packages, imported once for every child (labsupport itself never is, here).

    Triton only where no NVIDIA device is present: then labsupport would route it through its
    interpreter anyway, and that must be decided before triton is first imported.  (Asking torch
    about CUDA here would start CUDA in the parent, which its forked children cannot inherit.)
    """
    names = ["numpy", "torch", "plotly.graph_objects", "plotly.utils", "ipywidgets"]
    if "TRITON_INTERPRET" in os.environ or not Path("/dev/nvidiactl").exists():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        names.append("triton")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a package missing here is imported (and reported) by the answer
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    in_fd, out_fd, log, site = int(argv[0]), int(argv[1]), argv[2], argv[3]
    # the student's prints and warnings go to the log: only the protocol writes to the channel
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(site).resolve()]
    _preload()
    _serve(in_fd, out_fd, site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
