"""Pick the launch of a variant by the study's backend (`ctax launch-command` prints it: launch/cli.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector_tax.serving.spec import LaunchSpec


def launch_spec(
    config_path: str | Path,
    config: Mapping[str, Any],
    variant: Mapping[str, Any],
    port: int,
    step_log: str | None = None,
) -> LaunchSpec:
    backend = config["backend"]
    if backend == "sim":
        from connector_tax.launch.sim import sim_command

        return sim_command(config_path, config, variant, port, step_log)
    if backend == "vllm":
        from connector_tax.launch.vllm import vllm_command

        return vllm_command(config, variant, port, step_log)
    return LaunchSpec(argv=[], url=config["openai"]["url"])
