"""One launched server: its own process group, logs on disk, bounded readiness, sure stop.

The server runs in a new session (process group), so stopping it reaches every process it
spawned (vLLM's engine core and workers): SIGTERM first, SIGKILL after a grace period, then
SIGKILL to what is left of the group, on every path. If this process dies instead, the server
gets SIGKILL from the kernel (parent-death signal) and its group from a watchdog
(serving.lifecycle): no server outlives its owner, however the owner ends.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import httpx
import psutil

from connector_tax.config import StudyConfig, Variant
from connector_tax.serving.lifecycle import GroupWatchdog, die_with_parent, exclusive_lock, private_dir
from connector_tax.serving.spec import LaunchSpec

# How long a launch may take to answer /health and /v1/models: vLLM loads a model first.
READY_TIMEOUT_S = {"sim": 30.0, "vllm": 900.0, "openai": 30.0}


def ready_timeout_s(study: StudyConfig, variant: Variant) -> float:
    """`server.ready_timeout_s` of the variant, else of the study, else the backend's default."""
    value = variant.server.get("ready_timeout_s") or study.server.get("ready_timeout_s")
    return float(value or READY_TIMEOUT_S[study.backend])


# Lines that say why a server could not start better than its last line does: a connector
# whose package is missing (vLLM's own messages), then the exception a traceback ends in.
# vLLM's engine start-up failure ends with "Engine core initialization failed. See root cause
# above", so the root cause is the first match, not the last line.
# A connector's package missing, as vLLM 0.32/0.33 say it (RuntimeError from the Mooncake
# and NIXL workers; an ImportError naming the module for LMCache, or for nixl/mooncake when
# imported directly). tools/gpu_smoke.sh reports these SKIP, not FAIL (`missing_connector`).
MISSING_CONNECTOR = re.compile(
    r"(Mooncake is not available|NIXL is not available"
    r"|No module named '?(?:lmcache|nixl|nixl_cu12|mooncake)[\w.]*'?)"
)
ROOT_CAUSES = (
    MISSING_CONNECTOR,
    # vLLM's engine core quoting its worker's exception: the worker's root cause, verbatim
    re.compile(r"Worker failed with error '(.+)', please check the stack trace above"),
    re.compile(r"(No module named '?[\w.]+'?)"),
    re.compile(r"\b(\w+(?:Error|Exception): .+)$"),
)
# Lines that are never a root cause: a log line at WARNING level (vLLM's ulimit warning quotes an
# OSError), and Python's "Exception ignored in: ... __del__" report of an error raised while an
# object that failed to construct is collected (Mooncake's worker: no attribute 'async_zmq_ctx'),
# which comes after the real failure and must not stand for it.
_WARNING = re.compile(r"\bWARNING\b")
_IGNORED = "Exception ignored in"

# A connector that started but says it cannot do its work: it serves, so /health is 200, yet
# measuring it would measure a broken connector (LMCache 0.5.6 on CPU: every new request waits out
# its lookup timeout). wait_ready fails such a start; the preflight's probe usually finds it first.
DEGRADED = re.compile(r"System will operate in degraded mode \(recompute\)")


# vLLM's line when its engine core dies during start-up. Usually the server exits a moment later;
# vLLM 0.32 on CPU sometimes hangs instead (the Mooncake worker's shutdown raises), so a start-up
# wait that sees this line and no exit ENGINE_FAILED_GRACE_S later fails the start rather than
# waiting out its whole timeout. tools/preflight_client.py (standard library only) has the same.
ENGINE_FAILED = "EngineCore failed to start"
ENGINE_FAILED_GRACE_S = 20.0


def missing_connector(log: str) -> str | None:
    """vLLM's own message when a configuration's connector package is not installed."""
    found = MISSING_CONNECTOR.search(log)
    return found.group(1) if found else None


def _candidate_lines(log_tail: str) -> list[str]:
    """The log's lines without warnings and without "Exception ignored in" reports (each runs to
    the exception line that ends it)."""
    out, ignoring = [], False
    for raw in log_tail.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(_IGNORED):
            ignoring = True
            continue
        if ignoring:
            if re.match(r"^\w+(?:Error|Exception)\b", line):
                ignoring = False
            continue
        if not _WARNING.search(line):
            out.append(line)
    return out


