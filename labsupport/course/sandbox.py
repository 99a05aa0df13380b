"""Where a handed-in notebook runs while `grade` grades it: one sandbox per notebook, every resource bounded.

Three modes (GRADING.md, "Isolation"); `grade` prints the one it uses:

  bubblewrap  (the default where it works) Debian's bwrap: its own user namespace (no capabilities,
              no user namespaces of its own), pid, network, IPC, UTS and cgroup namespaces, and a
              read-only view of the system, the interpreter and its packages, the labs' data, the
              notebook's folder and, at the package's path, a student-side copy of labsupport
              (`student_package`: no staff code, no bytecode).  Its root is read-only; everything it may
              write is a sized tmpfs of its own: its scratch (/scratch), /tmp and /dev/shm.  As root, each
              sandbox runs under a host uid of its own (`own_uid`), so RLIMIT_NPROC counts it alone.
  container   (Gradescope: one container per submission, run as root) the grader deletes the graders and
              the package's bytecode from disk and closes the package (`forget_graders`), and runs the
              notebook on the student-side copy as an unprivileged user with no capabilities through
              util-linux's setpriv, bounded by prlimit.
  trusted     (``--trusted``) no isolation: the notebook runs as you.  For notebooks you wrote.

Bounds (`Bounds`): memory, tmpfs pages included (a cgroup's memory.max or memory.limit_in_bytes;
without a cgroup, RLIMIT_AS per process); processes (pids.max, else RLIMIT_NPROC on the sandbox's own
uid; without a cgroup or root, grade refuses); CPU seconds (RLIMIT_CPU); bytes per file (RLIMIT_FSIZE);
the sizes of scratch, /tmp and /dev/shm; and wall time (the grader kills the sandbox).  The row of a
notebook names the cgroup's bounds and the time it met; an rlimit or a full tmpfs fails the call that
met it, inside the notebook.  The notebook's output goes nowhere; its events come back on one pipe the
grader reads with a cap.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labsupport import card
from labsupport.course import runner
from labsupport.course.runner import python

PACKAGE = Path(__file__).resolve().parents[1]
GRADERS = PACKAGE / "course" / "checkoffs"  # never seen by student code
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc, only what an interpreter, its libraries and a shell read (run as root, the sandbox's user is root's
# on the host's files: /etc/shadow, private keys and the like must not be in its view at all).
ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
       "hosts", "host.conf", "alternatives", "mime.types", "fonts", "os-release", "debian_version", "ssl/certs",
       "ca-certificates", "bash.bashrc", "profile", "inputrc", "locale.alias", "magic", "magic.mime")
# Staff-only parts of the package (relative to labsupport/): what no student code may see, as source or as bytecode.
# One list, one rule (`student_files`): the student release leaves these out, and so does the copy of the package a
# grading sandbox sees; the release also leaves out GRADING_ONLY, which the sandbox runs.  The graders, the staff
# commands and the ledger command's one-call answers.  (viz/board/ stays: lab 08 draws its map of Part II with it;
# the board notebook itself is not in the release.)
STAFF_ONLY = ("course/checkoffs", "course/build.py", "course/grade.py", "course/registry.py", "course/report.py",
              "course/release.py", "course/autograder.py", "course/scaffold.py", "bench/notebooks.py",
              "bench/grade.py", "bench/plans.py", "cli/ledger.py")
GRADING_ONLY = ("course/sandbox.py", "course/runner.py")
NOBODY = 65534
MAX_EVENTS_BYTES = 64 * 2**20  # read back from one sandbox; the rest is dropped
MAX_LINE = 17 * 2**20  # one event's characters (the runner sends an answer of up to 16 MiB)
MAX_LINE_ITEMS, MAX_ITEMS = 500_000, 2_000_000  # what parsing one event, and all of them, may make
MiB, GiB = 2**20, 2**30


def student_files(package: Path = PACKAGE, leave_out: tuple = STAFF_ONLY) -> list[tuple[Path, str]]:
    """(file, its path under labsupport/) of each file of `package` student code may see: no bytecode at all (a
    staff module's would run without its source), nothing under `leave_out`."""
    kept = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package).as_posix()
        staff = any(rel == s or rel.startswith(s + "/") for s in leave_out)
        if path.is_file() and "__pycache__" not in rel.split("/") and path.suffix not in (".pyc", ".pyo") and not staff:
            kept.append((path, rel))
    return kept


_COPY_LOCK = threading.Lock()
_COPY: list[Path] = []  # this process's student-side copy, once made


