"""The host around a cell: who else used its CPUs, what the hypervisor stole, how long the run
queue was, and what the study itself used.

A number measured while other work ran on the same cores is not the number the study asks for,
and a user on a shared machine cannot see that from the number. So every real-time cell samples
the host at the metrics cadence (one snapshot a second, plus one at each end) and its summary
says how busy the host was and whether that was too busy (`busy`, with the numbers and bounds):

- per process, from /proc/<pid>/stat: CPU time of every process, sorted into the study's own
  (the server's process group and its descendants; the phase job, i.e. the load generator's
  main process, and its other descendants: workers, the CPU-latency holder; the job's
  ancestors, snakemake included) and everyone else's. A process reaped between two snapshots
  lands in its parent's children's time (cutime), minus what was already counted for it;
- from /proc/stat: steal time, the CPU time nobody's process was charged with (interrupts, the
  exits nobody waited for: `unattributed`), and the run queue (`procs_running`) at each snapshot;
  the host's busy time less the study's own also caps what is counted as others' (a process
  reaped by another ancestor than its parent could otherwise be counted twice);
- from /proc/pressure/cpu where the kernel has it: the share of time some task waited for a CPU
  (the study's own threads included, so it is context, not a bound).

/proc is read directly rather than through psutil's process_iter: a snapshot of ~100 processes
costs ~6 ms that way against ~25 ms (measured on the 2-CPU development host under load), and
the sampler runs beside the measurement it must not disturb.

Nothing here can say anything about a cell computed in virtual time: it ran on no host
(`not_measured`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec

from connector_tax.config import Validity
from connector_tax.contract.summary import HostReport

_TICK = os.sysconf("SC_CLK_TCK")
SOURCE = "/proc/<pid>/stat per process, /proc/stat (steal, procs_running), /proc/pressure/cpu"
TOP = 5  # outside processes named in a report, busiest first
CLASSES = ("server", "loadgen", "orchestration", "others")


@dataclass(frozen=True)
class Proc:
    ppid: int
    pgrp: int
    name: str
    own_s: float  # utime + stime
    children_s: float  # cutime + cstime: reaped children's time
    start: int  # start time, clock ticks since boot (tells a reused pid from the same process)


@dataclass(frozen=True)
class Snapshot:
    t_ns: int
    procs: dict[int, Proc]
    busy_s: float  # every CPU's user + nice + system + irq + softirq
    steal_s: float
    cpus: int
    running: int  # /proc/stat procs_running
    pressure_us: float | None  # /proc/pressure/cpu "some" total


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def read_procs(proc: str = "/proc") -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        raw = _read(f"{proc}/{entry}/stat")
        if raw is None:
            continue  # gone since listdir
        close = raw.rfind(b")")  # the name may hold spaces and parentheses
        f = raw[close + 2 :].split()
        try:
            out[int(entry)] = Proc(
                ppid=int(f[1]),
                pgrp=int(f[2]),
                name=raw[raw.find(b"(") + 1 : close].decode(errors="replace"),
                own_s=(int(f[11]) + int(f[12])) / _TICK,
                children_s=(int(f[13]) + int(f[14])) / _TICK,
                start=int(f[19]),
            )
        except (IndexError, ValueError):
            continue
    return out


def read_stat(path: str = "/proc/stat") -> tuple[float, float, int, int]:
    """(busy seconds, steal seconds, CPUs, procs_running) of the whole host."""
    busy = steal = 0.0
    cpus = running = 0
    for line in (_read(path) or b"").decode().splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "cpu":
            v = [int(x) for x in parts[1:]]
            # user nice system idle iowait irq softirq steal (guest time is inside user already)
            busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / _TICK
            steal = (v[7] if len(v) > 7 else 0) / _TICK
        elif parts[0].startswith("cpu"):
            cpus += 1
        elif parts[0] == "procs_running":
            running = int(parts[1])
    return busy, steal, max(cpus, 1), running


def read_pressure(path: str = "/proc/pressure/cpu") -> float | None:
    raw = _read(path)
    if raw is None:
        return None
    for line in raw.decode().splitlines():
        if line.startswith("some "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            return float(fields["total"])
    return None


def snapshot() -> Snapshot:
    t_ns = time.monotonic_ns()
    procs = read_procs()
    busy, steal, cpus, running = read_stat()
    return Snapshot(t_ns, procs, busy, steal, cpus, running, read_pressure())


@dataclass(frozen=True)
class Study:
    """Which processes are the study's own: the phase job (`job`), the server's process group
    (`server_pgid`: the pid of the server the job started in a new session), or an external
    server's process on this host (`server_pid`, found by its listening port) and its children; a
    variant's sidecars (`sidecar_pgids`: each in a session of its own, serving/sidecar.py) count as
    the server."""

    job: int
    server_pgid: int | None = None
    server_pid: int | None = None
    sidecar_pgids: tuple[int, ...] = ()

    def classify(self, procs: dict[int, Proc]) -> dict[int, str]:
        """pid -> server | loadgen | orchestration | others."""
        children: dict[int, list[int]] = {}
        for pid, p in procs.items():
            children.setdefault(p.ppid, []).append(pid)
        out = dict.fromkeys(procs, "others")
        ancestor, seen = procs.get(self.job), {self.job}
        while ancestor is not None and ancestor.ppid not in seen and ancestor.ppid > 0:
            seen.add(ancestor.ppid)
            out[ancestor.ppid] = "orchestration"
            ancestor = procs.get(ancestor.ppid)
        for root, cls in ((self.job, "loadgen"), (self.server_pgid, "server"), (self.server_pid, "server")):
            if root is None or root not in procs:
                continue
            stack = [root]
            while stack:
                pid = stack.pop()
                out[pid] = cls
                stack.extend(children.get(pid, ()))
        groups = {g for g in (self.server_pgid, *self.sidecar_pgids) if g is not None}
        if groups:
            for pid, p in procs.items():
                if p.pgrp in groups:
                    out[pid] = "server"  # a server process that left its parent still belongs to it
        out.pop(0, None)
        return out


def listener_pid(port: int) -> int | None:
    """The process listening on TCP `port` of this host (an external server), if it can be seen."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except (OSError, ImportError, RuntimeError):
        return None
    return None


