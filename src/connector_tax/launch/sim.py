"""The simulated server's launch: `ctax sim` for one variant of the study config, and the stand-in
LMCache server (sim/sidecar.py) beside it for a variant with an lmcache_mp connector."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector_tax.config import LmcacheServer
from connector_tax.config.merge import deep_merge
from connector_tax.contract.records import STEP_LOG_ENV
from connector_tax.launch import lmcache_mp
from connector_tax.serving.spec import LaunchSpec, SidecarSpec


def sim_command(
    config_path: str | Path,
    config: Mapping[str, Any],
    variant: Mapping[str, Any],
    port: int,
    step_log: str | None = None,
    sidecar_ports: dict[str, int] | None = None,
) -> LaunchSpec:
    host = variant.get("server", {}).get("host") or config["server"]["host"]
    argv = [
        sys.executable,
        "-m",
        "connector_tax.cli",
        "sim",
        "--config",
        str(config_path),
        "--variant",
        variant["name"],
        "--host",
        host,
        "--port",
        str(port),
        "--seed",
        str(config.get("seed", 0)),
    ]
    env = dict(variant.get("env", {}))
    if step_log:
        env[STEP_LOG_ENV] = step_log
    sidecars: tuple[SidecarSpec, ...] = ()
    if lmcache_mp.uses(variant):
        port = (sidecar_ports or {}).get(lmcache_mp.SIDECAR, lmcache_mp.PLANNED_PORT)
        sidecars = (_lmcache_server(config, variant, host, port),)
    return LaunchSpec(argv=argv, env=env, sidecars=sidecars)


def _lmcache_server(config: Mapping[str, Any], variant: Mapping[str, Any], host: str, port: int) -> SidecarSpec:
    """A stand-in for the LMCache MP server an lmcache_mp variant needs (sim/sidecar.py): a process
    with its own ports and readiness, so the sidecar's lifecycle is tested without LMCache; its
    faults (sim.faults.sidecar_*) are the variant's."""
    faults = deep_merge(config.get("sim") or {}, variant.get("sim") or {}).get("faults") or {}
    argv = [sys.executable, "-m", "connector_tax.sim.sidecar", "--host", host, "--port", str(port)]
    argv += ["--http-port", str(port + 1)]
    if faults.get("sidecar_fail_start"):
        argv += ["--fail-start", faults["sidecar_fail_start"]]
    if faults.get("sidecar_never_ready"):
        argv.append("--never-ready")
    if faults.get("sidecar_crash_after_s"):
        argv += ["--crash-after-s", str(faults["sidecar_crash_after_s"])]
    return SidecarSpec(
        name=lmcache_mp.SIDECAR,
        what="simulated LMCache MP server (ctax sim)",
        argv=argv,
        env={},
        port=port,
        ready=f"http://{host}:{port + 1}/healthcheck",
        ready_timeout_s=LmcacheServer.from_config(config).ready_timeout_s,
    )
