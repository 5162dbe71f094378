"""What the benchmarks share, in one module: the argument parser and the JSON output; child
processes and their lifetime; CPU sampling and the CPU hog; the SSE servers and `ctax sim` as
fixtures; the `ctax bench` and `snakemake` command lines they run. What one benchmark alone uses
stays in it or in its own underscore module (benchmarks/README.md says which and why).

The parser is `ctax benchmark NAME`'s: the module's docstring as the description, a bad argument
as one line naming it (exit 2), `--json FILE` for every benchmark, and `--repeats` / `--seconds`
for those that repeat a measurement or run one for a set time, so that the same word means the
same thing in every benchmark. The JSON carries the numbers with the conditions they were
measured in (host, CPUs, load average at the start and the end, versions, the command line):
this machine is shared, and a number without them cannot be judged.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psutil

import connector_tax
from connector_tax.atomic import write_atomic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
T = TypeVar("T")

# The running benchmark's command line and the host's state when it parsed its arguments (one
# benchmark runs per process; write_json adds the state at the end).
_run: dict[str, Any] = {}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        _run.clear()
        _run.update(
            benchmark=self.prog.removeprefix("ctax benchmark "),
            argv=list(sys.argv[1:] if args is None else args),
            start=_host_state(),
        )
        return parsed


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def comma_list(cast: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """An argument type: comma-separated values, each read by `cast` ("what" names one)."""

    def read(text: str) -> list[T]:
        try:
            values = [cast(x.strip()) for x in text.split(",") if x.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}")
        return values

    return read


def parser(
    file: str,
    doc: str | None,
    *,
    json_default: str | None = None,
    repeats: int | None = None,
    repeats_help: str = "repeats of the whole measurement (the machine is shared: read the medians)",
    seconds: float | None = None,
    seconds_help: str = "measured seconds per cell",
) -> argparse.ArgumentParser:
    """The parser of the benchmark in `file` (its __file__), described by `doc` (its __doc__);
    --repeats and --seconds only where a default is given: the benchmark has them."""
    p = _Parser(
        prog=f"ctax benchmark {Path(file).stem}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        default=Path(json_default) if json_default else None,
        help="write the numbers here as JSON, with the conditions they were measured in"
        + (f" (default {json_default})" if json_default else ""),
    )
    if repeats is not None:
        p.add_argument(
            "--repeats", type=positive_int, default=repeats, metavar="N", help=f"{repeats_help} (default {repeats})"
        )
    if seconds is not None:
        p.add_argument(
            "--seconds", type=positive_float, default=seconds, metavar="S", help=f"{seconds_help} (default {seconds:g})"
        )
    return p


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """The results under "results", beside the benchmark's command line and conditions; nothing
    when no --json was given."""
    if path is None:
        return
    record = {
        "benchmark": _run.get("benchmark"),
        "argv": _run.get("argv"),
        "conditions": {"start": _run.get("start"), "end": _host_state(), "versions": _versions()},
        "results": results,
    }
    write_atomic(path, json.dumps(record, indent=1, default=str) + "\n")  # default=str: paths among the settings
    print(f"wrote {path}", flush=True)


def pct(xs: list[float], q: float) -> float | None:
    """The q-th percentile of sorted xs by nearest rank, to 0.1 (None for no values)."""
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1)], 1)


def _host_state() -> dict[str, Any]:
    return {
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()],
    }


def _versions() -> dict[str, Any]:
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain")
    return {
        "python": platform.python_version(),
        "connector_tax": connector_tax.__version__,
        "git_head": git("rev-parse", "--short", "HEAD"),
        "git_uncommitted_files": None if status is None else len(status.splitlines()),
    }


# -- child processes ------------------------------------------------------------------------
_CHILDREN: list[subprocess.Popen] = []


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


def reap_children_on_exit() -> None:
    """Every child `spawn` started is killed, with its group, when this process exits or is
    sent SIGTERM: a benchmark stopped half-way leaves no server or client behind."""
    signal.signal(signal.SIGTERM, on_signal)
    atexit.register(kill_all)


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


# -- servers as fixtures ------------------------------------------------------------------------
class Server:
    """A server child that prints `ready URL` once it listens (the two SSE servers of this folder,
    `ctax sim`), in its own process group, pinned to `cpus` if given; close() ends it and its
    group. A context manager."""

    def __init__(self, name: str, cmd: list[str], cpus: Sequence[int] = (), start_s: float = 30.0) -> None:
        self.proc = spawn(cmd, stdout=subprocess.PIPE, text=True)
        if cpus:
            psutil.Process(self.proc.pid).cpu_affinity(list(cpus))
        line = ""
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if line.startswith("ready ") or self.proc.poll() is not None:
                break
        if not line.startswith("ready "):
            kill_tree(self.proc)
            raise RuntimeError(f"{name} did not start (got {line!r})")
        self.url = line.split()[1]

    def stats(self) -> dict[str, int]:
        """The SSE servers' own counts (requests ended, chunks written)."""
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as r:
            return json.loads(r.read())

    def close(self) -> None:
        kill_tree(self.proc)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _script(name: str, cpus: Sequence[int], *argv: str) -> list[str]:
    """One of this folder's SSE servers on a free port; it pins itself to `cpus` at its start."""
    return [sys.executable, str(HERE / name), "--port", "0", *argv, *(f"--cpu={c}" for c in cpus)]


