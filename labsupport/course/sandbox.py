"""Where student code runs when `grade` runs as root (Gradescope's containers): as a user of its own.

Run as root, the grader gives every notebook it is grading a user id of its own (from UIDS, one
per notebook being graded on the machine) and starts that notebook's kernel and worker through
this module's launcher, which drops to that id before it runs them.  The student's code then cannot write
labsupport's or anyone's files, cannot signal or read the grader (a different user, no ptrace),
cannot write another notebook's kernel or scratch folder, and cannot fork without bound or write a
file without end (LIMITS); when the notebook is done, every process of its user id is killed, so
nothing it started lives on into the next one.  Where the interpreter and its libraries live where
only root may read (a pyenv under /root, say), the launcher keeps one capability,
CAP_DAC_READ_SEARCH (read any file, write none); it is not used where it is not needed.

A user id is lent machine-wide, not per grader: each one has a lock file in a folder only root may
enter (LOCKS), and a slot holds an flock on it for as long as it lives, so two `grade` runs at once
on one machine never share a user id; a holder that crashes lets go of its lock with its last file
descriptor, and the next holder first kills whatever that id left running.  Killing is done *as*
the slot's user (kill(-1) from a process of that user), so it reaches that user's processes and no
one else's, however pids are reused.

Not root, there is no second user to run as: the grader then relies on its other defences (a
private copy of labsupport per notebook, answers as plain data, verdicts outside), and a notebook
could still disturb the grader's own process; grade hostile submissions as root in a container, as
Gradescope does.

    python -I labsupport/course/sandbox.py UID [--read-all] -- COMMAND...   (the launcher; grade only)
    python -I labsupport/course/sandbox.py UID --kill-all                  (kills, as UID, all of UID's)
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UIDS = range(61000, 61256)  # the user ids lent to student code, machine-wide
LOCKS = Path("/run" if os.path.isdir("/run") else tempfile.gettempdir()) / "labsupport-grade-uids"
CAP_DAC_READ_SEARCH = 2
PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 38, 47, 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# per-process limits for student code: processes of its user (a fork bomb), bytes per file, no core dumps
LIMITS = {"RLIMIT_NPROC": 256, "RLIMIT_FSIZE": 4 * 2**30, "RLIMIT_CORE": 0}


def drop_to(uid: int, read_all: bool = False) -> None:
    """Become `uid` (and its own group) for good; with `read_all`, keep CAP_DAC_READ_SEARCH and nothing else."""
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    for name, limit in LIMITS.items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    os.setgroups([])
    if read_all and libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if read_all:
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        bit = 1 << CAP_DAC_READ_SEARCH
        data[0].effective = data[0].permitted = data[0].inheritable = bit
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_RAISE)")
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
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class Slot:
    """One user id, held by this process (an flock on its lock file) until `release`."""

    def __init__(self, sandbox: "Sandbox", uid: int, lock_fd: int):
        self.sandbox, self.uid, self._lock_fd = sandbox, uid, lock_fd

    def command(self, argv: list[str]) -> list[str]:
        # this file run as a script, isolated (-I): the launcher imports nothing but the standard library
        flag = ["--read-all"] if self.sandbox.read_all else []
        return [sys.executable, "-I", str(Path(__file__).resolve()), str(self.uid), *flag, "--", *argv]

    def reach(self, *folders: Path) -> None:
        """Let the slot's user pass through these (root's) folders to its own, without listing them."""
        for folder in folders:
            os.chmod(folder, 0o711)

    def own(self, *paths: Path) -> None:
        """Give the slot's user the folders it must write (its scratch, its copy of the notebook's folder)."""
        for top in paths:
            top = Path(top)
            if not top.exists():
                continue
            os.chown(top, self.uid, self.uid)
            for root, dirs, files in os.walk(top):
                for name in dirs + files:
                    try:
                        os.chown(os.path.join(root, name), self.uid, self.uid, follow_symlinks=False)
                    except OSError:
                        pass

    def kill_all(self) -> None:
        """Every process of this slot's user, and only those (the slot must still be held)."""
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
    """User ids for student code, lent one per notebook; `for_this_machine` returns one only where it works."""

    def __init__(self, read_all: bool = False, locks: Path = LOCKS, uids: range = UIDS):
        self.read_all, self.locks, self.uids = read_all, Path(locks), uids

    @classmethod
    def for_this_machine(cls) -> "Sandbox | None":
        """A sandbox where root can lend user ids and such a user can run this interpreter.

        Without CAP_DAC_READ_SEARCH if possible: with it, a notebook could read (not write) other
        notebooks' scratch, the kernels' connection files among them, so it is used only where the
        interpreter itself is readable by root alone (a pyenv under /root, as on this course's machines).
        """
        if sys.platform != "linux" or os.geteuid() != 0 or os.environ.get("LABSUPPORT_NO_SANDBOX"):
            return None
        for read_all in (False, True):
            sandbox = cls(read_all=read_all)
            if sandbox._works():
                return sandbox
        print("grade: note: cannot run student code as a separate user here; it runs as root, with the "
              "grader's other defences only", file=sys.stderr)
        return None

    def _works(self) -> bool:
        slot = self.acquire()
        try:  # the interpreter, its standard library and site-packages must be readable as that user
            probe = subprocess.run(slot.command([sys.executable, "-c", "import os, json, numpy; print(os.getuid())"]),
                                   capture_output=True, text=True, timeout=120, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            return False
        finally:
            slot.release()
        return probe.returncode == 0 and probe.stdout.strip() == str(slot.uid)

    def try_acquire(self) -> Slot | None:
        """A user id no process on this machine holds now, or None when every one is taken."""
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
                if os.geteuid() == 0:
                    slot.kill_all()  # whatever a holder that died left running
                return slot
        finally:
            os.close(folder)
        return None

    def acquire(self) -> Slot:
        while (slot := self.try_acquire()) is None:
            time.sleep(0.5)
        return slot


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[1] == "--kill-all":
        drop_to(int(argv[0]))
        if os.getuid() == 0 or os.geteuid() == 0:  # kill(-1) as root would reach every process there is
            return 2
        _kill_everything_i_may()
        return 0
    read_all = len(argv) > 1 and argv[1] == "--read-all"
    rest = argv[2:] if read_all else argv[1:]
    if not argv or not rest or rest[0] != "--" or len(rest) < 2:
        print("usage: python -I sandbox.py UID [--read-all] -- COMMAND... | UID --kill-all", file=sys.stderr)
        return 2
    drop_to(int(argv[0]), read_all)
    os.execv(rest[1], rest[1:])
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
