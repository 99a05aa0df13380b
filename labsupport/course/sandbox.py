"""Where a handed-in notebook runs while `grade` grades it: one sandbox per notebook, every resource bounded.

Three modes (GRADING.md, "Isolation"); `grade` prints the one it uses:

  bubblewrap  (the default where it works) Debian's bwrap: its own user namespace (no capabilities,
              no user namespaces of its own), pid, network, IPC, UTS and cgroup namespaces, and a
              read-only view of the system, the interpreter and its packages, labsupport with its
              graders masked out, the labs' data and the notebook's folder.  Everything it may write
              is a sized tmpfs of its own: its scratch (/scratch), /tmp and /dev/shm; /dev is read-only.
  container   (Gradescope: one container per submission, run as root) the grader deletes the graders
              from disk before the notebook starts (`forget_graders`) and runs it as an unprivileged
              user with no capabilities through util-linux's setpriv, bounded by prlimit.
  trusted     (``--trusted``) no isolation: the notebook runs as you.  For notebooks you wrote.

Bounds (`Bounds`), each named in the row of a notebook that meets it: memory, tmpfs pages included
(a cgroup's memory.max or memory.limit_in_bytes; without a cgroup, RLIMIT_AS per process);
processes (pids.max, else RLIMIT_NPROC); CPU seconds (RLIMIT_CPU); bytes per file (RLIMIT_FSIZE);
the sizes of scratch, /tmp and /dev/shm; and wall time (the grader kills the sandbox).  The
notebook's output goes nowhere; its events come back on one pipe the grader reads with a cap.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
GRADERS = PACKAGE / "course" / "checkoffs"  # never seen by student code
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc, only what an interpreter, its libraries and a shell read (run as root, the sandbox's user is root's
# on the host's files: /etc/shadow, private keys and the like must not be in its view at all).
ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
       "hosts", "host.conf", "alternatives", "mime.types", "fonts", "os-release", "debian_version", "ssl/certs",
       "ca-certificates", "bash.bashrc", "profile", "inputrc", "locale.alias", "magic", "magic.mime")
# Staff-only parts of the package, masked in the sandbox as the student release leaves them out (the release
# copies this list): the graders, the staff commands and the ledger command's one-call answers.  (viz/board.py
# stays: lab 08 draws its map of Part II with it; the board notebook itself is not in the release.)
STAFF_ONLY = ("course/checkoffs", "course/build.py", "course/grade.py", "course/registry.py", "course/report.py",
              "course/release.py", "course/autograder.py", "course/scaffold.py", "bench/notebooks.py",
              "bench/grade.py", "cli/ledger.py")
NOBODY = 65534
MAX_EVENTS_BYTES = 64 * 2**20  # read back from one sandbox; the rest is dropped
MAX_LINE = 17 * 2**20  # one event's characters (the runner sends an answer of up to 16 MiB)
MAX_LINE_ITEMS, MAX_ITEMS = 500_000, 2_000_000  # what parsing one event, and all of them, may make
MiB, GiB = 2**20, 2**30


def python(*args: str) -> list[str]:
    """This interpreter, isolated (-I), importing the very labsupport the grader runs (a clone's, a bundle's),
    whatever an editable install points at."""
    start = f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); sys.argv[1:] = {list(args[1:])!r}; "
    if args[0] == "-c":
        return [sys.executable, "-I", "-c", start + args[1]]
    return [sys.executable, "-I", "-c", start + f"import runpy; runpy.run_module({args[0]!r}, run_name='__main__')"]


@dataclass(frozen=True)
class Bounds:
    memory: int = 4 * GiB
    processes: int = 256
    scratch: int = 1 * GiB
    tmp: int = 512 * MiB
    shm: int = 64 * MiB
    file: int = 512 * MiB
    cpu_s: int = 3600

    def describe(self) -> str:
        return (f"{self.memory // MiB:,} MiB of memory, {self.processes} processes, {self.scratch // MiB:,} MiB of "
                f"scratch, {self.tmp // MiB} MiB of /tmp, {self.cpu_s:,} CPU seconds")


class Cgroup:
    """One sandbox's cgroup(s): v2 where delegated (one folder), else v1's memory, pids and cpu hierarchies.

    The cpu group gives each sandbox the same share of the CPU, so a notebook that starts a hundred busy
    processes slows itself, not the classmate graded beside it."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders  # "memory" / "pids" / "v2" -> its folder

    @classmethod
    def make(cls, bounds: Bounds) -> "Cgroup | None":
        name = f"labsupport-{os.getpid()}-{secrets.token_hex(4)}"
        made: dict[str, Path] = {}
        try:
            for kind, folder in _cgroup_parents().items():
                path = folder / name
                path.mkdir()
                made[kind] = path
            group = cls(made)
            for kind, path in made.items():
                if kind == "v2":
                    (path / "memory.max").write_text(str(bounds.memory))
                    (path / "pids.max").write_text(str(bounds.processes))
                    with contextlib.suppress(OSError):
                        (path / "memory.swap.max").write_text("0")
                elif kind == "memory":
                    (path / "memory.limit_in_bytes").write_text(str(bounds.memory))
                elif kind == "pids":
                    (path / "pids.max").write_text(str(bounds.processes))
            return group if made else None
        except OSError:
            cls(made).remove()
            return None

    @property
    def procs(self) -> list[Path]:
        return [p / "cgroup.procs" for p in self.folders.values()]

    def covers(self) -> set[str]:
        return {"memory", "pids", "cpu"} if "v2" in self.folders else set(self.folders)

    def out_of_memory(self) -> bool:
        for kind, path in self.folders.items():
            text = _read(path / ("memory.events" if kind == "v2" else "memory.oom_control"))
            for line in text.splitlines():
                key, _, count = line.partition(" ")
                if key == "oom_kill" and count.strip() not in ("", "0"):
                    return True
        return False

    def out_of_processes(self) -> bool:
        path = self.folders.get("v2") or self.folders.get("pids")
        text = _read(path / "pids.events") if path else ""
        return any(line.split() and line.split()[0] == "max" and line.split()[-1] != "0" for line in text.splitlines())

    def kill(self) -> None:
        for procs in self.procs:
            for pid in _read(procs).split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        for path in self.folders.values():
            for _ in range(50):
                self.kill()
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cgroup_parents() -> dict[str, Path]:
    """Where this process may make child cgroups: v2 with memory, pids and cpu delegated, else v1's hierarchies."""
    mine: dict[str, tuple[str, str]] = {}  # controller -> (its hierarchy's folder name, this process's path in it)
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            mine.update({c: (parts[1], parts[2]) for c in parts[1].split(",")})
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        here = Path(mount + mine.get("", ("", "/"))[1])
        if {"memory", "pids", "cpu"} <= set(_read(here / "cgroup.subtree_control").split()) and os.access(here, os.W_OK):
            return {"v2": here}
    found = {}
    for kind in ("memory", "pids", "cpu"):  # cpu: each sandbox its own equal share, however many processes it runs
        folder, path = mine.get(kind, (kind, "/"))
        here = Path(f"/sys/fs/cgroup/{folder}{path}")
        if (here / "cgroup.procs").exists() and os.access(here, os.W_OK):
            found[kind] = here
    return found


