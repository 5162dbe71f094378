"""Pick the launch of a variant by the study's backend (`ctax launch-command` prints it: launch/cli.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector_tax.launch import lmcache_mp
from connector_tax.serving.spec import LaunchSpec

SIDECAR_PORTS = lmcache_mp.PORTS  # ports reserved per sidecar (free_port's block)


def sidecar_names(config: Mapping[str, Any], variant: Mapping[str, Any]) -> list[str]:
    """The sidecars a variant's launch starts before its server (an LMCache MP server for a
    connector of type lmcache_mp, simulated or real); ports for each are reserved by the caller."""
    return [lmcache_mp.SIDECAR] if config["backend"] != "openai" and lmcache_mp.uses(variant) else []


def launch_spec(
    config_path: str | Path,
    config: Mapping[str, Any],
    variant: Mapping[str, Any],
    port: int,
    step_log: str | None = None,
    sidecars: dict[str, int] | None = None,
) -> LaunchSpec:
    """sidecars: {name: first port} reserved for the variant's sidecars (sidecar_names); where
    absent, the launch is planned on fixed ports (fingerprints, printed commands)."""
    backend = config["backend"]
    if backend == "sim":
        from connector_tax.launch.sim import sim_command

        return sim_command(config_path, config, variant, port, step_log, sidecars)
    if backend == "vllm":
        from connector_tax.launch.vllm import vllm_command

        return vllm_command(config, variant, port, step_log, sidecars)
    return LaunchSpec(argv=[], url=config["openai"]["url"])