def student_package() -> Path:
    """A folder holding `labsupport`: the package as student code may see it (`student_files`), read-only and
    readable by every uid.  Made once per content (its hash names it in the temp folder) and reused; a sandbox sees
    it at the package's own path, so nothing of the staff's is there to read, mask or not."""
    with _COPY_LOCK:
        if not (_COPY and (_COPY[0] / "labsupport").is_dir()):
            _COPY[:] = [_make_student_copy(student_files())]
        return _COPY[0]


def _make_student_copy(files: list[tuple[Path, str]]) -> Path:
    digest = hashlib.sha256(card.card_text().encode())
    for path, rel in files:
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    final = Path(tempfile.gettempdir()) / f"labsupport-student-{digest.hexdigest()[:24]}"
    if _sealed_and_ours(final):
        return final
    staging = Path(tempfile.mkdtemp(prefix="labsupport-student-", dir=final.parent))
    for path, rel in files:
        (staging / "labsupport" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, staging / "labsupport" / rel)
    # the course card inside the package: a sandbox sees the package alone, and its labs must run on the card the
    # graders computed the expected values on (labsupport.card reads this copy when no course.toml is beside it)
    (staging / "labsupport" / "course.toml").write_text(card.card_text(), encoding="utf-8")
    _seal(staging)
    try:
        os.rename(staging, final)
    except OSError:  # another grade made it first, or something else is in the way: use ours where it is
        if not _sealed_and_ours(final):
            return staging
        _remove_sealed(staging)
    return final


def _seal(top: Path) -> None:
    """Every file of `top` read-only for all, every folder readable and unwritable by all (the sandbox's uid reads
    it; nobody, its maker aside, can change it)."""
    for root, dirs, files in os.walk(top):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
    for root, dirs, _ in os.walk(top, topdown=False):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(top, 0o555)


def _sealed_and_ours(folder: Path) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o222
            and (folder / "labsupport" / "course" / "runner.py").is_file())


def _remove_sealed(folder: Path) -> None:
    for root, dirs, _ in os.walk(folder):
        os.chmod(root, 0o755)
    shutil.rmtree(folder, ignore_errors=True)


UID_BASE, UID_COUNT = 1_640_000_000, 65_536  # each sandbox's own host uid: never a real account's


