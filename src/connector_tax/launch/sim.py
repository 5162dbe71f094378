"""The simulated server's launch: `ctax sim` for one variant of the study config."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector_tax.contract.records import STEP_LOG_ENV
from connector_tax.serving.spec import LaunchSpec


def sim_command(
    config_path: str | Path,
    config: Mapping[str, Any],
    variant: Mapping[str, Any],
    port: int,
    step_log: str | None = None,
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
    return LaunchSpec(argv=argv, env=env)
