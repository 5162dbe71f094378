"""A variant's sidecars: processes its server needs beside it, started before it, stopped after it.

An LMCache multi-process server (the `lmcache_mp` connector type talks to it over ZMQ) is one; a
Mooncake master or a bootstrap registry would be others. Each runs as a ServerProcess of its own
(own session, parent-death signal, group watchdog, logs `sidecar_<name>_std{out,err}.log` and its
launch `sidecar_<name>.sh` beside the server's), so nothing here repeats how a process group is
started or stopped, and no sidecar outlives its owner however the owner ends.

Order is the point: a server that connects to a sidecar at start-up may wait minutes for one that
is absent (vLLM's LMCacheMPConnector: `lmcache.mp.mq_timeout`, 300 s), so every sidecar is ready
before the server starts, and `failure()`, asked while the server starts and during every cell,
turns a sidecar that died into a failed start or a failed cell within a poll.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx

from connector_tax.serving.server_process import ServerProcess, ServerStartError, release_port, root_cause, tail
from connector_tax.serving.spec import LaunchSpec, SidecarSpec

POLL_S = 0.1
# Once the server is ready, its connector has registered with a sidecar that can say so (LMCache's
# worker registers while vLLM starts, tens of seconds before it answers).
REGISTER_TIMEOUT_S = 30.0


def _answers(ready: str) -> bool:
    """Whether the readiness URL says ready now: HTTP 200, or a TCP connection accepted."""
    target = urlsplit(ready)
    try:
        if target.scheme == "tcp":
            with socket.create_connection((target.hostname, target.port), timeout=1.0):
                return True
        return httpx.get(ready, timeout=1.0).status_code == 200
    except (OSError, httpx.HTTPError):
        return False


class Sidecar:
    """One sidecar process: started, waited for, asked whether it is alive, stopped."""

    def __init__(self, spec: SidecarSpec, log_dir: Path, cpus: tuple[int, ...] = ()) -> None:
        self.spec = spec
        launch = LaunchSpec(argv=spec.argv, env=spec.env)
        self.process = ServerProcess(
            launch, spec.ready, log_dir, cpus=cpus, name=f"sidecar_{spec.name}", script=f"sidecar_{spec.name}.sh"
        )

    @property
    def pid(self) -> int | None:
        return self.process.proc.pid if self.process.proc is not None else None

    def start(self) -> None:
        try:
            self.process.start()
        except OSError as exc:  # its executable is missing or not executable
            raise ServerStartError(
                f"sidecar {self.spec.name} ({self.spec.label}): cannot start {self.spec.argv[0]}: {exc.strerror or exc}"
            ) from exc

    def _log(self) -> str:
        return tail(self.process.stderr_path, 200) + "\n" + tail(self.process.stdout_path, 200)

    def failure(self) -> str | None:
        """One line when the sidecar has exited (with the root cause from its log), else None."""
        code = self.process.exited()
        if code is None:
            return None
        cause = root_cause(self._log())
        return f"sidecar {self.spec.name} ({self.spec.label}) exited with code {code}" + (f": {cause}" if cause else "")

    def wait_ready(self) -> None:
        """Ready within its timeout, or ServerStartError: it exited (with why), or never answered."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while not _answers(self.spec.ready):
            if (why := self.failure()) is not None:
                raise ServerStartError(why)
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"sidecar {self.spec.name} ({self.spec.label}) not ready after {self.spec.ready_timeout_s:g} s "
                    f"({self.spec.ready} did not answer)",
                    self._log(),
                )
            time.sleep(POLL_S)

    def registered(self) -> bool | None:
        """Whether a worker of the server has registered with it (None: it cannot say)."""
        if not self.spec.registered:
            return None
        try:
            doc = json.loads(httpx.get(self.spec.registered, timeout=2.0).text)
        except (OSError, ValueError, httpx.HTTPError):
            return False
        return any(isinstance(doc, dict) and doc.get(key) for key in self.spec.registered_keys)

    def stop(self) -> None:
        self.process.stop()
        release_port(self.spec.port)


def _stop_all(sidecars: list[Sidecar], raising: bool) -> None:
    """Stop every sidecar, last started first, whatever one stop raises: a failed stop never leaves
    the others running. The first failure is raised after all were stopped (raising), else said on
    stderr (an exception already on its way out is the one that matters)."""
    failed: list[Exception] = []
    for sidecar in reversed(sidecars):
        try:
            sidecar.stop()
        except Exception as exc:  # noqa: BLE001 - the next sidecar is stopped all the same
            failed.append(exc)
            print(f"sidecar {sidecar.spec.name}: stop failed: {exc!r}", file=sys.stderr, flush=True)
    if failed and raising:
        raise failed[0]


class Sidecars:
    """A launch's sidecars: entered, each is started and ready in turn (a failure stops those
    already started and raises ServerStartError); left, all are stopped, last started first."""

    def __init__(self, specs: tuple[SidecarSpec, ...], log_dir: Path, cpus: tuple[int, ...] = ()) -> None:
        self.sidecars = [Sidecar(spec, log_dir, cpus) for spec in specs]

    def __enter__(self) -> Sidecars:
        started: list[Sidecar] = []
        try:
            for sidecar in self.sidecars:
                started.append(sidecar)
                sidecar.start()
                sidecar.wait_ready()
        except BaseException:
            _stop_all(started, raising=False)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _stop_all(self.sidecars, raising=exc is None)

    def failure(self) -> str | None:
        """Why a sidecar has failed (the first that exited), or None while all run."""
        return next((why for s in self.sidecars if (why := s.failure()) is not None), None)

    def roots(self) -> dict[int, str]:
        """{pid: name} of the running sidecars' processes (their threads are sampled with the server's)."""
        return {s.pid: s.spec.name for s in self.sidecars if s.pid is not None}

    def pgids(self) -> tuple[int, ...]:
        """Their process groups (each runs in a session of its own): the study's own CPU, not contention."""
        return tuple(self.roots())

    def check_registered(self, timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        """Every sidecar that can say so names a registered worker within timeout_s, else
        ServerStartError: the server's connector started without reaching its sidecar."""
        deadline = time.monotonic() + timeout_s
        for sidecar in self.sidecars:
            while sidecar.registered() is False:
                if (why := self.failure()) is not None:
                    raise ServerStartError(why)
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"sidecar {sidecar.spec.name} ({sidecar.spec.label}): no worker of the server registered "
                        f"within {timeout_s:g} s of the server being ready ({sidecar.spec.registered})"
                    )
                time.sleep(0.25)

    def records(self) -> list[dict[str, Any]]:
        """run.json's `sidecars`: each one's launch, version and pid."""
        return [{**s.spec.record(), "pid": s.pid} for s in self.sidecars]