@contextlib.contextmanager
def own_uid():
    """A host uid that no other sandbox holds while this one runs (a lock file per uid, in a folder only this user
    can write), with none of its processes alive: RLIMIT_NPROC on it counts this sandbox's processes alone."""
    folder = Path(tempfile.gettempdir()) / f"labsupport-uids-{os.geteuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if os.lstat(folder).st_uid != os.geteuid() or os.path.islink(folder):
        raise OSError(f"{folder} is not this user's own folder")
    start = secrets.randbelow(UID_COUNT)
    for i in range(UID_COUNT):
        uid = UID_BASE + (start + i) % UID_COUNT
        fd = os.open(folder / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            _kill_user(uid)  # a process left by a grader that was killed itself
            yield uid
        finally:
            _kill_user(uid)
            os.close(fd)
        return
    raise OSError("every sandbox uid is in use")


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

    @staticmethod
    def available() -> set[str]:
        """What a sandbox's cgroup would bound here ("memory", "pids", "cpu"): nothing where none can be made."""
        return Cgroup(_cgroup_parents()).covers()

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
    """Where this process may make child cgroups: v2 with memory, pids and cpu delegated, else v1's hierarchies;
    none when LABSUPPORT_NO_CGROUP is set (GRADING.md: tests use it, and so may a host whose cgroups misbehave)."""
    if os.environ.get("LABSUPPORT_NO_CGROUP"):  # a test and ops switch: grade as on a host that makes none
        return {}
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
    notes: list = field(default_factory=list)  # the sandbox's own notes (never read from the events inside it)


class Sandbox:
    def __init__(self, mode: str, bounds: Bounds = Bounds()):
        self.mode, self.bounds = mode, bounds
        # bubblewrap as root: each sandbox under a host uid of its own (`own_uid`), so that RLIMIT_NPROC counts its
        # processes alone where no cgroup does (root itself is exempt from it, and shares it with the grader)
        self.own_uids = mode == "bubblewrap" and os.geteuid() == 0 and bool(shutil.which("setpriv"))

    @classmethod
    def for_this_machine(cls, trusted: bool = False, container: bool = False, bounds: Bounds = Bounds()) -> "Sandbox | None":
        """The mode asked for; else bubblewrap when it works here, every bound with it; else None (grade refuses,
        saying `missing()`)."""
        if container:
            return cls("container", bounds)
        sandbox = cls("bubblewrap", bounds)
        if not sandbox.missing():
            return sandbox
        return cls("trusted", bounds) if trusted else None

    def missing(self) -> str:
        """What this machine lacks for a bubblewrap sandbox with every bound, in words; "" when nothing."""
        if sys.platform != "linux" or not shutil.which("bwrap"):
            return "bubblewrap is not installed (apt-get install bubblewrap)"
        if not shutil.which("prlimit") or (self.own_uids and not shutil.which("unshare")):
            return "util-linux's prlimit and unshare are not both installed"
        if not {"memory", "pids"} <= Cgroup.available() and not self.own_uids:
            return ("no cgroup can be made here for a sandbox's memory and processes, and without one each sandbox "
                    "needs a host uid of its own (grade as root, with util-linux's setpriv)")
        if not self.works():
            return "bubblewrap cannot start a sandbox here (user namespaces not allowed?)"
        return ""

    def works(self) -> bool:
        """Can bwrap start this interpreter here (user namespaces allowed, labsupport in view, as its own uid)?"""
        probe = "import json, os, sys, labsupport; os.write(json.load(sys.stdin)['events_fd'], b'ok\\n')"
        try:
            with tempfile.TemporaryDirectory(prefix="labsupport-probe-") as empty:
                out = self.run({}, Path(empty), deadline=time.monotonic() + 120, command=python("-c", probe))
        except OSError:
            return False
        return out.events == ["ok"]

    def describe(self) -> str:
        covered = Cgroup.available()
        memory = "a cgroup" if "memory" in covered else \
            "RLIMIT_AS per process, RLIMIT_NPROC processes (no cgroup to make here)"
        if self.mode == "bubblewrap":
            uid = ", a host uid of its own" if self.own_uids else ""
            return (f"bubblewrap (own user, pid, net, ipc namespaces{uid}, no capabilities, read-only root, a copy "
                    f"of labsupport without staff code or bytecode; bounds: {self.bounds.describe()}; memory "
                    f"counted by {memory})")
        if self.mode == "container":
            return (f"container (graders and staff bytecode deleted and the package unreadable before the notebook "
                    f"runs on a copy without them, user {NOBODY} without capabilities; bounds: "
                    f"{self.bounds.describe()}; memory counted by {memory})")
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

    def _bwrap(self, folder: Path, argv: list[str], stage: dict | None = None) -> list[str]:
        """bwrap's command line; a view in `stage` (its path -> where `_staged` binds it) is bound from there."""
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
        # its own filesystems first, so that a view below /tmp (a clone, a bundle) is bound on top of them; every
        # one sized, and the root (bwrap's own tmpfs) made read-only once all is mounted, so nothing unsized is
        # left to fill
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(b.shm), "--tmpfs", "/dev/shm",
                 "--size", str(b.tmp), "--tmpfs", "/tmp", "--size", str(b.scratch), "--tmpfs", "/scratch"]
        for seen, real in _views():
            source = (stage or {}).get(real, real)
            args += ["--ro-bind", source, seen] + (["--ro-bind", source, real] if real != seen else [])
        # labsupport as student code may see it, where the package is: staff code is not there to be masked
        args += ["--ro-bind", str(student_package() / "labsupport"), str(PACKAGE)]
        args += [a for d in map(str, sorted(Path("/dev").glob("nvidia*"))) for a in ("--dev-bind", d, d)]
        args += ["--ro-bind", str(folder), "/submission", "--remount-ro", "/dev", "--remount-ro", "/"]
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

    def command(self, folder: Path, scratch: Path, cgroup: Cgroup | None, argv: list[str],
                uid: int | None = None) -> tuple[list[str], dict]:
        """The whole command line, and the environment it starts with."""
        attach = "".join(f'echo $$ > "{p}" && ' for p in (cgroup.procs if cgroup else []))
        inner = self._limits(cgroup)
        if self.mode == "bubblewrap" and uid is not None:
            # a view its uid cannot reach (a folder above it closed to others, as a pyenv interpreter's in /root)
            stage = {real: str(scratch / "view" / str(n)) for n, (_, real) in enumerate(_views())
                     if not _open_to_all(Path(real))}
            inner += _staged(stage) + _as_user(uid) + self._bwrap(folder, argv, stage)
        elif self.mode == "bubblewrap":
            inner += self._bwrap(folder, argv)
        elif self.mode == "container":
            inner += [*_as_user(NOBODY), *argv]
        else:
            inner += argv
        env = {} if self.mode == "bubblewrap" else dict(self._env(str(scratch)), PATH=os.environ.get("PATH", ""))
        if self.mode == "container":  # the student-side copy lies elsewhere: the labs' data stays where it is
            env.setdefault("LABSUPPORT_DATA", str(PACKAGE.parent / "data"))
        return ["/bin/sh", "-c", attach + 'exec "$@"', "sh", *inner], env

    def run(self, job: dict, folder: Path, deadline: float, command: list[str] | None = None) -> Outcome:
        """Run the runner (or `command`) on `job` in a fresh sandbox; its events, whatever happens."""
        with (own_uid() if self.own_uids else contextlib.nullcontext()) as uid:
            return self._run(job, folder, deadline, command, uid)

    def _run(self, job: dict, folder: Path, deadline: float, command: list[str] | None, uid: int | None) -> Outcome:
        scratch = Path(tempfile.mkdtemp(prefix="labsupport-grade-"))
        cgroup = Cgroup.make(self.bounds) if self.mode != "trusted" else None
        outcome = Outcome()
        if uid is not None:  # what the sandbox's own uid reads: a copy of the folder, its own
            folder, left = _folder_for(uid, folder, scratch)
            if left:
                outcome.notes.append(runner.not_copied(left))
        if self.mode != "bubblewrap":
            job = dict(job, work=str(scratch / "work"), folder=str(folder))
            if self.mode == "container":
                os.chown(scratch, NOBODY, NOBODY)
        else:
            job = dict(job, work="/scratch/work", folder="/submission")
        start = python("labsupport.course.runner", root=student_package() if self.mode == "container" else None)
        line, env = self.command(folder, scratch, cgroup, command or start, uid)
        read_end, write_end = os.pipe()
        job["events_fd"] = write_end  # inherited as it is, through the launcher and bwrap
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


