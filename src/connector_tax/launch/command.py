"""Pick the launch of a variant by the study's backend (`ctax launch-command` prints it: commands/launch_command.py)."""

from __future__ import annotations

from pathlib import Path

from connector_tax.config import StudyConfig, Variant
from connector_tax.launch import lmcache_mp
from connector_tax.serving.spec import LaunchSpec

SIDECAR_PORTS = lmcache_mp.PORTS  # ports reserved per sidecar (free_port's block)


def sidecar_names(study: StudyConfig, variant: Variant) -> list[str]:
    """The sidecars a variant's launch starts before its server (an LMCache MP server for a
    connector of type lmcache_mp, simulated or real); ports for each are reserved by the caller."""
    return [lmcache_mp.SIDECAR] if study.backend != "openai" and lmcache_mp.uses(variant) else []


def launch_spec(
    config_path: str | Path,
    study: StudyConfig,
    variant: Variant,
    port: int,
    step_log: str | None = None,
    sidecars: dict[str, int] | None = None,
    evidence: str | None = None,
) -> LaunchSpec:
    """sidecars: {name: first port} reserved for the variant's sidecars (sidecar_names); where
    absent, the launch is planned on fixed ports (fingerprints, printed commands). evidence: the
    folder where a vLLM variant's declared interventions write what they did (launch/evidence.py)."""
    if study.backend == "sim":
        from connector_tax.launch.sim import sim_command

        return sim_command(config_path, study, variant, port, step_log, sidecars)
    if study.backend == "vllm":
        from connector_tax.launch.vllm import vllm_command

        return vllm_command(study, variant, port, step_log, sidecars, evidence)
    return LaunchSpec(argv=[], url=study.openai_url)
