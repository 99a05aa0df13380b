"""The throw-away process a student's answer runs in while `grade` tries it (every lab).

`grade` never calls student code itself.  It starts a separate Python process (worker_process.py,
run from a folder of its own), hands it each answer as program text, and then sends the calls a
checkoff's judge makes, one message each: arguments in (labsupport.course.codec, where the grader
may also send its own allocators, specs and requests), the result and any argument the function
changed in place back out, as plain data.  A callable argument (3.2's ``take_free_block``) stays
in the grader and is called back by number.  A value answer's program comes back as its value.

Before each answer the grader writes the worker's private labsupport afresh, without the names that
checkoff forbids (labsupport.course.strip; never the graders): a shortcut fails as a missing name
and is reported as one.  The worker's prints go to a log file, not to the channel.  If an answer's
process dies (``os._exit``, a crash) that answer fails; if it runs past its time, the grader kills
the worker and starts a fresh one for the next.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from labsupport.course import codec, strip
from labsupport.course.checkoff import Forbidden, Mismatch, RemoteAnswer, RemoteError, describe_call
from labsupport.course.worker_process import exit_text, read_frame, write_frame

CODE = "labsupport_worker"  # the folder, beside the private labsupport, that the worker's own code runs from
CODE_FILES = ("codec.py", "worker_process.py")


# --- the grader's side -------------------------------------------------------------------------------

class WorkerDied(Exception):
    """The worker process ended, or stopped answering within its time."""


class WorkerClient:
    """Starts and talks to one worker process; `load` returns the student's function as a RemoteFunction.

    `site` is a folder Snapshot.write filled (labsupport without the graders): the client takes its
    labsupport into memory and off the disk, and writes it back, stripped, for each answer.
    """

    def __init__(self, folder: Path, site: Path, env: dict[str, str] | None = None, wrap=None, owner=None):
        # wrap: turns the worker's command into one that runs it elsewhere (labsupport.course.sandbox);
        # owner: gives the folder to the user it will run as
        self.folder, self.site, self.env, self.wrap, self.owner = Path(folder), Path(site), env, wrap, owner
        self.files = _take_package(self.site / "labsupport")
        self.proc: subprocess.Popen | None = None
        self.to_fd = self.from_fd = -1
        self.serving = False  # a child holds an answer and reads the channel
        self.log = self.folder / "worker.log"
        self._write_code()

    def _write_code(self) -> None:
        """The worker's own code, beside (not inside) the student's labsupport."""
        code = self.site / CODE
        code.mkdir(parents=True, exist_ok=True)
        (code / "__init__.py").write_text("", encoding="utf-8")
        here = Path(__file__).resolve().parent
        for name in CODE_FILES:
            shutil.copyfile(here / name, code / name)

    def _write_site(self, forbidden) -> dict[str, str]:
        """site/labsupport as this checkoff may see it; returns {removed name: the forbidden name behind it}.

        Every file is checked against what it must hold, whatever an earlier answer did to the folder."""
        files, removed = _stripped(self.files, tuple(forbidden))
        target = self.site / "labsupport"
        for path in sorted(target.rglob("*"), reverse=True) if target.exists() else []:
            rel = path.relative_to(target).as_posix()
            if path.is_symlink() or path.is_file() and rel not in files:
                path.unlink()
            elif path.is_dir() and not any(r.startswith(rel + "/") for r in files):
                shutil.rmtree(path)
        for rel, data in files.items():
            dest = target / rel
            if not dest.is_file() or dest.read_bytes() != data:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.unlink(missing_ok=True)
                dest.write_bytes(data)
        return removed

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
        command = [sys.executable, "-m", f"{CODE}.worker_process", str(to_r), str(from_w), str(self.log),
                   str(self.site)]
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
        self.proc, self.to_fd, self.from_fd, self.serving = None, -1, -1, False

    def exit_text(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        return "stopped answering" if code is None else exit_text(code)

    def request(self, message: dict, deadline: float, callbacks: dict | None = None) -> dict:
        """Send one request and wait for its reply, serving callbacks meanwhile."""
        if not self.alive:
            raise WorkerDied("the worker is not running")
        try:
            write_frame(self.to_fd, codec.dumps(message, objects=True).encode())
            while True:
                frame = read_frame(self.from_fd, deadline)
                reply = codec.loads(frame)
                if not isinstance(reply, dict):
                    raise codec.DecodeError("a reply that is not an object")
                if "ended" in reply:  # the answer's process is gone: asked to ("end"), or it died
                    self.serving = False
                    if message.get("op") == "end":
                        return reply
                    raise WorkerDied(str(reply["ended"]))
                if "callback" in reply and callbacks is not None and reply["callback"] in callbacks:
                    args, kwargs = reply.get("args", []), reply.get("kwargs", {})
                    try:
                        result = callbacks[reply["callback"]](*args, **kwargs)
                        answer = {"result": result}
                    except Exception as exc:  # noqa: BLE001 - reported to the worker as a failed callback
                        answer = {"raised": f"{type(exc).__name__}: {exc}"}
                    write_frame(self.to_fd, codec.dumps(answer, objects=True).encode())
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

    def _load(self, checkoff_id: str, program: str, forbidden, budget_s: float) -> tuple[dict, float]:
        """Run the answer's program in a fresh child on this checkoff's labsupport; the reply, and its deadline."""
        deadline = time.monotonic() + budget_s
        if self.serving and self.alive:
            try:
                self.request({"op": "end"}, time.monotonic() + 10)
            except WorkerDied:
                self.close()
        if not self.alive:
            self.start()
        removed = self._write_site(forbidden)
        try:
            reply = self.request({"op": "load", "id": checkoff_id, "program": program, "removed": removed}, deadline)
        except WorkerDied as exc:
            raise Mismatch(_died_text("loading your notebook's code for this answer", str(exc), budget_s)) from None
        self.serving, self.forbidden_now, self.removed_now = True, tuple(forbidden), removed
        _check_forbidden(reply)
        if "raised" in reply:
            raised = reply["raised"]
            if raised.get("not_implemented"):
                raise NotImplementedError(raised.get("message", ""))
            if raised.get("type") == "UnreadableResult":
                raise Mismatch(f"your answer is something the grader cannot read as plain data ({raised.get('message')})")
            raise Mismatch(f"running your notebook's code for this answer raised {raised.get('type')}: "
                           f"{raised.get('message')}")
        return reply, deadline

    def target_source(self, name: str) -> str | None:
        """A judge's target module ("module:qualname") as text with the target in it, where this copy lacks it."""
        module, _, qualname = name.partition(":")
        dotted = f"{module}.{qualname}"
        if dotted not in getattr(self, "removed_now", {}):
            return None
        files, _ = _stripped(self.files, tuple(f for f in self.forbidden_now if f != dotted))
        rel = module.removeprefix("labsupport.").replace(".", "/")
        data = files.get(rel + ".py") or files.get(rel + "/__init__.py")
        return data.decode("utf-8") if data else None

    def load(self, checkoff_id: str, program: str, forbidden, source: str, budget_s: float) -> "RemoteFunction":
        """Rebuild the answer in the worker; raises NotImplementedError, Forbidden or Mismatch."""
        reply, deadline = self._load(checkoff_id, program, forbidden, budget_s)
        return RemoteFunction(self, checkoff_id, reply, source, deadline, budget_s)

    def value(self, checkoff_id: str, program: str, forbidden, budget_s: float):
        """Re-run a value answer's program in the worker; its `__answer__` as plain data (raises as `load` does)."""
        reply, _ = self._load(checkoff_id, program, forbidden, budget_s)
        if reply.get("callable", False):
            raise Mismatch("this checkoff wants a value, and your code hands over a function")
        return reply.get("value")