@dataclass
class Outcome:
    """What came back from one sandbox: its events, and why it stopped early when it did."""
    events: list = field(default_factory=list)
    stopped: str = ""  # a bound it met, in words ("" when the runner finished)
    dropped: int = 0  # events lost to a cap (too long a line, too much in all)


class Sandbox:
    def __init__(self, mode: str, bounds: Bounds = Bounds()):
        self.mode, self.bounds = mode, bounds

    @classmethod
    def for_this_machine(cls, trusted: bool = False, container: bool = False, bounds: Bounds = Bounds()) -> "Sandbox | None":
        """The mode asked for; else bubblewrap when it works here; else None (grade refuses)."""
        if container:
            return cls("container", bounds)
        sandbox = cls("bubblewrap", bounds)
        if sys.platform == "linux" and shutil.which("bwrap") and sandbox.works():
            return sandbox
        return cls("trusted", bounds) if trusted else None

    def works(self) -> bool:
        """Can bwrap start this interpreter here (user namespaces allowed, labsupport in view)?"""
        probe = "import json, os, sys, labsupport; os.write(json.load(sys.stdin)['events_fd'], b'ok\\n')"
        try:
            out = self.run({}, Path(tempfile.gettempdir()), deadline=time.monotonic() + 120,
                           command=python("-c", probe))
        except OSError:
            return False
        return out.events == ["ok"]

    def describe(self) -> str:
        cg = _cgroup_parents()
        memory = "a cgroup" if cg else "RLIMIT_AS per process (no cgroup to make here)"
        if self.mode == "bubblewrap":
            return (f"bubblewrap (own user, pid, net, ipc namespaces, no capabilities, read-only view, graders "
                    f"masked; bounds: {self.bounds.describe()}; memory counted by {memory})")
        if self.mode == "container":
            return (f"container (graders deleted before the notebook runs, user {NOBODY} without capabilities; "
                    f"bounds: {self.bounds.describe()}; memory counted by {memory})")
        return "trusted (--trusted: no isolation, the notebook runs as you; grade only notebooks you trust this way)"

    def _limits(self, cgroup: Cgroup | None) -> list[str]:
        b = self.bounds
        limits = [f"--cpu={b.cpu_s}", f"--fsize={b.file}", "--core=0"]
        covered = cgroup.covers() if cgroup else set()
        if "memory" not in covered:
            limits.append(f"--as={b.memory}")
        if "pids" not in covered and self.mode != "trusted":
            limits.append(f"--nproc={b.processes}")
        return [shutil.which("prlimit"), *limits, "--"] if shutil.which("prlimit") else []

    def _bwrap(self, folder: Path, argv: list[str]) -> list[str]:
        b = self.bounds
        args = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--uid", "1000", "--gid", "1000", "--hostname", "sandbox"]
        system = [p for p in SYSTEM if os.path.lexists(p)]
        for p in system:
            args += ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]
        for name in ETC:
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        # its own filesystems first, so that a view below /tmp (a clone, a bundle) is bound on top of them
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(b.shm), "--tmpfs", "/dev/shm",
                 "--size", str(b.tmp), "--tmpfs", "/tmp", "--size", str(b.scratch), "--tmpfs", "/scratch"]
        views = [Path(sys.base_prefix), Path(sys.prefix), PACKAGE] + _data_dirs()
        for seen in dict.fromkeys(v.absolute() for v in views if v.exists()):
            real = seen.resolve()
            if not any(str(seen).startswith(s + "/") for s in system if not os.path.islink(s)):
                args += ["--ro-bind", str(real), str(seen)] + (["--ro-bind", str(real), str(real)] if real != seen else [])
        for rel in STAFF_ONLY:  # masked: a folder by an empty one, a file by an empty file
            path = PACKAGE / rel
            if path.exists():
                args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        args += [a for d in map(str, sorted(Path("/dev").glob("nvidia*"))) for a in ("--dev-bind", d, d)]
        args += ["--ro-bind", str(folder), "/submission", "--remount-ro", "/dev"]
        args += ["--chdir", "/scratch", "--clearenv"]
        for key, val in self._env("/scratch").items():
            args += ["--setenv", key, val]
        return [*args, *argv]

    def _env(self, home: str) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype",
               "MPLBACKEND": "Agg", "BROWSER": "true", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update({k: os.environ[k] for k in ("LABSUPPORT_DATA", "LABSUPPORT_HIDE_TRACES", "TRITON_INTERPRET",
                                                "CUDA_VISIBLE_DEVICES") if k in os.environ})
        return env

    def command(self, folder: Path, scratch: Path, cgroup: Cgroup | None, argv: list[str]) -> tuple[list[str], dict]:
        """The whole command line, and the environment it starts with."""
        attach = "".join(f'echo $$ > "{p}" && ' for p in (cgroup.procs if cgroup else []))
        inner = self._limits(cgroup)
        if self.mode == "bubblewrap":
            inner += self._bwrap(folder, argv)
        elif self.mode == "container":
            inner += [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
                      "--bounding-set=-all", "--no-new-privs", "--", *argv]
        else:
            inner += argv
        env = {} if self.mode == "bubblewrap" else dict(self._env(str(scratch)), PATH=os.environ.get("PATH", ""))
        return ["/bin/sh", "-c", attach + 'exec "$@"', "sh", *inner], env

    def run(self, job: dict, folder: Path, deadline: float, command: list[str] | None = None) -> Outcome:
        """Run the runner (or `command`) on `job` in a fresh sandbox; its events, whatever happens."""
        scratch = Path(tempfile.mkdtemp(prefix="labsupport-grade-"))
        cgroup = Cgroup.make(self.bounds) if self.mode != "trusted" else None
        if self.mode != "bubblewrap":
            job = dict(job, work=str(scratch / "work"), folder=str(folder))
            if self.mode == "container":
                os.chown(scratch, NOBODY, NOBODY)
        else:
            job = dict(job, work="/scratch/work", folder="/submission")
        argv = command or python("labsupport.course.runner")
        line, env = self.command(folder, scratch, cgroup, argv)
        read_end, write_end = os.pipe()
        job["events_fd"] = write_end  # inherited as it is, through the launcher and bwrap
        outcome = Outcome()
        try:
            proc = subprocess.Popen(line, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    pass_fds=(write_end,), start_new_session=True, cwd=str(scratch), env=env)
        finally:
            os.close(write_end)
        try:
            _feed(proc, job)
            self._collect(proc, read_end, deadline, outcome)
        finally:
            os.close(read_end)
            _stop(proc, cgroup, self.mode)
            if cgroup is not None:
                if cgroup.out_of_memory() and not outcome.stopped:
                    outcome.stopped = f"it ran out of its memory bound ({self.bounds.memory // MiB:,} MiB)"
                elif cgroup.out_of_processes() and not outcome.stopped:
                    outcome.stopped = f"it met its process bound ({self.bounds.processes} processes)"
                cgroup.remove()
            shutil.rmtree(scratch, ignore_errors=True)
        return outcome

    def _collect(self, proc, fd: int, deadline: float, outcome: Outcome) -> None:
        """Read the events until the pipe closes or time is up, linearly, keeping at most the caps."""
        tail, total, items, skipping = b"", 0, 0, False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome.stopped = "it ran past its time (--timeout)"
                return
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            total += len(chunk)
            if total > MAX_EVENTS_BYTES:
                outcome.dropped += 1
                outcome.stopped = f"it sent more than {MAX_EVENTS_BYTES // MiB} MiB of answers"
                return
            *lines, rest = (tail + chunk).split(b"\n")
            for line in lines:
                if skipping:
                    skipping = False
                    continue
                size = line.count(b",") + line.count(b"{") + line.count(b"[")  # what parsing it would make
                if size > MAX_LINE_ITEMS or items + size > MAX_ITEMS or not line.startswith((b'{"e":', b"ok")):
                    outcome.dropped += 1
                    continue
                items += size
                outcome.events.append(_event(line))
            tail = rest
            if len(tail) > MAX_LINE:
                tail, skipping = b"", True
                outcome.dropped += 1


