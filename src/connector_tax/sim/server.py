"""The simulated vLLM server for one server variant of a study config (`ctax sim`, whose
arguments are commands/sim.py's).

Start-up order: resolve and validate everything (a bad argument fails here, in one line,
before a socket is opened), bind the socket (port 0 picks a free port), start the engine
thread, serve with uvicorn (uvloop + httptools), and only once uvicorn accepts print
`ready http://HOST:PORT`. Faults that end the process use os._exit with code 70, the
way a dying engine takes the API server down with it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import uvicorn
import uvloop

from connector_tax.config import ConfigError, load_study
from connector_tax.contract.records import LAUNCH_SEED_ENV
from connector_tax.sim.api import SimApp
from connector_tax.sim.engine import EngineCore
from connector_tax.sim.faults import FaultDice, FaultSettings
from connector_tax.sim.metrics import SimMetrics
from connector_tax.sim.runner import EngineRunner
from connector_tax.sim.settings import SimSettings, resolve
from connector_tax.sim.steplog import STEP_LOG_ENV, StepLog

CRASH_EXIT_CODE = 70
FAIL_START_EXIT_CODE = 3


def _error(message: str) -> int:
    print(f"ctax sim: {message}", file=sys.stderr, flush=True)
    return 2


def _die(reason: str) -> None:
    print(f"ctax sim: simulated crash: {reason}", file=sys.stderr, flush=True)
    os._exit(CRASH_EXIT_CODE)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _open_log(path: str | None) -> IO[str] | None:
    if not path:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", encoding="utf-8")


def run(
    config_path: Path,
    variant: str,
    cli_faults: Mapping[str, object],
    *,
    host: str | None,
    port: int,
    ready_file: str | None,
    step_log: str | None,
    request_log: str | None,
    seed: int,
) -> int:
    """Serve `variant` of the study at `config_path` until stopped; `cli_faults` override the
    config's sim.faults. The exit code: 2 for bad input (one line), FAIL_START_EXIT_CODE for a
    fail_start fault."""
    try:
        study = load_study(config_path)
        launch = os.environ.get(LAUNCH_SEED_ENV)
        settings = resolve(study, study.variant(variant), dict(cli_faults), int(launch) if launch else None)
    except (ConfigError, ValueError) as exc:
        return _error(str(exc))
    if settings.faults.fail_start:
        print(f"ctax sim: {settings.variant}: failed to start: {settings.faults.fail_start}", file=sys.stderr)
        return FAIL_START_EXIT_CODE
    if port < 0 or port > 65535:
        return _error(f"--port: {port} is not a port number (0-65535)")
    host = host or settings.host
    step_log_path = step_log or os.environ.get(STEP_LOG_ENV)
    try:
        steps = StepLog(step_log_path) if step_log_path else None
        requests = _open_log(request_log)
        if settings.faults.slow_start_s:
            time.sleep(settings.faults.slow_start_s)
        sock = _bind(host, port)
    except OSError as exc:
        return _error(f"cannot start on {host}:{port}: {exc.strerror or exc}")
    uvloop.install()
    return asyncio.run(_serve(settings, sock, steps, requests, ready_file, seed))


async def _serve(
    settings: SimSettings,
    sock: socket.socket,
    step_log: StepLog | None,
    request_log: IO[str] | None,
    ready_file: str | None,
    seed: int,
) -> int:
    faults: FaultSettings = settings.faults
    core = EngineCore(settings.engine, settings.cost_model)
    metrics = SimMetrics(settings.model, core)

    def on_accept(count: int) -> None:
        if faults.crash_after_requests is not None and count > faults.crash_after_requests:
            _die(f"after {faults.crash_after_requests} requests")

    app = SimApp(
        model=settings.model,
        max_model_len=settings.engine.max_model_len,
        vllm_version=settings.vllm_version,
        submit=lambda r: runner.submit(r),
        abort=lambda r: runner.abort(r),
        metrics=metrics,
        dice=FaultDice(faults, seed),
        request_log=request_log,
        on_accept=on_accept,
    )
    app.loop = loop = asyncio.get_running_loop()

    def on_death(exc: BaseException) -> None:
        loop.call_soon_threadsafe(app.mark_engine_dead)

    runner = EngineRunner(
        core,
        publish=app.publish,
        on_step=metrics.on_step,
        step_log=step_log,
        on_death=on_death,
    )
    runner.start()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="none",
            http="httptools",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            runner.stop()
            return _error(f"server failed to start: {serving.exception()}")
        await asyncio.sleep(0.005)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    line = f"ready http://{shown}:{port}"
    if ready_file:
        Path(ready_file).write_text(line + "\n", encoding="utf-8")
    print(line, flush=True)
    loop = asyncio.get_running_loop()
    if faults.crash_after_s is not None:
        loop.call_later(faults.crash_after_s, _die, f"after {faults.crash_after_s} s")
    if faults.health_503_after_s is not None:
        loop.call_later(faults.health_503_after_s, app.mark_engine_dead)
    try:
        await serving
    finally:
        runner.stop()
        if request_log is not None:
            request_log.close()
    return 0
