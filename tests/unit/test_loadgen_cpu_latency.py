"""The PM QoS CPU-latency hold: what it writes, that it lets go, and how it fails (best effort)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from connector_tax.commands.bench import add_arguments as add_bench_arguments
from connector_tax.contract.summary import CpuLatency
from connector_tax.loadgen.flags import OneLineParser
from connector_tax.loadgen.host.cpu_latency import PM_QOS_DEVICE, CpuLatencyHold


def _driver(tmp_path: Path, name: str = "haltpoll") -> Path:
    path = tmp_path / "current_driver"
    path.write_text(name + "\n")
    return path


def _holds(pid: int, device: Path) -> bool:
    """Whether process `pid` has `device` open."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(device) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _eventually(predicate, timeout: float = 30.0) -> bool:  # a bail-out: a loaded host is slow
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_writes_the_limit_as_a_native_s32_and_keeps_the_file_open(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    hold = CpuLatencyHold(50, device=device, driver=_driver(tmp_path))
    with hold as state:
        assert device.read_bytes() == struct.pack("=i", 50)
        assert state.held and state.requested_us == 50
        assert state.detail == f"held at 50 us through {device} (cpuidle driver haltpoll)"
        holder = hold.holder
        assert holder is not None and _holds(
            holder.pid, device
        )  # open: the kernel keeps a request only while its file is
    assert holder.poll() is not None and hold.holder is None
    assert hold.state.held  # the summary still says what held during the run


def test_acquire_twice_opens_once(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    hold = CpuLatencyHold(0, device=device, driver=_driver(tmp_path))
    hold.acquire()
    first = hold.holder
    hold.acquire()
    assert hold.holder is first and device.read_bytes() == struct.pack("=i", 0)
    hold.release()
    hold.release()


_OWNER = """
import sys, time
from pathlib import Path
from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold
hold = CpuLatencyHold(0, device=Path(sys.argv[1]))
state = hold.acquire()
print(hold.holder.pid if state.held else "not held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("end", ["SIGSTOP then SIGCONT", "SIGKILL"])
def test_a_stopped_or_killed_owner_does_not_keep_the_limit(tmp_path: Path, end: str) -> None:
    """The request lives in the holder's open file: it goes while its owner is stopped, comes back
    when it resumes, and goes for good when the owner is killed (no exit path of its own)."""
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(device)], stdout=subprocess.PIPE, text=True)
    try:
        holder = int(owner.stdout.readline())
        assert _holds(holder, device)
        if end == "SIGKILL":
            owner.kill()
            owner.wait()
            assert _eventually(lambda: not psutil.pid_exists(holder) or psutil.Process(holder).status() == "zombie")
            return
        os.kill(owner.pid, signal.SIGSTOP)
        assert _eventually(lambda: not _holds(holder, device)), "a stopped run still holds the CPU latency limit"
        os.kill(owner.pid, signal.SIGCONT)
        assert _eventually(lambda: _holds(holder, device)), "the limit did not come back when the run resumed"
    finally:
        owner.kill()
        owner.wait()


def test_no_cpuidle_driver_is_said(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with CpuLatencyHold(0, device=device, driver=_driver(tmp_path, "none")) as state:
        assert state.detail.endswith("(no cpuidle driver: idle CPUs halt anyway)")


def test_missing_device_is_not_an_error(tmp_path: Path) -> None:
    device = tmp_path / "absent"
    with CpuLatencyHold(0, device=device) as state:
        assert not state.held
        assert state.detail == f"not held: {device}: No such file or directory"


def test_unwritable_device_is_not_an_error(tmp_path: Path) -> None:
    with CpuLatencyHold(0, device=tmp_path) as state:  # a directory: open for writing fails
        assert not state.held
        assert state.detail.startswith(f"not held: {tmp_path}: ")


def test_off_touches_nothing(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    with CpuLatencyHold(None, device=device) as state:
        assert state.describe() == CpuLatency(None, False, "not requested")
    assert not device.exists()


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="cpu_latency_us must be >= 0"):
        CpuLatencyHold(-1)


@pytest.mark.skipif(not os.access(PM_QOS_DEVICE, os.W_OK), reason="needs write access to /dev/cpu_dma_latency")
def test_the_kernel_applies_the_limit_while_held() -> None:
    with CpuLatencyHold(0) as state:
        if not state.held:  # writable by mode, refused by policy (a container)
            pytest.skip(state.detail)
        # Reading the device gives the limit in force: the lowest of every open request.
        assert struct.unpack("=i", PM_QOS_DEVICE.read_bytes()[:4])[0] == 0


def test_cli_takes_off_and_whole_microseconds() -> None:
    parser = OneLineParser(prog="ctax bench")
    add_bench_arguments(parser)
    base = ["--url", "http://127.0.0.1:9", "--model", "m"]
    assert parser.parse_args(base).cpu_latency_us == 0
    assert parser.parse_args(base + ["--cpu-latency-us", "off"]).cpu_latency_us is None
    assert parser.parse_args(base + ["--cpu-latency-us", "20"]).cpu_latency_us == 20