def _event(line: bytes):
    try:
        text = line.decode("utf-8")
        return json.loads(text, parse_constant=lambda c: None) if text.startswith("{") else text
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _feed(proc, job: dict) -> None:
    try:
        proc.stdin.write(json.dumps(job, ensure_ascii=True).encode())
        proc.stdin.close()
    except OSError:  # the sandbox did not start, or ended at once: its events say what they can
        pass


def _stop(proc, cgroup: Cgroup | None, mode: str) -> None:
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        with contextlib.suppress(OSError):
            target()
    if cgroup is not None:
        cgroup.kill()
    if mode == "container":
        _kill_user(NOBODY)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _kill_user(uid: int) -> None:
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)


def _data_dirs() -> list[Path]:
    from labsupport.workloads import trace_search_dirs

    return [PACKAGE.parent / "data"] + [d for _, d in trace_search_dirs()]


class NotABundle(RuntimeError):
    """Container mode was asked to delete graders that are not an autograder bundle's copy."""


def is_bundle(root: Path) -> bool:
    """Whether `root` (the folder above this labsupport) is an unzipped autograder bundle: it holds the bundle's
    run_autograder, and it is no git checkout (a repository's graders and lab sources are never deleted)."""
    return (root / "run_autograder").is_file() and not (root / ".git").exists()


def forget_graders() -> None:
    """Container mode: delete the graders (and the lab sources) from disk once they are loaded, so that
    nothing of the student's that runs later can read them.  Only ever a bundle's copy: anywhere else (a
    repository, an installed package) this refuses, and deletes nothing."""
    root = PACKAGE.parent
    if not is_bundle(root):
        raise NotABundle(f"container mode deletes the graders before a notebook runs, so it runs only from an "
                         f"autograder bundle (`python -m labsupport autograder`); {root} is not one, and its "
                         f"graders stay where they are")
    for folder in (GRADERS, root / "solutions"):
        shutil.rmtree(folder, ignore_errors=True)