def degraded(log: str) -> str | None:
    """A connector's own "degraded mode" report with its cause, e.g. "No supported cpu connector
    found. (LMCache: System will operate in degraded mode (recompute))"; None if there is none."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if DEGRADED.search(line):
            before = [m.group(1) for m in (re.search(r"\b\w+(?:Error|Exception): (.+)$", x) for x in lines[:i]) if m]
            cause = before[-1].strip() if before else line.strip()
            who = "LMCache" if "LMCache" in "".join(lines[max(0, i - 40) : i + 1]) else "the connector"
            return f"{cause} ({who}: System will operate in degraded mode (recompute))"
    return None


def root_cause(log_tail: str) -> str:
    """The most telling line of a failed server's log: the first match of ROOT_CAUSES (in order
    of the patterns), else the last non-empty line; warnings and errors reported from a __del__
    ("Exception ignored in") never count."""
    lines = _candidate_lines(log_tail) or [line.strip() for line in log_tail.splitlines() if line.strip()]
    for pattern in ROOT_CAUSES:
        for line in lines:
            found = pattern.search(line)
            if found and "See root cause above" not in line:
                return found.group(1)
    return lines[-1] if lines else ""


class ServerStartError(RuntimeError):
    """str() is one line (what failed and the root cause from the server's log, see
    root_cause); `log_tail` has more."""

    def __init__(self, what: str, log_tail: str = "") -> None:
        cause = root_cause(log_tail)
        super().__init__(f"{what}: {cause}" if cause else what)
        self.log_tail = log_tail


# Servers listen on ports below or above the kernel's ephemeral range, never in it: there a
# client's connection (the load generator's, another job's) could take a chosen port before the
# server binds it. Each chosen block is held under one file lock per port (private per-user
# directory) until the server stops or this process ends, so jobs side by side on one node —
# SLURM jobs on a shared node included — never choose the same port.
SERVER_PORTS = (20000, 65536)
_reserved: dict[int, list[int]] = {}


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(family: int, host: str, port: int) -> bool:
    with socket.socket(family) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", block: int = 1) -> int:
    """A port that is free now, with the `block - 1` ports after it free too (a vLLM launch
    also binds its connectors' side channels at port+1, port+2), outside the ephemeral range and
    reserved for this process until release_port (or its end)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    eph_low, eph_high = _ephemeral_range()
    low, high = SERVER_PORTS
    candidates = [p for p in range(low, high - block + 1) if p + block - 1 < eph_low or p > eph_high]
    if not candidates:
        raise OSError(f"no ports outside the ephemeral range {eph_low}-{eph_high} for a server")
    locks = private_dir("ports")
    start = random.randrange(len(candidates))
    for i in range(len(candidates)):
        port = candidates[(start + i) % len(candidates)]
        fds = []
        for p in range(port, port + block):
            fd = exclusive_lock(locks / f"port{p}.lock")
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == block and all(_bindable(family, host, p) for p in range(port, port + block)):
            _reserved[port] = fds
            return port
        for fd in fds:
            os.close(fd)
    raise OSError(f"no block of {block} free ports on {host}")


def release_port(port: int | None) -> None:
    """Give back a block free_port reserved (the server that used it has stopped)."""
    for fd in _reserved.pop(port or -1, []):
        os.close(fd)


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    def __init__(
        self,
        spec: LaunchSpec,
        url: str,
        log_dir: Path,
        grace_s: float = 10.0,
        cpus: tuple[int, ...] = (),
        name: str = "server",
        script: str = "launch.sh",
    ) -> None:
        """cpus: where the server may run (empty: anywhere). Set on the process right after
        launch, before it starts threads or children, which inherit it. name: the logs'
        prefix (<name>_stdout.log); script: the file the launch is written to (a sidecar,
        serving/sidecar.py, is one of these under its own names)."""
        self.spec = spec
        self.cpus = cpus
        self.url = url.rstrip("/")
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.stdout_path = log_dir / f"{name}_stdout.log"
        self.stderr_path = log_dir / f"{name}_stderr.log"
        self.script_path = log_dir / script
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: GroupWatchdog | None = None
        self.engine_failed_grace_s = ENGINE_FAILED_GRACE_S

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if not self.spec.argv:
            return  # an external server: nothing to launch
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.cpus and not set(self.cpus) <= os.sched_getaffinity(0):
            self.cpus = ()  # CPUs this process may not use itself: the child could not either
        self._write_script()
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.spec.argv,
                env=self.spec.environ(),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self._watchdog = GroupWatchdog(self.proc.pid)
        if self.cpus:
            try:
                psutil.Process(self.proc.pid).cpu_affinity(list(self.cpus))
            except (psutil.Error, OSError, ValueError):
                self.cpus = ()  # unpinned, and run.json and launch.sh say so
                self._write_script()

    def _write_script(self) -> None:
        script = self.spec.script()
        if self.cpus:
            cpus = ",".join(map(str, self.cpus))
            script += (
                f"# launched pinned to CPUs {cpus} (as by taskset -c {cpus}), off the load generator's worker cores\n"
            )
        self.script_path.write_text(script, encoding="utf-8")

    def wait_ready(self, timeout_s: float, beside: Callable[[], str | None] = lambda: None) -> None:
        """/health, then /v1/models, both 200, within timeout_s; else the log tail in the error.
        beside(): why a process the server needs (a sidecar) has failed, or None; asked at every
        poll, so a sidecar that dies fails the start at once (vLLM would wait out its own timeout)."""
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None  # when the log first said the engine failed
        next_look = 0.0
        with httpx.Client(timeout=2.0) as client:
            for path in ("/health", "/v1/models"):
                while True:
                    if self.proc is not None and self.proc.poll() is not None:
                        raise self._failure(f"server exited with code {self.proc.returncode}")
                    if (why := beside()) is not None:
                        raise ServerStartError(why)
                    now = time.monotonic()
                    if self.proc is not None and failed_at is None and now >= next_look:
                        next_look = now + 1.0  # the log is read once a second, not every poll
                        if ENGINE_FAILED in tail(self.stdout_path, 400) + tail(self.stderr_path, 400):
                            failed_at = now
                    if failed_at is not None and now - failed_at > self.engine_failed_grace_s:
                        raise self._failure("engine core failed during start-up (the server hung instead of exiting)")
                    try:
                        if client.get(self.url + path).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise self._failure(f"not ready after {timeout_s:.0f} s ({path})")
                    time.sleep(0.05)
        if self.proc is not None:
            why = degraded(tail(self.stdout_path, 4000) + "\n" + tail(self.stderr_path, 4000))
            if why is not None:
                raise ServerStartError(f"a connector came up degraded: {why}")

    def _failure(self, what: str) -> ServerStartError:
        return ServerStartError(what, tail(self.stderr_path, 200) or tail(self.stdout_path, 200))

    def exited(self) -> int | None:
        """The server's exit code once it has exited (None while it runs, or if external)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> int | None:
        """SIGTERM to the group, SIGKILL after the grace period, then SIGKILL to whatever of the
        group is left (the engine core, workers) on every path."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)
        proc.wait()
        if self._watchdog is not None:
            self._watchdog.release()
            self._watchdog = None
        release_port(urlsplit(self.url).port)
        return proc.returncode

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