def interval(a: Snapshot, b: Snapshot, study: Study) -> dict[str, Any]:
    """What happened between two snapshots: CPU seconds per class, per outside process, steal."""
    cls = study.classify(b.procs)
    before = study.classify(a.procs)
    per_class = dict.fromkeys(CLASSES, 0.0)
    per_other: dict[tuple[int, str], float] = {}

    # A process seen in `a` and gone in `b` was reaped by its parent, whose children's time now
    # holds all of it (and a parent that went too passed it on to its own): take what `a` had
    # already counted for it off its nearest surviving ancestor, so it is counted once.
    def survives(pid: int) -> bool:
        q = b.procs.get(pid)
        return q is not None and q.start == a.procs[pid].start

    already: dict[int, float] = {}
    for pid, p in a.procs.items():
        if survives(pid):
            continue
        heir, hops = p.ppid, 0
        while heir in a.procs and not survives(heir) and hops < 64:
            heir, hops = a.procs[heir].ppid, hops + 1
        already[heir] = already.get(heir, 0.0) + p.own_s + p.children_s
    for pid, q in b.procs.items():
        was = a.procs.get(pid)
        total = q.own_s + q.children_s
        if was is not None and was.start == q.start:
            used = total - was.own_s - was.children_s - already.get(pid, 0.0)
        else:
            used = total  # started since `a`: all of its time is in this interval
        used = max(0.0, used)
        if not used:
            continue
        c = cls.get(pid, before.get(pid, "others"))
        per_class[c] += used
        if c == "others":
            per_other[(pid, q.name)] = per_other.get((pid, q.name), 0.0) + used
    wall = max((b.t_ns - a.t_ns) / 1e9, 1e-9)
    busy = max(0.0, b.busy_s - a.busy_s)
    # Per process is who; /proc/stat is how much. A process whose parent exited before it did is
    # reaped by another ancestor than the one its time is taken off, which can count its earlier
    # time twice: never more than the host's busy time less the study's own is counted as others'.
    ceiling = max(0.0, busy - sum(v for c, v in per_class.items() if c != "others"))
    capped = per_class["others"] > ceiling + 0.02 * wall
    if capped:
        per_class["others"] = ceiling
    pressure = None if a.pressure_us is None or b.pressure_us is None else (b.pressure_us - a.pressure_us) / 1e6
    return {
        "wall_s": wall,
        "cpus": b.cpus,
        "cpu_s": per_class,
        "others": per_other,
        "busy_s": busy,
        "capped": capped,
        "steal_s": max(0.0, b.steal_s - a.steal_s),
        "running": b.running,
        "pressure_s": pressure,
    }


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def judge(report: dict[str, Any], v: Validity) -> dict[str, Any]:
    """The host's checks against the validity bounds: `busy` and its reasons, added to `report`."""
    checks = [
        {"name": name, "value": report[name], "threshold": bound, "passed": bool(report[name] <= bound)}
        for name, bound in (("others_cpu_frac", v.max_others_cpu_frac), ("steal_frac", v.max_steal_frac))
    ]
    failed = [c for c in checks if not c["passed"]]
    busy_with = ", ".join(f"{o['name']} ({o['pid']}) {o['cores']:.2f}" for o in report.get("top_others", [])[:3])
    report["checks"] = checks
    report["busy"] = bool(failed)
    report["reasons"] = [
        f"host busy: {c['name']} {c['value']} > {c['threshold']}"
        + (f" (others' CPU in cores: {busy_with})" if c["name"] == "others_cpu_frac" and busy_with else "")
        for c in failed
    ]
    return report


