"""Child processes of the load-generator benchmarks: spawn in their own group, kill on any
exit, sample every process's CPU, and the null SSE server (_sse_null_server.py) as a fixture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
MODEL = "null-model"

_CHILDREN: list[subprocess.Popen] = []


# -- child processes ------------------------------------------------------------------------
def spawn(cmd: list[str], **kw: Any) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    _CHILDREN.append(proc)
    return proc


def kill_tree(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """End a child we started and everything in its process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers left in the group
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def kill_all() -> None:
    for proc in list(_CHILDREN):  # noqa: PERF101 - kill_tree removes from it
        kill_tree(proc, grace_s=1.0)


def on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


# -- a client's own CPU ---------------------------------------------------------------------
class SteadyCpu:
    """A client's CPU per request and per streamed chunk while its load is steady: every
    `interval_s`, the CPU seconds of every process it spawned (`spawn` after start(), the server
    excluded; a process that ended keeps its last reading) and the server's counts (`stats()`:
    streams ended, "requests", and token chunks written, "chunks"). The cost is the CPU between
    the samples where 10 % and 90 % of the run's requests had ended, over the requests and over
    the chunks the server wrote between them — chunks counted, not assumed from the streams'
    length, so a client that cuts streams short is priced by what it read: start-up (vLLM's
    bench imports torch: seconds of CPU), ramp and drain fall outside. CPU time is what a busy
    host distorts least."""

    def __init__(self, stats: Any, exclude: set[int], interval_s: float = 0.25) -> None:
        self.stats, self.exclude, self.interval_s = stats, exclude, interval_s
        # time, requests, chunks, CPU, of it user
        self.samples: list[tuple[float, int, int, float, float]] = []
        self._known = {p.pid for p in _CHILDREN}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid: (user + system, user)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_cpu(self) -> tuple[float, float]:
        roots = [p.pid for p in _CHILDREN if p.pid not in self._known and p.pid not in self.exclude]
        for pid in roots:
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    t = proc.cpu_times()
                    if t.user + t.system >= self._cpu.get(proc.pid, (0.0, 0.0))[0]:
                        self._cpu[proc.pid] = (t.user + t.system, t.user)
                except psutil.Error:
                    continue
        return sum(c for c, _ in self._cpu.values()), sum(u for _, u in self._cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                counts = self.stats()
                self.samples.append(
                    (time.monotonic(), int(counts["requests"]), int(counts["chunks"]), *self._tree_cpu())
                )
            except Exception:  # noqa: BLE001 - a failed look is a missing sample, not a failed run
                continue

    def start(self) -> SteadyCpu:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(5.0)
        if len(self.samples) < 3:
            return {"error": "too few samples"}
        r0, r1 = self.samples[0][1], self.samples[-1][1]
        total = r1 - r0
        lo = next((s for s in self.samples if s[1] >= r0 + 0.1 * total), None)
        hi = next((s for s in reversed(self.samples) if s[1] <= r0 + 0.9 * total), None)
        if lo is None or hi is None or hi[1] <= lo[1] or hi[2] <= lo[2]:
            return {"error": f"no steady window ({total} requests)"}
        requests, chunks, cpu, user = hi[1] - lo[1], hi[2] - lo[2], hi[3] - lo[3], hi[4] - lo[4]
        return {
            "requests": requests,
            "chunks": chunks,
            "window_s": round(hi[0] - lo[0], 2),
            "cpu_s": round(cpu, 3),
            "cpu_ms_per_request": round(cpu / requests * 1e3, 4),
            "cpu_us_per_chunk": round(cpu / chunks * 1e6, 3),
            # In the client's own code (user) and in the kernel for it (system: wake-ups, reads, sends).
            "user_ms_per_request": round(user / requests * 1e3, 4),
            "user_us_per_chunk": round(user / chunks * 1e6, 3),
            "cpu_s_whole_run": round(self.samples[-1][3], 3),
            "requests_whole_run": total,
        }


class Hog:
    """A busy process (`while True: pass`) on `cpus` (default: every CPU this process may use),
    named ctax-hog; stopped on close and on any exit."""

    CODE = "import ctypes\nctypes.CDLL(None).prctl(15, b'ctax-hog', 0, 0, 0)\nwhile True:\n    pass\n"

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.proc = spawn([sys.executable, "-c", self.CODE])
        os.sched_setaffinity(self.proc.pid, cpus or os.sched_getaffinity(0))

    def close(self) -> None:
        kill_tree(self.proc, grace_s=0.5)


# -- CPU sampling ---------------------------------------------------------------------------
class CpuMonitor:
    """CPU seconds of labelled process trees, and of the whole machine, sampled over time so that
    a window inside the run (the measured part of a cell) can be cut out afterwards."""

    def __init__(self, roots: dict[str, int], interval_s: float = 0.2) -> None:
        self.roots = roots
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, dict[tuple[str, int], float]]] = []  # (epoch, machine busy s, cpu)
        self.names: dict[tuple[str, int], str] = {}
        self.born: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        now = time.time()
        m = psutil.cpu_times()
        busy = sum(m) - m.idle - getattr(m, "iowait", 0.0)
        cpu: dict[tuple[str, int], float] = {}
        for label, pid in self.roots.items():
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for i, p in enumerate(procs):
                key = (label, p.pid)
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        cpu[key] = t.user + t.system
                        if key not in self.names:
                            self.names[key] = "main" if i == 0 else _short_name(p)
                            self.born[key] = p.create_time()
                except psutil.Error:
                    continue
        self.samples.append((now, busy, cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> CpuMonitor:
        self._sample()
        self._thread.start()
        return self

    def stop(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """Per-process CPU (cores) over window (epoch seconds; default: the whole run)."""
        self._stop.set()
        self._thread.join(2.0)
        self._sample()
        lo_t, hi_t = window or (self.samples[0][0], self.samples[-1][0])
        lo = max((s for s in self.samples if s[0] <= lo_t), key=lambda s: s[0], default=self.samples[0])
        hi = min((s for s in self.samples if s[0] >= hi_t), key=lambda s: s[0], default=self.samples[-1])
        wall = max(hi[0] - lo[0], 1e-9)
        per: dict[str, dict[str, float]] = {}
        last: dict[tuple[str, int], float] = {}
        for s in self.samples:  # a process that died before hi keeps its last reading
            if s[0] <= hi[0]:
                last.update(s[2])
        for key, cpu in last.items():
            label, _ = key
            if key in lo[2]:
                base = lo[2][key]
            elif self.born.get(key, 0.0) >= lo[0]:
                base = 0.0  # born inside the window
            else:
                continue  # seen only later: no baseline
            frac = max(0.0, cpu - base) / wall
            group = per.setdefault(label, {})
            if self.names[key] == "main":
                group["main"] = round(frac, 3)
            else:
                group["max_child"] = round(max(group.get("max_child", 0.0), frac), 3)
                group["children"] = round(group.get("children", 0.0) + frac, 3)
        tracked = sum(v.get("main", 0.0) + v.get("children", 0.0) for v in per.values())
        machine = (hi[1] - lo[1]) / wall
        return {
            "window_s": round(wall, 2),
            "by_process": per,
            "machine_busy_cores": round(machine, 3),
            "machine_cores": psutil.cpu_count(),
            "other_cores": round(max(0.0, machine - tracked), 3),
        }


def _short_name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:3])[-60:]
    except psutil.Error:
        return "?"


# -- the server -----------------------------------------------------------------------------
class NullServer:
    def __init__(self, cpus: list[int] | None) -> None:
        cmd = [sys.executable, str(HERE / "_sse_null_server.py"), "--port", "0", "--model", MODEL]
        for c in cpus or []:
            cmd += ["--cpu", str(c)]
        self.proc = spawn(cmd, stdout=subprocess.PIPE, text=True)
        line = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if line.startswith("ready ") or self.proc.poll() is not None:
                break
        if not line.startswith("ready "):
            kill_tree(self.proc)
            raise RuntimeError(f"null server did not start (got {line!r})")
        self.url = line.split()[1]

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as r:
            return json.loads(r.read())

    def close(self) -> None:
        kill_tree(self.proc)
