"""The throw-away process a student's function runs in while `grade` tries it (every lab).

`grade` never calls student code itself.  It starts this module as a separate Python process (on
a fresh private copy of labsupport, with no graders in it), hands it each function answer as
source text, and then sends the calls a checkoff's judge makes, one message each: arguments in
(labsupport.course.codec, where the grader may also send its own allocators, specs and requests),
the result and any argument the function changed in place back out, as plain data.  A callable
argument (3.2's ``take_free_block``) stays in the grader and is called back by number.

Inside the worker the names the checkoff forbids are tripwires: calling one ends that call and is
reported, whatever the student's code catches.  The worker's prints go to a log file, not to the
channel.  If the process dies (``os._exit``, a crash) or runs past its time, the grader kills it,
fails the checkoff it was working on, and starts a fresh one for the next.

    python -m labsupport.course.worker IN_FD OUT_FD LOG     (started by WorkerClient only)
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from labsupport.course import codec
from labsupport.course.checkoff import Forbidden, Mismatch, RemoteAnswer, RemoteError, describe_call

HEADER = struct.Struct(">I")
MAX_FRAME = codec.MAX_TEXT


# --- framing (both sides) --------------------------------------------------------------------------

def _write_frame(fd: int, payload: bytes) -> None:
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


def _read_frame(fd: int, deadline: float | None = None) -> bytes:
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > MAX_FRAME:
        raise codec.DecodeError(f"a message of {size:,} bytes is over the limit")
    return _read_exact(fd, size, deadline)


# --- the worker process ------------------------------------------------------------------------------

class ForbiddenCallError(BaseException):
    """Raised by a tripwire; a BaseException so that ``except Exception`` in student code lets it through."""


class _Tripwire:
    """Stands where a forbidden function, class or method was: any use trips it."""

    def __init__(self, name: str, calls: list):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_calls", calls)

    def _trip(self):
        self._calls.append(self._name)
        raise ForbiddenCallError(self._name)

    def __call__(self, *args, **kwargs):
        self._trip()

    def __getattr__(self, attr):
        self._trip()

    def __get__(self, obj, objtype=None):  # as a method: calling or reading it trips
        self._trip()


class _BlockCourse(importlib.abc.MetaPathFinder):
    """Refuses imports of forbidden module prefixes (labsupport.course's graders and the like)."""

    def __init__(self, prefixes, calls: list):
        self.prefixes, self.calls = tuple(prefixes), calls

    def find_spec(self, name, path=None, target=None):
        for prefix in self.prefixes:
            if name == prefix or name.startswith(prefix + "."):
                self.calls.append(name)
                raise ForbiddenCallError(name)
        return None


class _Worker:
    def __init__(self, in_fd: int, out_fd: int):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.answers: dict[str, object] = {}
        self.calls: list[str] = []  # forbidden names tripped since the current answer was loaded
        self.installed: list[tuple[object, str, object]] = []
        self.blocker: _BlockCourse | None = None
        self.folder = Path.cwd()

    # tripwires --------------------------------------------------------------------------------------
    def _uninstall(self) -> None:
        for owner, attr, original in reversed(self.installed):
            try:
                setattr(owner, attr, original)
            except (AttributeError, TypeError):
                pass
        self.installed.clear()
        if self.blocker is not None and self.blocker in sys.meta_path:
            sys.meta_path.remove(self.blocker)
        self.blocker = None

    def _install(self, forbidden: list[str]) -> None:
        self._uninstall()
        self.calls = []
        prefixes = []
        for name in forbidden:
            owner, attr = self._owner(name)
            if owner is None:
                if importlib.util.find_spec(name.split(".")[0]) is not None and not attr:
                    prefixes.append(name)
                continue
            original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
            self.installed.append((owner, attr, original))
            setattr(owner, attr, _Tripwire(name, self.calls))
        if prefixes:
            for module in [m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in prefixes)]:
                if module not in ("labsupport.course", "labsupport.course.codec", "labsupport.course.worker"):
                    sys.modules.pop(module, None)
            self.blocker = _BlockCourse(prefixes, self.calls)
            sys.meta_path.insert(0, self.blocker)

    @staticmethod
    def _owner(name: str):
        """(object holding the last attribute, attribute) for a dotted name, or (None, '') if it names a package."""
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module_name = ".".join(parts[:cut])
            try:
                spec = importlib.util.find_spec(module_name)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                continue
            if spec.submodule_search_locations is not None and cut == len(parts) - 1:
                sub = ".".join(parts)
                try:
                    if importlib.util.find_spec(sub) is not None:
                        return None, ""  # a package's submodule: blocked as an import prefix
                except (ImportError, ValueError):
                    pass
            try:
                owner = importlib.import_module(module_name)
                for attr in parts[cut:-1]:
                    owner = getattr(owner, attr)
                if hasattr(owner, parts[-1]):
                    return owner, parts[-1]
            except Exception:  # noqa: BLE001 - a name that does not exist here needs no tripwire
                return None, "?"
            return None, "?"
        return None, ""

    # requests ---------------------------------------------------------------------------------------
    def send(self, message: dict) -> None:
        try:
            payload = codec.dumps(message).encode()
        except (ValueError, TypeError, RecursionError) as exc:
            payload = codec.dumps({"raised": {"type": "UnreadableResult", "message": str(exc)[:300],
                                              "not_implemented": False}, "forbidden": list(self.calls)}).encode()
        _write_frame(self.out_fd, payload)

    def receive(self) -> dict:
        return codec.loads(_read_frame(self.in_fd), objects=True, callback=self._callback_stub)

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
        text = ""
        try:
            text = str(exc)
        except BaseException:  # noqa: BLE001 - a hostile __str__
            text = "<unprintable>"
        return {"raised": {"type": type(exc).__name__, "message": text[:2000],
                           "not_implemented": isinstance(exc, NotImplementedError)},
                "forbidden": list(self.calls)}

    def load(self, message: dict) -> dict:
        checkoff_id, program = message["id"], message["program"]
        self._install(message.get("forbid", []))
        stem = "answer_" + checkoff_id.replace(".", "_")
        path = self.folder / f"{stem}.py"
        path.write_text(program, encoding="utf-8")
        name = f"labsupport_{stem}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            fn = module.__answer__
        except BaseException as exc:  # noqa: BLE001 - the student's program, whatever it raises
            return self.raised(exc)
        self.answers[checkoff_id] = fn
        if not callable(fn):  # a value answer, re-derived here: the value itself goes back
            return {"ok": True, "callable": False, "value": fn, "forbidden": list(self.calls)}
        is_jit = callable(getattr(fn, "fn", None)) and type(fn).__name__ in ("JITFunction", "InterpretedFunction")
        return {"ok": True, "callable": callable(fn), "triton_jit": is_jit,
                "name": str(getattr(getattr(fn, "fn", fn), "__name__", "your function")), "forbidden": list(self.calls)}

    def call(self, message: dict) -> dict:
        fn = self.answers[message["id"]]
        args, kwargs = list(message.get("args", [])), dict(message.get("kwargs", {}))
        target = None
        if message["op"] == "call_with":
            target = self._target(message["target"])
            device = message.get("device")
            if device and device != "cpu":
                args = [a.to(device) if hasattr(a, "to") and type(a).__module__.startswith("torch") else a for a in args]
        watched = {i: codec.dumps(a) for i, a in enumerate(args) if _mutable(a)}
        watched.update({k: codec.dumps(v) for k, v in kwargs.items() if _mutable(v)})
        try:
            if target is None:
                result = fn(*args, **kwargs)
            else:
                result = target(*args, **{message["answer_kw"]: fn}, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the student's code, whatever it raises
            return self.raised(exc)
        after = {}
        for key, before in watched.items():
            value = args[key] if isinstance(key, int) else kwargs[key]
            now = codec.dumps(value)
            if now != before:
                after[str(key)] = value
        return {"result": result, "after": after, "forbidden": list(self.calls)}

    def _target(self, name: str):
        """The library function a judge runs the answer inside (the real one, even where a tripwire stands)."""
        module_name, _, qualname = name.partition(":")
        if not module_name.startswith("labsupport.") or module_name.startswith("labsupport.course"):
            raise ValueError(f"not a library function: {name}")
        target = importlib.import_module(module_name)
        for attr in qualname.split("."):
            target = getattr(target, attr)
        for owner, attr, original in self.installed:
            if owner.__dict__.get(attr) is target:
                return original
        return target

    def serve(self) -> None:
        while True:
            try:
                message = self.receive()
            except EOFError:
                return
            op = message.get("op")
            try:
                if op == "load":
                    reply = self.load(message)
                elif op in ("call", "call_with"):
                    reply = self.call(message)
                elif op == "quit":
                    return
                else:
                    reply = {"raised": {"type": "ProtocolError", "message": f"unknown op {op!r}",
                                        "not_implemented": False}}
            except ForbiddenCallError as exc:
                reply = self.raised(exc)
            self.send(reply)


def _mutable(value) -> bool:
    return isinstance(value, (list, dict)) or type(value).__module__.startswith("torch") and hasattr(value, "dtype")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    in_fd, out_fd, log = int(argv[0]), int(argv[1]), argv[2]
    # the student's prints and warnings go to the log: only this module writes to the channel
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    import labsupport  # noqa: F401 - first: on a CPU-only machine it routes Triton through its interpreter

    _Worker(in_fd, out_fd).serve()
    return 0


# --- the grader's side -------------------------------------------------------------------------------

class WorkerDied(Exception):
    """The worker process ended, or stopped answering within its time."""


class WorkerClient:
    """Starts and talks to one worker process; `load` returns the student's function as a RemoteFunction."""

    def __init__(self, folder: Path, site: Path, env: dict[str, str] | None = None, wrap=None, owner=None):
        # wrap: turns the worker's command into one that runs it elsewhere (labsupport.course.sandbox);
        # owner: gives the folder to the user it will run as
        self.folder, self.site, self.env, self.wrap, self.owner = Path(folder), Path(site), env, wrap, owner
        self.proc: subprocess.Popen | None = None
        self.to_fd = self.from_fd = -1
        self.log = self.folder / "worker.log"

    def start(self) -> None:
        self.close()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.owner is not None:
            self.owner(self.folder)
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        env = dict(self.env if self.env is not None else os.environ)
        env["PYTHONPATH"] = str(self.site)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        command = [sys.executable, "-m", "labsupport.course.worker", str(to_r), str(from_w), str(self.log)]
        self.proc = subprocess.Popen(
            self.wrap(command) if self.wrap is not None else command,
            cwd=self.folder, env=env, pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self.to_fd, self.from_fd = to_w, from_r

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for fd in (self.to_fd, self.from_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.proc, self.to_fd, self.from_fd = None, -1, -1

    def exit_text(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def request(self, message: dict, deadline: float, callbacks: dict | None = None) -> dict:
        """Send one request and wait for its reply, serving callbacks meanwhile."""
        if not self.alive:
            raise WorkerDied("the worker is not running")
        try:
            _write_frame(self.to_fd, codec.dumps(message, objects=True).encode())
            while True:
                frame = _read_frame(self.from_fd, deadline)
                reply = codec.loads(frame)
                if not isinstance(reply, dict):
                    raise codec.DecodeError("a reply that is not an object")
                if "callback" in reply and callbacks is not None and reply["callback"] in callbacks:
                    args, kwargs = reply.get("args", []), reply.get("kwargs", {})
                    try:
                        result = callbacks[reply["callback"]](*args, **kwargs)
                        answer = {"result": result}
                    except Exception as exc:  # noqa: BLE001 - reported to the worker as a failed callback
                        answer = {"raised": f"{type(exc).__name__}: {exc}"}
                    _write_frame(self.to_fd, codec.dumps(answer, objects=True).encode())
                    continue
                return reply
        except TimeoutError:
            self.close()
            raise WorkerDied("timeout") from None
        except (EOFError, BrokenPipeError, OSError):
            time.sleep(0.05)
            text = self.exit_text()
            self.close()
            raise WorkerDied(text) from None
        except codec.DecodeError as exc:
            self.close()
            raise WorkerDied(f"sent something that is not plain data ({exc})") from None

    def value(self, checkoff_id: str, program: str, forbidden, budget_s: float):
        """Run a value answer's program in the worker and return the value it binds (plain data)."""
        reply = self._load(checkoff_id, program, forbidden, time.monotonic() + budget_s, budget_s)
        if "value" not in reply:
            raise Mismatch("re-run, your code handed check() a function where a value was expected")
        return reply["value"]

    def load(self, checkoff_id: str, program: str, forbidden, source: str, budget_s: float) -> "RemoteFunction":
        """Rebuild the answer in the worker; raises NotImplementedError, Forbidden or Mismatch."""
        deadline = time.monotonic() + budget_s
        reply = self._load(checkoff_id, program, forbidden, deadline, budget_s)
        return RemoteFunction(self, checkoff_id, reply, source, deadline, budget_s)

    def _load(self, checkoff_id: str, program: str, forbidden, deadline: float, budget_s: float) -> dict:
        if not self.alive:
            self.start()
        try:
            reply = self.request({"op": "load", "id": checkoff_id, "program": program, "forbid": list(forbidden)},
                                 deadline)
        except WorkerDied as exc:
            raise Mismatch(_died_text("loading your notebook's code for this answer", str(exc), budget_s)) from None
        _check_forbidden(reply)
        if "raised" in reply:
            raised = reply["raised"]
            if raised.get("not_implemented"):
                raise NotImplementedError(raised.get("message", ""))
            raise Mismatch(f"running your notebook's code for this answer raised {raised.get('type')}: "
                           f"{raised.get('message')}")
        return reply


def _died_text(what: str, why: str, budget_s: float) -> str:
    if why == "timeout":
        return f"{what} did not finish within {budget_s:g} s (the grader's time for this checkoff)"
    return f"{what} ended the grader's worker process (it {why})"


def _check_forbidden(reply: dict) -> None:
    names = reply.get("forbidden") or []
    if names:
        raise Forbidden(sorted({str(n) for n in names}))


def _update(original, new) -> None:
    """Make the grader's argument what the student's function left it (in place)."""
    if isinstance(original, list) and isinstance(new, list):
        original[:] = new
    elif isinstance(original, dict) and isinstance(new, dict):
        original.clear()
        original.update(new)
    elif hasattr(original, "copy_") and hasattr(new, "shape"):
        try:
            if original.shape == new.shape and original.dtype == new.dtype:
                original.copy_(new.to(original.device))
            else:
                original.data = new.to(original.device)
        except (RuntimeError, TypeError):
            pass


class RemoteFunction(RemoteAnswer):
    """The student's function as the judges see it: each call is one message to the worker."""

    def __init__(self, client: WorkerClient, checkoff_id: str, info: dict, source: str, deadline: float,
                 budget_s: float):
        self.client, self.checkoff_id, self.info, self.source = client, checkoff_id, info, source
        self.deadline, self.budget_s = deadline, budget_s
        self.name = str(info.get("name") or "your function")
        self.failure = ""

    def __repr__(self) -> str:
        return f"<your function {self.name}>"

    def _send(self, message: dict, what: str, args: tuple, kwargs: dict, callbacks: dict):
        if self.failure:
            raise Mismatch(self.failure)
        if not self.info.get("callable", True):
            raise Mismatch("this checkoff wants your function itself (no parentheses)")
        try:
            reply = self.client.request(message, self.deadline, callbacks)
        except WorkerDied as exc:
            self.failure = _died_text(what, str(exc), self.budget_s)
            raise Mismatch(self.failure) from None
        _check_forbidden(reply)
        for key, value in (reply.get("after") or {}).items():
            if key.isdigit() and int(key) < len(args):
                _update(args[int(key)], value)
            elif key in kwargs:
                _update(kwargs[key], value)
        return reply

    @staticmethod
    def _marked(values, callbacks: dict):
        def mark(value):
            if callable(value) and not isinstance(value, type) and not hasattr(value, "dtype"):
                callbacks[len(callbacks)] = value
                return codec.Callback(len(callbacks) - 1)
            return value

        if isinstance(values, dict):
            return {k: mark(v) for k, v in values.items()}
        return [mark(v) for v in values]

    def remote_call(self, args: tuple, kwargs: dict):
        what = describe_call(self, args, kwargs)
        callbacks: dict = {}
        message = {"op": "call", "id": self.checkoff_id, "args": self._marked(args, callbacks),
                   "kwargs": self._marked(kwargs, callbacks)}
        reply = self._send(message, what, args, kwargs, callbacks)
        if "raised" in reply:
            raised = reply["raised"]
            if raised.get("not_implemented"):
                raise NotImplementedError(raised.get("message", ""))
            if raised.get("type") == "UnreadableResult":
                raise Mismatch(f"{what} returned something the grader cannot read as plain data "
                               f"({raised.get('message')}); return numbers, lists, tuples, dicts or tensors.")
            raise Mismatch(f"{what} raised {raised.get('type')}: {raised.get('message')}")
        return reply.get("result")

    def remote_call_with(self, target, answer_kw: str, args: tuple, kwargs: dict):
        name = f"{target.__module__}:{target.__qualname__}"
        what = f"{target.__name__} with your {self.name}"
        device = next((str(a.device.type) for a in args if hasattr(a, "device") and hasattr(a, "dtype")), "cpu")
        message = {"op": "call_with", "id": self.checkoff_id, "target": name, "answer_kw": answer_kw,
                   "args": list(args), "kwargs": kwargs, "device": device}
        reply = self._send(message, what, args, kwargs, {})
        if "raised" in reply:
            raised = reply["raised"]
            if raised.get("not_implemented"):
                raise NotImplementedError(raised.get("message", ""))
            raise RemoteError(str(raised.get("type")), str(raised.get("message")))
        return reply.get("result")


if __name__ == "__main__":
    sys.exit(main())