def summarize(intervals: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A cell's host report from its intervals (first snapshot to last)."""
    items = list(intervals)
    if not items:
        empty: dict[str, Any] = msgspec.to_builtins(not_measured("no host snapshot was taken"))
        return empty
    wall = sum(i["wall_s"] for i in items)
    cpus = items[-1]["cpus"]
    per_class = {c: sum(i["cpu_s"][c] for i in items) for c in CLASSES}
    per_other: dict[tuple[int, str], float] = {}
    for i in items:
        for key, s in i["others"].items():
            per_other[key] = per_other.get(key, 0.0) + s
    top = sorted(per_other.items(), key=lambda kv: -kv[1])[:TOP]
    busy = sum(i["busy_s"] for i in items)
    steal = sum(i["steal_s"] for i in items)
    attributed = sum(per_class.values())
    running = [i["running"] for i in items]
    pressure = [i["pressure_s"] for i in items]
    # The busiest stretch of a cell: a hog that starts half-way shows here at full strength.
    peak = max(i["cpu_s"]["others"] / i["wall_s"] for i in items)
    return {
        "measured": True,
        "source": SOURCE,
        "wall_s": _r(wall, 3),
        "cpus": cpus,
        "samples": len(items) + 1,
        "others_cpu_s": _r(per_class["others"], 3),
        "others_cores": _r(per_class["others"] / wall),
        "others_cores_max": _r(peak),
        "others_cpu_frac": _r(per_class["others"] / (wall * cpus)),
        "top_others": [{"pid": pid, "name": name, "cores": _r(s / wall)} for (pid, name), s in top],
        "steal_frac": _r(steal / (wall * cpus)),
        "run_queue_mean": _r(sum(running) / len(running), 2),
        "run_queue_max": max(running),
        "cpu_pressure_some_frac": None if None in pressure else _r(sum(pressure) / wall),
        "study_cores": {c: _r(per_class[c] / wall) for c in CLASSES if c != "others"},
        "host_busy_cores": _r(busy / wall),
        "unattributed_cores": _r((busy - attributed) / wall),
    }


def not_measured(why: str) -> HostReport:
    """The report of a cell that has no host to measure (virtual time), or none that was measured."""
    return HostReport(measured=False, why=why)


class HostSampler:
    """Samples the host every `interval_s` on its own thread while a cell runs: one JSONL line
    per interval into `path` (CPU seconds per class, the busiest outside processes, steal, run
    queue), and `report()` over the whole cell once it has stopped."""

    def __init__(
        self,
        path: Path | None,
        study: Study,
        interval_s: float = 1.0,
        validity: Validity | None = None,
    ) -> None:
        self.path, self.study, self.interval_s, self.validity = path, study, interval_s, validity
        self.intervals: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-host-sampler", daemon=True)
        self._last: Snapshot | None = None

    def __enter__(self) -> HostSampler:
        self._last = snapshot()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        out = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed below, the thread owns it
        try:
            next_t = time.monotonic()
            while True:
                next_t += self.interval_s
                stopped = self._stop.wait(max(0.0, next_t - time.monotonic()))
                self._take(out)  # the last one at the stop: the cell's end is covered
                if stopped:
                    return
        finally:
            if out is not None:
                out.close()

    def _take(self, out: Any) -> None:
        now = snapshot()
        assert self._last is not None
        step = interval(self._last, now, self.study)
        self._last = now
        self.intervals.append(step)
        if out is not None:
            line = {
                "t_ns": now.t_ns,
                "wall_s": _r(step["wall_s"]),
                "cpus": step["cpus"],
                "cpu_s": {c: _r(s) for c, s in step["cpu_s"].items()},
                "top_others": [
                    {"pid": pid, "name": name, "cpu_s": _r(s)}
                    for (pid, name), s in sorted(step["others"].items(), key=lambda kv: -kv[1])[:TOP]
                ],
                "busy_s": _r(step["busy_s"]),
                "steal_s": _r(step["steal_s"]),
                "running": step["running"],
                "pressure_s": _r(step["pressure_s"]),
            }
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            out.flush()

    def report(self) -> HostReport:
        """The cell's host report (judged against the validity bounds when it was given them)."""
        report = summarize(self.intervals)
        if report["measured"] and self.validity is not None:
            judge(report, self.validity)
        return msgspec.convert(report, HostReport)
