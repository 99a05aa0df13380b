"""Where student code runs while `grade` grades it: a sandbox per notebook (every lab).

Every process of a notebook being graded (kernel, worker, anything they start) runs in the best
of three modes this machine allows, probed once per run (GRADING.md, "Isolation"):

  bubblewrap  its own pid, network, IPC and UTS namespaces, its own user id, no capabilities, and
              a read-only view of only the system, the interpreter, the private labsupport and the
              data, plus its own scratch and /tmp.  Killing its bwrap process kills it all.
  uid         no namespaces here: its own user id, no capabilities, the graders' files root-only;
              that user's processes are killed after the notebook.
  none        not root and no bubblewrap: student code runs as you.

User ids are lent machine-wide: each has a lock file in a root-only folder (LOCKS), flocked by the
slot holding it, so two `grade` runs never share one.  $LABSUPPORT_GRADE_ISOLATION=uid|none forces a mode.

    python -I sandbox.py UID -- COMMAND...   (inside the sandbox: become UID, then run COMMAND)
    python -I sandbox.py UID --kill-all      (uid mode: kill, as UID, every process of UID)
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UIDS = range(61000, 61256)  # the user ids lent to student code, machine-wide
LOCKS = Path("/run" if os.path.isdir("/run") else tempfile.gettempdir()) / "labsupport-grade-uids"
MODE_ENV = "LABSUPPORT_GRADE_ISOLATION"
LAUNCHER = Path(__file__).read_bytes()  # this file as the grader read it, copied into each job as launch.py
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
# per-process limits for student code: processes of its user (a fork bomb), bytes per file, no core dumps
LIMITS = {"RLIMIT_NPROC": 256, "RLIMIT_FSIZE": 4 * 2**30, "RLIMIT_CORE": 0}


def drop_to(uid: int) -> None:
    """Become `uid` (and its own group) for good, with no capabilities and no way to gain any."""
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    for name, limit in LIMITS.items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    for cap in range(64):  # the bounding set too, so nothing executed later can hold one
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # without PR_SET_KEEPCAPS this clears every capability
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("the user id did not change")


class SandboxError(OSError):
    """The machine-wide lock folder cannot be trusted (the message says why, in one line)."""


def _lock_folder(folder: Path) -> int:
    """A descriptor of `folder`, made if missing; refused unless it is this user's own and no one else's."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    try:  # never through a symlink planted at its name
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"{folder}: cannot open the user-id lock folder ({exc.strerror}); remove it") from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise SandboxError(f"{folder}: the user-id lock folder must be a folder of user {os.geteuid()} that no one "
                           f"else may enter (it is owned by {info.st_uid}, mode {info.st_mode & 0o777:o}); remove it")
    return fd


def kill_all_of(uid: int) -> None:
    """SIGKILL every process of `uid`, from a process of `uid`: kill(-1) reaches only what it may signal.

    It returns once /proc lists none of them (not even as a zombie, which still counts against the
    next holder's process limit), or after a few seconds.
    """
    subprocess.run([sys.executable, "-I", str(Path(__file__).resolve()), str(uid), "--kill-all"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                   env={}, timeout=60, check=False)


def _kill_everything_i_may() -> None:
    me = os.getpid()
    for _ in range(150):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        if not [pid for pid in _processes_of(os.getuid()) if pid != me]:
            return
        time.sleep(0.02)


def _processes_of(uid: int) -> list[int]:
    def owner(entry: Path) -> int | None:
        with contextlib.suppress(OSError):
            return entry.stat().st_uid
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and owner(e) == uid]


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def link(real: Path, seen: Path) -> None:
    """`seen` becomes a link to the folder `real` (where nothing is bound: uid mode, or no sandbox)."""
    seen.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        seen.symlink_to(real, target_is_directory=True)