def _as_user(uid: int) -> list[str]:
    """util-linux's setpriv: the rest runs as `uid` alone (no groups), with no capability it could ever regain."""
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def _open_to_all(path: Path) -> bool:
    """Whether any uid may reach `path` and list it: it, and every folder above it, open to others."""
    try:
        return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *path.parents]) and \
            bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _staged(stage: dict) -> list[str]:
    """Root, in a mount namespace of its own (nothing shows on the host), binds each folder of `stage` at its
    place (under the sandbox's scratch, which its uid passes through), then goes on with the command."""
    if not stage:
        return []
    for place in stage.values():
        os.makedirs(place)
        os.chmod(os.path.dirname(place), 0o755)
    binds = "".join(f"mount --bind {shlex.quote(real)} {shlex.quote(place)} && " for real, place in stage.items())
    return [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            binds + 'exec "$@"', "sh"]


def _views() -> list[tuple[str, str]]:
    """(path seen, real path) of the interpreter, its packages and the labs' data, outside the system folders."""
    system = [p for p in SYSTEM if os.path.lexists(p) and not os.path.islink(p)]
    views = [Path(sys.base_prefix), Path(sys.prefix)] + _data_dirs()
    return [(str(seen), str(seen.resolve())) for seen in dict.fromkeys(v.absolute() for v in views if v.exists())
            if not any(str(seen).startswith(s + "/") for s in system)]


def _folder_for(uid: int, folder: Path, scratch: Path) -> tuple[Path, int]:
    """The notebook's folder copied (as the runner copies it: bounded) where `uid` alone reads it, under `scratch`
    (which it may only pass through); the copy, and how many files did not fit."""
    copy = scratch / "submission"
    left = runner.copy_folder(str(folder), str(copy)) if folder.is_dir() else 0
    os.chmod(scratch, 0o711)
    for root, dirs, files in os.walk(copy):
        for name in [*dirs, *files, None]:
            os.lchown(os.path.join(root, name) if name else root, uid, uid)
    return copy, left


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
    """Container mode: delete the graders, the lab sources and the package's bytecode from disk once they are
    loaded, and close the package to other users, so that nothing of the student's that runs later can read them.
    Only ever a bundle's copy: anywhere else (a repository, an installed package) this refuses, and deletes nothing."""
    root = PACKAGE.parent
    if not is_bundle(root):
        raise NotABundle(f"container mode deletes the graders before a notebook runs, so it runs only from an "
                         f"autograder bundle (`python -m labsupport autograder`); {root} is not one, and its "
                         f"graders stay where they are")
    for folder in (GRADERS, root / "solutions", *PACKAGE.rglob("__pycache__")):  # a staff module's bytecode runs too
        shutil.rmtree(folder, ignore_errors=True)
    # and what is left of the package is the grader's alone: the notebook imports the student-side copy
    os.chmod(PACKAGE, 0o700)
