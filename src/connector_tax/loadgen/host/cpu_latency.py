"""Hold the kernel's CPU wake-up latency limit while the load generator runs (PM QoS).

An idle CPU halts; the next write that wakes a process there, or the timer that wakes a worker
there, pays for bringing it back: 20-50 µs per write and ~110 µs for a round trip between two
processes on this project's 2-core VM (benchmarks/cpu_wakeup.py), the order of the
send-precision bar. Writing a limit of 0 µs to
/dev/cpu_dma_latency makes the cpuidle governor pick only states that wake that fast (polling),
as cyclictest and tuned's latency-performance profile do. The kernel keeps the request while the
file stays open and drops it when it closes; the file is held by a small process of its own
(latency_holder.py) that watches this one, so no exit path (a crash, SIGKILL) can leave the
machine changed and a stopped run (SIGSTOP, Ctrl-Z) does not keep it either; the price is idle
CPUs that spin, on every core, while it is held.

Best effort: without the device or the permission to write it, the run goes on and its summaries
say why the limit was not held.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from connector_tax.contract.summary import CpuLatency

PM_QOS_DEVICE = Path("/dev/cpu_dma_latency")
HOLDER_START_S = 10.0  # a loaded host may take seconds to start a Python process
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")


@dataclass(frozen=True)
class CpuLatencyState:
    requested_us: int | None  # None: the load generator leaves the limit alone
    held: bool
    detail: str  # how it came out, for summaries

    def describe(self) -> CpuLatency:
        return CpuLatency(self.requested_us, self.held, self.detail)


class CpuLatencyHold:
    """Have a holder process open the PM QoS device and write the limit, until release()."""

    def __init__(self, max_us: int | None, device: Path = PM_QOS_DEVICE, driver: Path = CPUIDLE_DRIVER) -> None:
        if max_us is not None and max_us < 0:
            raise ValueError(f"cpu_latency_us must be >= 0 or None, not {max_us}")
        self.max_us = max_us
        self.device = device
        self.driver = driver
        self.holder: subprocess.Popen[str] | None = None
        self.state = CpuLatencyState(max_us, False, "not requested" if max_us is None else "not acquired yet")

    def acquire(self) -> CpuLatencyState:
        if self.max_us is None or self.holder is not None:
            return self.state
        holder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "connector_tax.loadgen.host.latency_holder",
                str(os.getpid()),
                str(self.max_us),
                str(self.device),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], HOLDER_START_S)
        line = holder.stdout.readline().strip() if ready else ""
        if line != "held":
            self._stop(holder)
            why = line.removeprefix("not held: ") or f"the holder process did not answer in {HOLDER_START_S:g} s"
            self.state = CpuLatencyState(self.max_us, False, f"not held: {why}")
            return self.state
        self.holder = holder
        self.state = CpuLatencyState(
            self.max_us, True, f"held at {self.max_us} us through {self.device}{self._effect()}"
        )
        return self.state

    @staticmethod
    def _stop(holder: subprocess.Popen[str]) -> None:
        holder.kill()  # it holds nothing worth a goodbye: the kernel drops the request on close
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()

    def _effect(self) -> str:
        # With no cpuidle driver the idle loop halts whatever the limit says.
        try:
            name = self.driver.read_text().strip()
        except OSError:
            return ""
        return f" (cpuidle driver {name})" if name != "none" else " (no cpuidle driver: idle CPUs halt anyway)"

    def release(self) -> None:
        if self.holder is not None:
            self._stop(self.holder)
            self.holder = None

    def __enter__(self) -> CpuLatencyState:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