def _take_package(package: Path) -> dict[str, bytes]:
    """A written copy of labsupport's files, read into memory and removed from the disk (never the grader's own)."""
    import labsupport

    if package.resolve() == Path(labsupport.__file__).resolve().parent:
        raise ValueError(f"{package} is the grader's own labsupport: the worker needs a written copy")
    files = {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts}
    shutil.rmtree(package)
    return files


@functools.lru_cache(maxsize=64)
def _stripped_cached(digest: str, forbidden: tuple[str, ...]):
    return strip.strip(_FILES[digest], forbidden)


_FILES: dict[str, dict[str, bytes]] = {}


def _stripped(files: dict[str, bytes], forbidden: tuple[str, ...]):
    """strip.strip, once per package and forbidden set in a run (the grader sees the same files for every notebook)."""
    digest = hashlib.sha256(b"".join(k.encode() + b"\0" + v for k, v in sorted(files.items()))).hexdigest()
    _FILES.setdefault(digest, files)
    return _stripped_cached(digest, forbidden)


def _died_text(what: str, why: str, budget_s: float) -> str:
    if why == "timeout":
        return f"{what} did not finish within {budget_s:.0f} s (what was left of the grader's time for this notebook's answers)"
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
                   "args": list(args), "kwargs": kwargs, "device": device,
                   "target_source": self.client.target_source(name)}
        reply = self._send(message, what, args, kwargs, {})
        if "raised" in reply:
            raised = reply["raised"]
            if raised.get("not_implemented"):
                raise NotImplementedError(raised.get("message", ""))
            raise RemoteError(str(raised.get("type")), str(raised.get("message")))
        return reply.get("result")