class Slot:
    """One notebook's sandbox: a user id held by this process (an flock on its lock file) until `release`."""

    def __init__(self, sandbox: "Sandbox", uid: int, lock_fd: int):
        self.sandbox, self.uid, self._lock_fd = sandbox, uid, lock_fd
        self.job: Path | None = None  # the notebook's folder (`enter`): the only one of the grader's the sandbox sees
        self.data: list[tuple[Path, Path]] = []  # (real folder, where the labs look for it), read-only

    def enter(self, job: Path) -> None:
        """Run in `job`: the one folder of the grader's the sandbox sees (its *_site folders read-only)."""
        self.job = Path(job)
        (self.job / "launch.py").write_bytes(LAUNCHER)
        if os.geteuid() == 0:  # the slot's user passes through to its own folders, listing none
            os.chmod(self.job.parent, 0o711)
            os.chmod(self.job, 0o711)

    def show(self, real: Path, seen: Path) -> None:
        """Let the sandbox see the folder `real`, read-only, at `seen`."""
        if self.sandbox.mode != "bubblewrap":
            return link(real, seen)
        seen.mkdir(parents=True, exist_ok=True)  # a mount point, bound over: never a link out
        self.data.append((real, seen))

    def command(self, argv: list[str], rooms: list[Path] | None = None) -> list[str]:
        """`argv` as it runs in this slot's sandbox: with `rooms`, it sees only those folders of the job
        (writable) and the job's sites, not the whole job (the worker never sees what the kernel wrote)."""
        if self.sandbox.mode == "uid":  # this file run as a script, isolated: the standard library only
            return [sys.executable, "-I", str(Path(__file__).resolve()), str(self.uid), "--", *argv]
        if self.job is None:
            raise RuntimeError("a bubblewrap slot runs in a job folder: enter() it first")
        args = [shutil.which("bwrap") or "/usr/bin/bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--unsetenv", "JPY_PARENT_PID"]  # ipykernel must not watch for a parent it cannot see
        for p in filter(os.path.lexists, SYSTEM):
            args += ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
        args += [a for d in map(str, sorted(Path("/dev").glob("nvidia*"))) for a in ("--dev-bind", d, d)]
        binds = [("--ro-bind", Path(p), Path(p)) for p in (sys.base_prefix, sys.prefix)]
        if rooms is None:
            binds += [("--bind", self.job, self.job)]
        else:
            launcher = self.job / "launch.py"
            binds += [("--ro-bind", launcher, launcher)] + [("--bind", Path(r), Path(r)) for r in rooms]
        binds += [("--ro-bind", s, s) for s in sorted(self.job.glob("*_site"))]
        binds += [("--ro-bind", real, seen) for real, seen in self.data]
        system = [Path(p) for p in SYSTEM if os.path.isdir(p) and not os.path.islink(p)]
        bound, made = list(system), {Path("/tmp")}  # folders whose insides are real (nothing is made there)
        for flag, real, seen in binds:
            if real == seen and any(_within(seen, s) for s in system):
                continue  # already in view (an interpreter under /usr)
            for folder in reversed(seen.parents[:-1]):  # the folders above it: empty, passable
                if folder not in made and not any(_within(folder, b) for b in bound):
                    args += ["--perms", "0755", "--dir", str(folder)]
                    made.add(folder)
            args += [flag, str(real), str(seen)]
            bound.append(seen)
        inside = [sys.executable, "-I", str(self.job / "launch.py"), str(self.uid), "--"] if self._lock_fd >= 0 else \
            ["--unshare-user", "--cap-drop", "ALL"]  # root becomes the slot's user inside; others stay themselves
        return [*args, *inside, *argv]

    def own(self, *paths: Path) -> None:
        """Give the slot's user the folders it must write (its scratch, its copy of the notebook's folder)."""
        if os.geteuid() != 0:
            return
        for top in map(Path, paths):
            if not top.exists():
                continue
            os.chown(top, self.uid, self.uid)
            for root, dirs, files in os.walk(top):
                for name in dirs + files:
                    with contextlib.suppress(OSError):
                        os.chown(os.path.join(root, name), self.uid, self.uid, follow_symlinks=False)

    def kill_all(self) -> None:
        """uid mode: every process of this slot's user, and only those (in bubblewrap a sandbox dies with its bwrap)."""
        if self.sandbox.mode != "uid":
            return
        if self._lock_fd < 0:
            raise RuntimeError(f"user {self.uid} is no longer held by this process")
        kill_all_of(self.uid)

    def release(self) -> None:
        if self._lock_fd < 0:
            return
        self.kill_all()
        os.close(self._lock_fd)  # the lock goes with it
        self._lock_fd = -1


