"""What launch_variance.py samples beside the pipeline while the launches run: where every thread of
every vLLM server process ran, its memory placement, the host's CPUs, steal and frequency, and the
other processes. One thread, reading /proc only; a record a line in a JSONL file.

Every SAMPLE_S (the server's processes found again every SCAN_S): per server thread (processes whose comm starts with "VLLM" or whose command line
runs `vllm serve`, and their descendants) its processor (/proc/<pid>/task/<tid>/stat field 39),
its CPU ticks and its allowed CPUs; /proc/stat's per-CPU jiffies (busy and steal). Every
SLOW_S: each server process's smaps_rollup (Rss, Anonymous, AnonHugePages) and numa_maps pages
per node, the CPUs' current frequency where readable, and the host's other processes (their
count, start times, and the youngest). Timestamps are CLOCK_MONOTONIC ns, as the study's records.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.25
SLOW_S = 5.0
SCAN_S = 2.0
_CLK = os.sysconf("SC_CLK_TCK")
_BOOT = next(float(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _stat_fields(text: str) -> list[str]:
    # comm may hold spaces and parentheses: the fields start after the last ')'
    return text[text.rindex(")") + 2 :].split()


def role(comm: str, cmdline: str) -> str | None:
    """A server process's part: api (the `vllm serve` process), engine, worker; None if not vLLM."""
    if comm.startswith("VLLM::EngineCor"):
        return "engine"
    if comm.startswith("VLLM::Worker") or comm.startswith("VLLM::Work"):
        return "worker"
    if comm.startswith("VLLM"):
        return "vllm_other"
    if "vllm" in cmdline and " serve " in f" {cmdline} ":
        return "api"
    return None


def _server_pids() -> dict[int, str]:
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        comm = (_read(f"/proc/{entry}/comm") or "").strip()
        cmd = (_read(f"/proc/{entry}/cmdline") or "").replace("\0", " ")
        r = role(comm, cmd)
        if r is not None:
            out[int(entry)] = r
    return out


def _threads(pid: int) -> list[dict[str, Any]]:
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        stat = _read(f"/proc/{pid}/task/{tid}/stat")
        status = _read(f"/proc/{pid}/task/{tid}/status")
        if not stat or not status:
            continue
        f = _stat_fields(stat)
        allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", status)
        out.append(
            {
                "tid": int(tid),
                "name": stat[stat.index("(") + 1 : stat.rindex(")")],
                "ticks": int(f[11]) + int(f[12]),  # utime + stime (fields 14, 15)
                "cpu": int(f[36]),  # field 39: the processor it last ran on
                "allowed": allowed.group(1) if allowed else None,
            }
        )
    return out


def _cpus() -> dict[str, list[int]]:
    """Per CPU: busy jiffies (user+nice+system+irq+softirq) and steal."""
    out = {}
    for line in (_read("/proc/stat") or "").splitlines():
        if re.match(r"cpu\d+ ", line):
            v = [int(x) for x in line.split()[1:]]
            out[line.split()[0]] = [v[0] + v[1] + v[2] + v[5] + v[6], v[7]]
    return out


def _memory(pid: int) -> dict[str, Any]:
    roll = _read(f"/proc/{pid}/smaps_rollup") or ""
    mem = {k: int(v) for k, v in re.findall(r"^(Rss|Anonymous|AnonHugePages):\s+(\d+) kB", roll, re.M)}
    nodes: dict[str, int] = {}
    for n, pages in re.findall(r"\bN(\d+)=(\d+)", _read(f"/proc/{pid}/numa_maps") or ""):
        nodes[n] = nodes.get(n, 0) + int(pages)
    return {"kb": mem, "numa_pages": nodes}


def _freq() -> list[float] | None:
    paths = sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
    if paths:
        return [int(p.read_text()) / 1000.0 for p in paths]
    mhz = re.findall(r"cpu MHz\s*:\s*([\d.]+)", _read("/proc/cpuinfo") or "")
    return [float(x) for x in mhz] or None


def _others(server: set[int]) -> dict[str, Any]:
    starts = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in server:
            stat = _read(f"/proc/{entry}/stat")
            if stat:
                starts.append((int(_stat_fields(stat)[19]), (_read(f"/proc/{entry}/comm") or "").strip()))
    now = time.time()
    ages = sorted((now - (_BOOT + s / _CLK), c) for s, c in starts)
    return {
        "count": len(ages),
        "youngest_s": round(ages[0][0], 1) if ages else None,
        "youngest": ages[0][1] if ages else None,
    }


class Probe:
    """Samples into `path` from start() until stop()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launch-probe", daemon=True)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        slow_at, scan_at, pids = 0.0, 0.0, {}
        thp = (_read("/sys/kernel/mm/transparent_hugepage/enabled") or "").strip()
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"t_ns": time.monotonic_ns(), "thp": thp, "clk_tck": _CLK}) + "\n")
            while not self._stop.wait(SAMPLE_S):
                if time.monotonic() >= scan_at:  # a /proc scan costs ~10 ms: not every sample
                    scan_at, pids = time.monotonic() + SCAN_S, _server_pids()
                rec: dict[str, Any] = {"t_ns": time.monotonic_ns(), "cpus": _cpus()}
                rec["procs"] = [{"pid": p, "role": r, "threads": _threads(p)} for p, r in sorted(pids.items())]
                if pids and time.monotonic() >= slow_at:
                    slow_at = time.monotonic() + SLOW_S
                    rec["memory"] = {str(p): _memory(p) for p in pids}
                    rec["freq_mhz"] = _freq()
                    rec["others"] = _others(set(pids))
                out.write(json.dumps(rec) + "\n")


# The host's speed while a launch runs (`ctax benchmark host_drift`: on this VM an interpreter loop
# runs 13 % faster or slower, sd over 4 s stretches, with nothing of the study running, and a light
# probe on the other core follows it). The probe: a 0.3 ms piece of interpreter work every 100 ms on
# the service core, timed in its thread's CPU time (a preemption there is not counted, a slower
# physical core is), the fastest of three: about 1 % of a core.
_SPEED_CODE = r"""
import json, os, sys, time
out, core = sys.argv[1], int(sys.argv[2])
os.sched_setaffinity(0, {core})
def work():
    s = 0
    for i in range(4000):
        s += i * i
with open(out, "a", buffering=1) as fh:
    nxt = time.monotonic()
    while True:
        nxt += 0.1
        time.sleep(max(0.0, nxt - time.monotonic()))
        best = None
        for _ in range(3):
            c0 = time.thread_time_ns()
            work()
            took = time.thread_time_ns() - c0
            best = took if best is None else min(best, took)
        fh.write(json.dumps({"t_ns": time.monotonic_ns(), "work_ns": best}) + "\n")
"""


class SpeedProbe:
    """The host's speed on `core` into `path` ({t_ns, work_ns} a line), from start() to stop()."""

    def __init__(self, path: Path, core: int) -> None:
        self.path, self.core = path, core
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SpeedProbe:
        self._proc = subprocess.Popen([sys.executable, "-c", _SPEED_CODE, str(self.path), str(self.core)])
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)


def host_speed(records: list[dict[str, Any]], window: list[int]) -> float | None:
    """The probe's mean log speed (1 ms / the work's CPU time) over [t0, t1]; None under 20 ticks."""
    inside = [r["work_ns"] for r in records if "work_ns" in r and window[0] <= r["t_ns"] <= window[1]]
    if len(inside) < 20:
        return None
    return sum(math.log(1e6 / w) for w in inside) / len(inside)
