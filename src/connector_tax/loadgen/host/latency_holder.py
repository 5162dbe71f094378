"""The process that holds the CPU wake-up latency limit on behalf of a load generator (its owner).

    python -m connector_tax.loadgen.host.latency_holder OWNER_PID MAX_US DEVICE

The kernel keeps a PM QoS request while its file is open, whoever holds it, so the holder is a
process of its own, in its own session, watching its owner: the request is dropped while the
owner is stopped (SIGSTOP, Ctrl-Z: a stopped run must not keep every idle core of the host
spinning), taken again when it resumes, and dropped for good when the owner exits by any path
(parent-death signal, and a poll of the owner's pid in case that signal was lost). Its first
stdout line says how it came out: `held` or `not held: <reason>`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys
import time

POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def _owner_state(pid: int) -> str | None:
    """The owner's scheduler state letter (R, S, T, ...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _open(device: str, max_us: int) -> int:
    fd = os.open(device, os.O_WRONLY)
    try:
        os.write(fd, struct.pack("=i", max_us))  # the device takes a native s32, in µs
    except OSError:
        os.close(fd)
        raise
    return fd


def hold(owner: int, max_us: int, device: str) -> int:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the poll below still ends the hold
    try:
        fd: int | None = _open(device, max_us)
    except OSError as exc:
        print(f"not held: {device}: {exc.strerror or exc}", flush=True)
        return 1
    print("held", flush=True)
    while os.getppid() == owner:
        state = _owner_state(owner)
        if state is None:
            break
        stopped = state in ("T", "t")
        if stopped and fd is not None:
            os.close(fd)
            fd = None
        elif not stopped and fd is None:
            try:
                fd = _open(device, max_us)
            except OSError:
                fd = None  # taken away meanwhile (permissions): try again at the next poll
        time.sleep(POLL_S)
    return 0


def main(argv: list[str] | None = None) -> int:
    owner, max_us, device = (argv if argv is not None else sys.argv[1:])[:3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner ends the hold, not a terminal's ^C
    return hold(int(owner), int(max_us), device)


if __name__ == "__main__":
    sys.exit(main())