class Sandbox:
    """Sandboxes for student code, one `Slot` per notebook; `for_this_machine` returns the best mode that works."""

    def __init__(self, mode: str = "bubblewrap", locks: Path = LOCKS, uids: range = UIDS):
        self.mode, self.locks, self.uids = mode, Path(locks), uids

    @classmethod
    def for_this_machine(cls, prepare: bool = True) -> "Sandbox | None":
        """bubblewrap where it runs, else (as root) a user id of its own, else None (student code runs as you).

        Without `prepare` (doctor), uid mode is not readied (nor tried, as it then may not run yet).
        """
        forced = os.environ.get(MODE_ENV, "")
        if sys.platform != "linux" or forced == "none":
            return None
        if forced != "uid" and (sandbox := cls("bubblewrap")).works():
            return sandbox
        if os.geteuid() != 0:
            return None
        sandbox = cls("uid")
        if prepare:
            sandbox.prepare_machine()
        return sandbox if not prepare or sandbox.works() else None

    def prepare_machine(self) -> None:
        """uid mode: the graders' files root-only, and the interpreter's folders passable (not listable) by all."""
        import labsupport

        repo = Path(labsupport.__file__).resolve().parent.parent
        for folder in (repo / "labsupport" / "course" / "checkoffs", repo / "solutions"):
            with contextlib.suppress(OSError):
                if folder.is_dir() and folder.stat().st_uid == 0:
                    os.chmod(folder, 0o700)
        for prefix in {Path(sys.base_prefix), Path(sys.prefix)}:  # a pyenv under /root, say
            for folder in prefix.parents:
                with contextlib.suppress(OSError):
                    mode = folder.stat().st_mode
                    if not mode & 0o001:
                        os.chmod(folder, (mode & 0o7777) | 0o001)

    def works(self) -> bool:
        """Can a slot's user run this interpreter (and numpy) here?"""
        slot = self.acquire()
        scratch = Path(tempfile.mkdtemp(prefix="labsupport-probe-"))
        try:
            (scratch / "job").mkdir()
            slot.enter(scratch / "job")
            probe = subprocess.run(slot.command([sys.executable, "-c", "import os, numpy; print(os.getuid())"]),
                                   capture_output=True, text=True, timeout=120, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            return False
        finally:
            slot.release()
            shutil.rmtree(scratch, ignore_errors=True)
        return probe.returncode == 0 and probe.stdout.strip() == str(slot.uid)

    def describe(self) -> str:
        who = f"a user id of its own ({self.uids.start}-{self.uids.stop - 1})" if os.geteuid() == 0 else "your user id"
        if self.mode == "bubblewrap":
            return f"bubblewrap ({who}, no capabilities, own pid/net/ipc namespaces, read-only view, own scratch and /tmp)"
        return f"uid (no namespaces here: {who}, no capabilities, graders root-only; /proc shows the grader's argv)"

    def try_acquire(self) -> Slot | None:
        """A user id no process on this machine holds now, or None when every one is taken."""
        if os.geteuid() != 0:  # no user ids to lend: bubblewrap maps the sandbox to this user's own
            return Slot(self, os.getuid(), -1)
        folder = _lock_folder(self.locks)
        try:
            for uid in self.uids:
                fd = os.open(f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=folder)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                slot = Slot(self, uid, fd)
                slot.kill_all()  # uid mode: whatever a holder that died left running
                return slot
        finally:
            os.close(folder)
        return None

    def acquire(self) -> Slot:
        while (slot := self.try_acquire()) is None:
            time.sleep(0.5)
        return slot


def describe(sandbox: Sandbox | None) -> str:
    """The isolation mode in one line (grade prints it at start; doctor reports it)."""
    if sandbox is not None:
        return sandbox.describe()
    why = "forced by $" + MODE_ENV if os.environ.get(MODE_ENV) == "none" else \
        "not root, and bubblewrap cannot run here"
    return f"none ({why}): student code runs as you and could change your files; grade untrusted work as root"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[1] == "--kill-all":
        drop_to(int(argv[0]))
        if os.getuid() == 0 or os.geteuid() == 0:  # kill(-1) as root would reach every process there is
            return 2
        _kill_everything_i_may()
        return 0
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -I sandbox.py UID -- COMMAND... | UID --kill-all", file=sys.stderr)
        return 2
    drop_to(int(argv[0]))
    os.execv(argv[2], argv[2:])
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
