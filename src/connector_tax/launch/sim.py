"""The simulated server's launch: `ctax sim` for one variant of the study config, and the stand-in
LMCache server (sim/lmcache_server.py) beside it for a variant with an lmcache_mp connector."""

from __future__ import annotations

import sys
from pathlib import Path

from connector_tax.config import StudyConfig, Variant
from connector_tax.config.merge import deep_merge
from connector_tax.contract.records import STEP_LOG_ENV
from connector_tax.launch import lmcache_mp
from connector_tax.serving.spec import LaunchSpec, SidecarSpec


def sim_command(
    config_path: str | Path,
    study: StudyConfig,
    variant: Variant,
    port: int,
    step_log: str | None = None,
    sidecar_ports: dict[str, int] | None = None,
) -> LaunchSpec:
    host = variant.host or study.host
    argv = [
        sys.executable,
        "-m",
        "connector_tax.cli",
        "sim",
        "--config",
        str(config_path),
        "--variant",
        variant.name,
        "--host",
        host,
        "--port",
        str(port),
        "--seed",
        str(study.seed),
    ]
    env = dict(variant.env)
    if step_log:
        env[STEP_LOG_ENV] = step_log
    sidecars: tuple[SidecarSpec, ...] = ()
    if lmcache_mp.uses(variant):
        port = (sidecar_ports or {}).get(lmcache_mp.SIDECAR, lmcache_mp.PLANNED_PORT)
        sidecars = (_lmcache_server(study, variant, host, port),)
    return LaunchSpec(argv=argv, env=env, sidecars=sidecars)


def _lmcache_server(study: StudyConfig, variant: Variant, host: str, port: int) -> SidecarSpec:
    """A stand-in for the LMCache MP server an lmcache_mp variant needs (sim/lmcache_server.py): a process
    with its own ports and readiness, so the sidecar's lifecycle is tested without LMCache; its
    faults (sim.faults.sidecar_*) are the variant's."""
    faults = deep_merge(dict(study.sim), dict(variant.sim)).get("faults") or {}
    argv = [sys.executable, "-m", "connector_tax.sim.lmcache_server", "--host", host, "--port", str(port)]
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
        ready_timeout_s=study.lmcache_server.ready_timeout_s,
    )
