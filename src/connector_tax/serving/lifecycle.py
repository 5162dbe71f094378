"""No process of ours outlives its owner, and no two writers share a study.

* `die_with_parent` (a child's preexec): the kernel SIGKILLs the child when the process that
  started it dies, by any signal, kill -9 included.
* `GroupWatchdog`: a server's own children (vLLM's engine core and workers) are in the server's
  process group but have no parent-death signal. A tiny process in its own session holds the
  read end of a pipe whose write end only the owner has; when the owner dies the pipe closes and
  the watchdog SIGKILLs the whole group. A clean stop tells it so first.
* `AncestorWatch`: a pipeline job stops itself (as on Ctrl-C) when the snakemake that started it
  is gone — killed with -9, say — so an orphaned job never keeps measuring beside a new run.
* `stop_on_signals`: SIGTERM and SIGHUP become KeyboardInterrupt, so a closed terminal or a
  scheduler's TERM unwinds a job the way Ctrl-C does (server stopped, interrupted cell left for
  the next run, index written).
* `exclusive_lock`: an flock on a file opened O_NOFOLLOW, 0600; the kernel releases it when the
  holder dies.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import psutil

_PR_SET_PDEATHSIG = 1

# Run by the watchdog's interpreter (-I -S: nothing of the environment, nothing imported but os).
_WATCHDOG = """
import os, signal, sys
pgid, fd = int(sys.argv[1]), int(sys.argv[2])
if not os.read(fd, 1):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def die_with_parent() -> None:
    """In a child before exec: SIGKILL when the launching process dies, however it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the process-group kill on every stop path still applies


class GroupWatchdog:
    """SIGKILLs process group `pgid` if this process dies before `release()`."""

    def __init__(self, pgid: int) -> None:
        read_end, self._write_end = os.pipe()  # both close-on-exec: no other child inherits them
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(pgid), str(read_end)],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of a kill of our own process group
        )
        os.close(read_end)

    def release(self) -> None:
        """The group was stopped on purpose: the watchdog leaves without killing."""
        if self._write_end < 0:
            return
        try:
            os.write(self._write_end, b"x")
        except OSError:
            pass
        os.close(self._write_end)
        self._write_end = -1
        self.proc.wait()


class AncestorWatch:
    """Interrupts the main thread (as Ctrl-C would) once an ancestor of this process is gone."""

    def __init__(self, depth: int = 2, interval_s: float = 1.0) -> None:
        self._ancestors = []
        proc = psutil.Process()
        for _ in range(depth):
            parent = proc.parent()
            if parent is None or parent.pid <= 1:
                break
            self._ancestors.append((parent.pid, parent.create_time()))
            proc = parent
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-ancestor-watch", daemon=True)
        self.gone: int | None = None

    def __enter__(self) -> AncestorWatch:
        if self._ancestors:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _alive(self, pid: int, created: float) -> bool:
        try:
            return bool(psutil.Process(pid).create_time() == created)
        except psutil.Error:
            return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for pid, created in self._ancestors:
                if not self._alive(pid, created):
                    self.gone = pid
                    os.kill(os.getpid(), signal.SIGINT)
                    return


_STOPPED: list[str] = []  # the stop signals this process received


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _STOPPED.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(f"signal {_STOPPED[-1]}")


def stop_requested() -> str | None:
    """The first stop signal (SIGTERM, SIGHUP) this process received since stop_on_signals, if any:
    an error raised while it unwinds (a server the same signal took down, a lock it left) is the
    stop, not a measurement's outcome."""
    return _STOPPED[0] if _STOPPED else None


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP unwind the main thread like Ctrl-C (call from the main thread)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def private_dir(name: str) -> Path:
    """/tmp/connector-tax-<uid>/<name>: created 0700 and checked to be ours and private (a
    predictable shared /tmp path another user created, or linked, is refused)."""
    root = Path(os.environ.get("CONNECTOR_TAX_LOCKS") or Path(tempfile.gettempdir()) / f"connector-tax-{os.getuid()}")
    for folder in (root, root / name):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise RuntimeError(
                f"{folder}: not a private directory of this user (mode {oct(info.st_mode)}, "
                f"owner {info.st_uid}); remove it or set CONNECTOR_TAX_LOCKS"
            )
    return root / name


def exclusive_lock(path: Path) -> int | None:
    """An exclusive flock on `path` (created 0600, never through a symlink): its fd, or None if
    another process holds it. Closing the fd, or dying, releases it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def lock_holder(path: Path) -> str:
    """Who holds the lock at `path`, as well as the file says (its pid)."""
    try:
        pid = int(path.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return "another process"
    try:
        return f"pid {pid} ({' '.join(psutil.Process(pid).cmdline()[:4])})"
    except psutil.Error:
        return f"pid {pid}"
