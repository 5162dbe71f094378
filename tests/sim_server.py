"""Helpers for the `ctax sim` tests: start a simulated server as a subprocess, wait for its
ready line, stop it for sure, and read what it says (SSE streams, /metrics, JSONL logs).

Not a conftest: the test modules import it explicitly (`from sim_server import ...`), which
works because pytest puts this directory on sys.path for rootdir-less test folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "default.yaml"
MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
READY_RE = re.compile(r"ready http://(127\.0\.0\.1):(\d+)")
# How long a test waits for a server's ready line, and for it to exit: a bail-out for a server
# that hangs, not a bar. Start-up takes about a second on a quiet host and has taken over 20 s
# with four starting at once on this shared 2-core host under load 15; the start-up bar is
# benchmarks/sim_startup.py's.
WAIT_S = 120.0
ERROR_KEYS = ["message", "type", "param", "code"]


def sim_command(
    *extra: str,
    connector: str = "mooncake_both",
    config: Path | str | None = DEFAULT_CONFIG,
    request_log: Path | None = None,
    step_log: Path | None = None,
    port: int = 0,
) -> list[str]:
    cmd = [sys.executable, "-m", "connector_tax.cli", "sim", "--variant", connector, "--port", str(port)]
    if config is not None:
        cmd += ["--config", str(config)]
    if request_log is not None:
        cmd += ["--request-log", str(request_log)]
    if step_log is not None:
        cmd += ["--step-log", str(step_log)]
    return cmd + list(extra)


@dataclass
class SimProcess:
    """One `ctax sim` subprocess. stdout is read line by line on a thread (so a ready line
    can be waited for with a timeout); stderr goes to a file so it can never block."""

    proc: subprocess.Popen[str]
    t_start: float
    stderr_path: Path
    request_log: Path | None = None
    step_log: Path | None = None
    url: str | None = None
    port: int | None = None
    ready_line: str | None = None
    ready_s: float | None = None
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read_line(self, timeout: float) -> str | None:
        """The next stdout line; None at EOF; raises TimeoutError if none comes in time."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no stdout line within {timeout} s") from None

    def wait_ready(self, timeout: float = WAIT_S) -> str:
        line = self.read_line(timeout)
        if line is None:
            raise RuntimeError(f"sim exited ({self.proc.wait(5)}) before ready: {self.stderr()}")
        self.ready_s = time.monotonic() - self.t_start
        self.ready_line = line.rstrip("\n")
        match = READY_RE.fullmatch(self.ready_line)
        if match is None:
            raise AssertionError(f"bad ready line {self.ready_line!r}")
        self.port = int(match.group(2))
        self.url = f"http://{match.group(1)}:{self.port}"
        return self.ready_line

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 5 s; returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def request_records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.request_log)

    def step_records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.step_log)


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def launch(
    workdir: Path,
    *extra: str,
    connector: str = "mooncake_both",
    config: Path | str | None = DEFAULT_CONFIG,
    logs: bool = True,
    name: str = "sim",
) -> SimProcess:
    """Start a server (does not wait for ready). The caller must stop() it."""
    workdir.mkdir(parents=True, exist_ok=True)
    request_log = workdir / f"{name}-requests.jsonl" if logs else None
    step_log = workdir / f"{name}-steps.jsonl" if logs else None
    stderr_path = workdir / f"{name}-stderr.txt"
    cmd = sim_command(*extra, connector=connector, config=config, request_log=request_log, step_log=step_log)
    env = {k: v for k, v in os.environ.items() if k != "CONNECTOR_TAX_STEP_LOG"}
    with open(stderr_path, "w", encoding="utf-8") as err:
        t_start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    sim = SimProcess(proc, t_start, stderr_path, request_log, step_log)
    threading.Thread(target=sim._pump, name=f"{name}-stdout", daemon=True).start()
    return sim


@contextlib.contextmanager
def running_sim(workdir: Path, *extra: str, ready_timeout: float = WAIT_S, **kwargs: Any) -> Iterator[SimProcess]:
    """A started, ready server that is always stopped afterwards."""
    sim = launch(workdir, *extra, **kwargs)
    try:
        sim.wait_ready(ready_timeout)
        yield sim
    finally:
        sim.stop()


def small_config(path: Path, max_model_len: int = 4096) -> Path:
    """A copy of configs/default.yaml with a smaller server.max_model_len, validated."""
    from connector_tax.config import load_config

    data = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    data["server"]["max_model_len"] = max_model_len
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    load_config(path)
    return path


# -- SSE ----------------------------------------------------------------------------------
def split_sse(raw: bytes) -> list[bytes]:
    """The payloads of a complete SSE body, checking vLLM's framing: every event is exactly
    `data: <payload>\\n\\n`."""
    assert raw.endswith(b"\n\n"), raw[-200:]
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: "), event[:200]
        assert b"\n" not in event, event[:200]
    return [event[len(b"data: ") :] for event in events]


def json_events(payloads: list[bytes]) -> list[dict[str, Any]]:
    """All payloads but the final [DONE], parsed (asserting the stream ends with [DONE])."""
    assert payloads and payloads[-1] == b"[DONE]", payloads[-1:]
    assert b"[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def stream_post(
    client: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Response, bytes]:
    with client.stream("POST", path, json=body, headers=headers) as response:
        raw = response.read()
    return response, raw


def words(text: str) -> list[str]:
    """Simulated tokens are single words with a leading space."""
    assert re.fullmatch(r"( \w+)*", text), text
    return text.split()


# -- /metrics -----------------------------------------------------------------------------
@dataclass
class Scrape:
    families: dict[str, Any]
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        labels = {"model_name": MODEL, "engine": "0", **labels}
        return self.samples[(name, frozenset(labels.items()))]


def scrape(client: httpx.Client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {(s.name, frozenset(s.labels.items())): s.value for fam in families.values() for s in fam.samples}
    return Scrape(families, samples)


def poll(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Calls predicate until it returns something truthy or the time is up; returns the last
    result either way (the caller asserts on it). The timeout is a bail-out: what is polled for
    comes in milliseconds on a quiet host, and may take seconds on a loaded one."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(interval)


def assert_error(response: httpx.Response, status: int, err_type: str, param: str | None) -> str:
    """vLLM's error body, exact keys in order; returns the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"]
    error = body["error"]
    assert list(error) == ERROR_KEYS
    assert error["type"] == err_type, error
    assert error["param"] == param, error
    assert error["code"] == status
    assert isinstance(error["message"], str) and error["message"]
    return error["message"]


# A `ctax bench` run's exit (tests of the command against a server, in any tier).
TIMING_CHECKS = ("lateness", "dispatch_rate_error", "cpu_frac", "issue_overrun", "unissued")


def ran(proc: subprocess.CompletedProcess) -> bool:
    """The run measured: exit 0, or 1 with its cell invalid only for its timing (a busy host's doing)."""
    if proc.returncode == 0:
        return True
    reasons = proc.stdout.rpartition("[INVALID: ")[2].rstrip("]\n").split("; ")
    return proc.returncode == 1 and all(r.startswith(TIMING_CHECKS) for r in reasons)
