"""Per-thread CPU time of a server's processes, sampled at a fixed rate into JSONL.

One line per sample:

    {"t_ns": monotonic ns, "clk_tck": 100, "procs": [
        {"pid": 11680, "ppid": 11615, "name": "VLLM::Worker", "cpus": [1], "threads": [
            {"tid": 11979, "name": "VLLM::Worker", "user": 5240, "system": 12, "core": 1,
             "started_by": "NixlConnector worker", "cpus": [1]}, ...]}, ...]}

`user`/`system` are the thread's cumulative CPU time in clock ticks (`clk_tck` per second), as
/proc/<pid>/task/<tid>/stat has them; a thread's CPU share over an interval is the difference
between two samples over the interval. `core` is the CPU it last ran on (stat's `processor`); a
thread's `cpus` the CPUs it may run on (its own affinity: vLLM, a library or the study may pin one
thread apart from the rest of its process), the process's `cpus` its main thread's (Linux keeps
affinity per thread; `sched_getaffinity(pid)` is the main thread's). The processes are the server's root process and all its
descendants (vLLM: the API server, the engine core, its workers), found again at every sample.
`started_by` names threads a library started inside a connector's constructor (the step-timing
instrumentation records them; a library's threads carry the process's name otherwise).
A variant's sidecars (an LMCache MP server: serving/sidecar.py) are sampled in the same line,
their processes marked `"sidecar": "<name>"`: their CPU is part of what the configuration costs.

A thread or process that ends between listing and reading is skipped; a sample that cannot see
the root process is a line with "error". Reads only /proc and psutil's process tree: one small
file and one sched_getaffinity per thread per sample (about 100 threads for vLLM on CPU). The
affinity is read at every sample, not once per thread: it changes after a thread starts (vLLM's
NIXL worker re-pins the thread that builds it; the study's placement moves threads once the server
is ready), and 100 reads cost ~0.1 ms against ~9 ms for the sample (README.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import psutil

from connector_tax.contract.records import ProcessSample, ThreadCpu, ThreadSample, encode_line

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The ready, idle server is sampled this long before its first cell (a vLLM Phase A launch);
# `ctax plan` counts it in the job's time.
IDLE_WINDOW_S = 3.0


def _stat(path: str) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of a /proc .../stat file; None if it is gone."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    open_, close = raw.find("("), raw.rfind(")")
    if open_ < 0 or close < 0:
        return None
    return raw[open_ + 1 : close], raw[close + 2 :].split()


# Field positions after "(comm) ": state is field 3 of stat(5), so field N is at N - 3.
_PPID, _UTIME, _STIME, _PROCESSOR = 4 - 3, 14 - 3, 15 - 3, 39 - 3


def sample_process(pid: int, labels: dict[str, str] | None = None) -> ProcessSample | None:
    """One process's threads now; None if it is gone."""
    head = _stat(f"/proc/{pid}/stat")
    if head is None:
        return None
    name, fields = head
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        cpus = None
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    threads = []
    for tid in tids:
        st = _stat(f"/proc/{pid}/task/{tid}/stat")
        if st is None or len(st[1]) <= _PROCESSOR:
            continue
        tname, tf = st
        started_by = labels.get(str(tid)) if labels else None
        try:
            own = sorted(os.sched_getaffinity(tid))
        except OSError:  # ended between its stat and now
            continue
        threads.append(ThreadCpu(tid, tname, int(tf[_UTIME]), int(tf[_STIME]), int(tf[_PROCESSOR]), started_by, own))
    return ProcessSample(pid, int(fields[_PPID]), name, cpus, threads)


def _tree(root: int) -> list[int]:
    return [root] + [p.pid for p in psutil.Process(root).children(recursive=True)]


def sample_tree(
    root: int, labels: dict[str, str] | None = None, sidecars: dict[int, str] | None = None
) -> ThreadSample:
    """Every thread of `root` and its descendants, now, as one record; with the processes of each
    sidecar ({root pid: name}: serving/sidecar.py) marked `sidecar: name`. A sidecar that is gone
    is left out (its exit fails the cell elsewhere)."""
    t_ns = time.monotonic_ns()
    try:
        pids = _tree(root)
    except psutil.Error as exc:
        return ThreadSample(t_ns, CLK_TCK, error=f"{type(exc).__name__}: {exc}")
    procs = [p for p in (sample_process(pid, labels) for pid in pids) if p is not None]
    for pid, name in (sidecars or {}).items():
        try:
            side = _tree(pid)
        except psutil.Error:
            continue
        for q in side:
            p = sample_process(q)
            if p is not None:
                p.sidecar = name
                procs.append(p)
    return ThreadSample(t_ns, CLK_TCK, procs)


class ThreadSampler:
    """Samples the threads of a process tree every `interval_s` into `path` (JSONL), from enter
    to exit, with one more sample at exit. `labels()` gives {tid: started_by} (re-read at every
    sample; it must be cheap and never raise)."""

    def __init__(
        self,
        root_pid: int,
        path: Path,
        interval_s: float = 1.0,
        labels: Callable[[], dict[str, str]] | None = None,
        sidecars: dict[int, str] | None = None,
    ) -> None:
        self.root_pid = root_pid
        self.path = path
        self.interval_s = interval_s
        self.labels = labels or dict
        self.sidecars = dict(sidecars or {})
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-thread-sampler", daemon=True)

    def __enter__(self) -> ThreadSampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.path, "wb")
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._out.close()

    def _write(self) -> None:
        try:
            labels = self.labels()
        except Exception:  # noqa: BLE001 - a label is a nicety, a sample is not
            labels = {}
        self._out.write(encode_line(sample_tree(self.root_pid, labels, self.sidecars)))
        self._out.flush()
        self.samples += 1

    def _run(self) -> None:
        next_t = time.monotonic()
        while True:
            self._write()
            next_t += self.interval_s
            if self._stop.wait(max(0.0, next_t - time.monotonic())):
                self._write()
                return


def record_idle(
    root_pid: int,
    path: Path,
    seconds: float,
    interval_s: float,
    labels: Callable[[], dict[str, str]],
    sidecars: dict[int, str] | None = None,
) -> int:
    """Sample an idle server (and its sidecars) for `seconds` into `path` (written beside it and
    renamed: a kill leaves no half file under its name). Returns the number of samples."""
    tmp = path.with_name(path.name + ".tmp")
    with ThreadSampler(root_pid, tmp, interval_s, labels, sidecars) as sampler:
        time.sleep(seconds)
    os.replace(tmp, path)
    return sampler.samples
