"""Hold the kernel's CPU wake-up latency limit while the load generator runs (PM QoS).

An idle CPU halts; the next write that wakes a process there, or the timer that wakes a worker
there, pays for bringing it back: 20-50 µs per write and ~110 µs for a round trip between two
processes on this project's 2-core VM (benchmarks/cpu_wakeup.py), the order of the
send-precision bar. Writing a limit of 0 µs to
/dev/cpu_dma_latency makes the cpuidle governor pick only states that wake that fast (polling),
as cyclictest and tuned's latency-performance profile do. The kernel keeps the request while the
file stays open and drops it when it closes, so no exit path (a crash, SIGKILL) can leave the
machine changed; the price is idle CPUs that spin, on every core, while it is held.

Best effort: without the device or the permission to write it, the run goes on and its summaries
say why the limit was not held.
"""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

PM_QOS_DEVICE = Path("/dev/cpu_dma_latency")
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")


@dataclass(frozen=True)
class CpuLatencyState:
    requested_us: int | None  # None: the load generator leaves the limit alone
    held: bool
    detail: str  # how it came out, for summaries

    def describe(self) -> dict[str, object]:
        return asdict(self)


class CpuLatencyHold:
    """Open the PM QoS device, write the limit, keep it open until release()."""

    def __init__(self, max_us: int | None, device: Path = PM_QOS_DEVICE, driver: Path = CPUIDLE_DRIVER) -> None:
        if max_us is not None and max_us < 0:
            raise ValueError(f"cpu_latency_us must be >= 0 or None, not {max_us}")
        self.max_us = max_us
        self.device = device
        self.driver = driver
        self._fd: int | None = None
        self.state = CpuLatencyState(max_us, False, "not requested" if max_us is None else "not acquired yet")

    def acquire(self) -> CpuLatencyState:
        if self.max_us is None or self._fd is not None:
            return self.state
        fd = None
        try:
            fd = os.open(self.device, os.O_WRONLY)
            os.write(fd, struct.pack("=i", self.max_us))  # the device takes a native s32, in µs
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            self.state = CpuLatencyState(self.max_us, False, f"not held: {self.device}: {exc.strerror or exc}")
            return self.state
        self._fd = fd
        self.state = CpuLatencyState(self.max_us, True, f"held at {self.max_us} us through {self.device}{self._effect()}")
        return self.state

    def _effect(self) -> str:
        # With no cpuidle driver the idle loop halts whatever the limit says.
        try:
            name = self.driver.read_text().strip()
        except OSError:
            return ""
        return f" (cpuidle driver {name})" if name != "none" else " (no cpuidle driver: idle CPUs halt anyway)"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CpuLatencyState:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
