"""Where student code runs when `grade` runs as root (Gradescope's containers): as a user of its own.

Run as root, the grader gives every notebook it is grading a fresh user id of its own (61000 and up,
one per concurrent job) and starts that notebook's kernel and worker through this module's
launcher, which drops to that id before it runs them.  The student's code then cannot write
labsupport's or anyone's files, cannot signal or read the grader (a different user, no ptrace),
cannot write another notebook's kernel or scratch folder, and cannot fork without bound or write a
file without end (LIMITS); when the notebook is done, every process of its user id is killed, so
nothing it started lives on into the next one.  Where the interpreter and its libraries live where
only root may read (a pyenv under /root, say), the launcher keeps one capability,
CAP_DAC_READ_SEARCH (read any file, write none); it is not used where it is not needed.

Not root, there is no second user to run as: the grader then relies on its other defences (a
private copy of labsupport per notebook, answers as plain data, verdicts outside), and a notebook
could still disturb the grader's own process; grade hostile submissions as root in a container, as
Gradescope does.

    python -I labsupport/course/sandbox.py UID [--read-all] -- COMMAND...   (the launcher; grade only)
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE_UID = 61000
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


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        pids.append(int(entry.name))
                    break
        except (OSError, ValueError):
            continue
    return pids


def kill_all(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left (a fork bomb is outrun, not waited for)."""
    for _ in range(50):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


class Slot:
    """One user id, lent to one notebook at a time."""

    def __init__(self, sandbox: "Sandbox", uid: int):
        self.sandbox, self.uid = sandbox, uid

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

    def release(self) -> None:
        kill_all(self.uid)
        self.sandbox._free.put(self.uid)


class Sandbox:
    """A pool of user ids for student code; `for_this_machine` returns one only where it works."""

    def __init__(self, slots: int = 8, base_uid: int = BASE_UID, read_all: bool = False):
        self.read_all = read_all
        self._free: queue.Queue[int] = queue.Queue()
        for uid in range(base_uid, base_uid + slots):
            self._free.put(uid)

    @classmethod
    def for_this_machine(cls, slots: int = 8) -> "Sandbox | None":
        """A sandbox where root can lend user ids and such a user can run this interpreter.

        Without CAP_DAC_READ_SEARCH if possible: with it, a notebook could read (not write) other
        notebooks' scratch, the kernels' connection files among them, so it is used only where the
        interpreter itself is readable by root alone (a pyenv under /root, as on this course's machines).
        """
        if sys.platform != "linux" or os.geteuid() != 0 or os.environ.get("LABSUPPORT_NO_SANDBOX"):
            return None
        for read_all in (False, True):
            sandbox = cls(slots, read_all=read_all)
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

    def acquire(self) -> Slot:
        return Slot(self, self._free.get())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    read_all = len(argv) > 1 and argv[1] == "--read-all"
    rest = argv[2:] if read_all else argv[1:]
    if not argv or not rest or rest[0] != "--" or len(rest) < 2:
        print("usage: python -I sandbox.py UID [--read-all] -- COMMAND...", file=sys.stderr)
        return 2
    drop_to(int(argv[0]), read_all)
    os.execv(rest[1], rest[1:])
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
