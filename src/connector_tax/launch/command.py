"""Pick the launch of a variant by the study's backend; `ctax launch-command` prints it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from connector_tax.config import ConfigError, find_variant, load_config
from connector_tax.serving.spec import LaunchSpec


def launch_spec(
    config_path: str | Path,
    config: dict[str, Any],
    variant: dict[str, Any],
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="study config YAML")
    parser.add_argument("--variant", required=True, metavar="NAME", help="the variant (a configuration of the study)")
    parser.add_argument("--port", type=int, default=8000, help="port the server would bind (default 8000)")
    parser.add_argument("--step-log", metavar="PATH", help="step log path the server would write")
    parser.add_argument("--script", action="store_true", help="print launch.sh instead of the argv JSON")


def main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        spec = launch_spec(args.config, config, find_variant(config, args.variant), args.port, args.step_log)
    except (ConfigError, ValueError) as exc:
        print(f"ctax launch-command: {exc}", file=sys.stderr)
        return 2
    print(spec.script() if args.script else json.dumps(spec.argv))
    return 0