class NullServer(Server):
    """_sse_null_server.py: answers every request at once in one write (the load generator's
    precision, with no server CPU competing)."""

    def __init__(self, cpus: Sequence[int] = (), model: str = "null-model") -> None:
        super().__init__("_sse_null_server.py", _script("_sse_null_server.py", cpus, "--model", model))


class BenchServer(Server):
    """_sse_bench_server.py: an ordinary server, one token per chunk every `token_interval_ms`,
    its own write times in `log` if given (JSONL, flushed every second)."""

    def __init__(self, log: Path | None, cpus: Sequence[int] = (), token_interval_ms: float = 1.0) -> None:
        argv = ("--token-interval-ms", f"{token_interval_ms:g}", *(("--log", str(log)) if log else ()))
        super().__init__("_sse_bench_server.py", _script("_sse_bench_server.py", cpus, *argv))
        self.log = log

    def lines(self) -> dict[str, dict[str, Any]]:
        """Its log by request id, once the last second's writes are flushed."""
        assert self.log is not None, "a BenchServer started without a log"
        time.sleep(1.2)
        out = {}
        for line in self.log.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            out[e["rid"]] = e
        return out


class SimServer(Server):
    """`ctax sim` (the simulated vLLM) with `args` after `sim`, on a free port, pinned to `cpus`."""

    def __init__(self, args: Sequence[str], cpus: Sequence[int] = ()) -> None:
        super().__init__("ctax sim", [sys.executable, "-m", "connector_tax.cli", "sim", *args, "--port", "0"], cpus)


# -- the commands the benchmarks run -------------------------------------------------------------
def ctax_bench(url: str, model: str, out: Path, phase: str, *argv: str) -> list[str]:
    """The `ctax bench` command line against `url`, records under `out`."""
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", url, "--model", model]
    return [*cmd, "--phase", phase, "--out", str(out), *argv]


def load_args(
    rate: float | None, arrival: str, input_len: int, output_len: int, seconds: float, warmup: float
) -> list[str]:
    """`ctax bench`'s load options: open loop at `rate` req/s (None: leave the load to the caller,
    e.g. --concurrency), the prompt and stream lengths, the measured and warm-up seconds."""
    rated = [] if rate is None else ["--rate", f"{rate:g}", "--arrival", arrival]
    lengths = ["--input-len", str(input_len), "--output-len", str(output_len)]
    return [*rated, *lengths, "--duration", f"{seconds:g}", "--warmup", f"{warmup:g}"]


def snakemake(*targets: str, config: Path, directory: Path) -> list[str]:
    """The project's workflow on one core, a study's config, in a scratch folder."""
    argv = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--cores", "1"]
    return [*argv, *targets, "--configfile", str(config), "--directory", str(directory)]


def run_logged(argv: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run `argv` from the checkout, its output appended to `log`: its exit status and seconds."""
    t0 = time.monotonic()
    with open(log, "a") as fh:
        rc = subprocess.run(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    return rc, time.monotonic() - t0
