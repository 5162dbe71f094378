"""What the GPU-host shell scripts (tools/verify_*.sh, tools/gpu_smoke.sh) ask the package: the
internal entry point they run, not a `ctax` command (the scripts run it with the package's own
Python, $CTAX_PYTHON, where `ctax` may not be on PATH). In the commands' style: each action's
arguments a dataclass, its own main.

    python -m connector_tax.commands.for_tools names CONFIG
    python -m connector_tax.commands.for_tools gated CONFIG CHECK [--only NAME]
    python -m connector_tax.commands.for_tools plan CONFIG NAME --port P
    python -m connector_tax.commands.for_tools smoke-config BASE OUT [--model M] ...
    python -m connector_tax.commands.for_tools step-timing STEP_LOG (--connector | --no-connector)
    python -m connector_tax.commands.for_tools missing-connector SERVER_LOG
    python -m connector_tax.commands.for_tools root-cause SERVER_LOG
    python -m connector_tax.commands.for_tools sidecars CONFIG NAME --log-dir DIR --ports-file FILE
    python -m connector_tax.commands.for_tools wait-released CONFIG NAME --gpu GPU

The scripts never parse YAML or interpolate config values into shell code: names come out one
per line (config names match ^[a-z0-9][a-z0-9_-]*$), everything else as JSON files that the
Python client in tools/ reads. Bad input: one line on stderr naming the key, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from connector_tax.arguments import number
from connector_tax.commands.namespace import run, runs
from connector_tax.config import ConfigError, StudyConfig, load_study
from connector_tax.config.smoke import SMOKE_MODEL, smoke_config
from connector_tax.launch.client_plan import CHECK_PLANS, plan
from connector_tax.launch.command import sidecar_names
from connector_tax.launch.steptiming import step_timing_status
from connector_tax.launch.vllm import PREFLIGHT_SCRIPTS, preflight_check

PROG = "for_tools"  # the first word of its one-line errors (the scripts grep for `for_tools sidecars: `)

# How much of a failed server's log root-cause reads (as ServerProcess does for ServerStartError):
# vLLM prints the engine's root cause a few dozen lines above its last line.
ROOT_CAUSE_LINES = 200


@dataclass(frozen=True)
class NamesArgs:
    config: str


@dataclass(frozen=True)
class GatedArgs:
    config: str
    check: str
    only: str | None


@dataclass(frozen=True)
class PlanArgs:
    config: str
    name: str
    port: int
    check: str | None


@dataclass(frozen=True)
class SmokeConfigArgs:
    base: str
    out: str
    model: str
    max_model_len: int
    gpu_memory_utilization: float
    mooncake_protocol: str
    enforce_eager: bool


@dataclass(frozen=True)
class ServerLogArgs:
    """missing-connector and root-cause."""

    server_log: str


@dataclass(frozen=True)
class SidecarsArgs:
    config: str
    name: str
    log_dir: Path
    ports_file: Path


@dataclass(frozen=True)
class WaitReleasedArgs:
    config: str
    name: str
    gpu: str


@dataclass(frozen=True)
class StepTimingArgs:
    step_log: str
    has_connector: bool


def names(args: NamesArgs) -> int:
    for name in load_study(args.config).names:
        print(name)
    return 0


def gated(args: GatedArgs) -> int:
    study = load_study(args.config)
    found = [v.name for v in study.variants if preflight_check(v) == args.check]
    if args.only:
        study.variant(args.only)  # ConfigError naming it
        found = [n for n in found if n == args.only]
    for name in found:
        print(name)
    return 0


def client_plan(args: PlanArgs) -> int:
    print(json.dumps(plan(load_study(args.config), args.name, args.port, args.check)))
    return 0


def write_smoke_config(args: SmokeConfigArgs) -> int:
    config = smoke_config(
        load_study(args.base).raw,
        model=args.model,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        mooncake_protocol=args.mooncake_protocol,
        enforce_eager=args.enforce_eager,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(_dump_yaml(config), encoding="utf-8")
    print(args.out)
    return 0


def _server_log(args: ServerLogArgs) -> Path:
    log = Path(args.server_log)
    if not log.is_file():
        raise ValueError(f"SERVER_LOG: {log}: no such file")
    return log


def missing_connector(args: ServerLogArgs) -> int:
    from connector_tax.serving.server_process import missing_connector

    reason = missing_connector(_server_log(args).read_text(encoding="utf-8", errors="replace"))
    if reason is None:
        return 1
    print(reason)
    return 0


def root_cause(args: ServerLogArgs) -> int:
    from connector_tax.serving.server_process import root_cause, tail

    # the same lines ServerStartError reads, so a SKIP reads alike on both paths
    reason = root_cause(tail(_server_log(args), ROOT_CAUSE_LINES)) or None
    if reason is None:
        return 1
    print(reason)
    return 0


def sidecars(args: SidecarsArgs) -> int:
    return run_sidecars(load_study(args.config), args.name, args.log_dir, args.ports_file)


def wait_released(args: WaitReleasedArgs) -> int:
    from connector_tax.serving.gpus import wait_released

    study = load_study(args.config)
    need = study.server_of(study.variant(args.name))["gpu_memory_utilization"]
    try:
        print(f"{wait_released(args.gpu, float(need)):.1f}")
    except RuntimeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


def step_timing(args: StepTimingArgs) -> int:
    ok, reason = step_timing_status(args.step_log, args.has_connector)
    print(json.dumps({"step_timing_available": ok, "reason": reason}))
    return 0 if ok else 1


def run_sidecars(study: StudyConfig, name: str, log_dir: Path, ports_file: Path) -> int:
    """Start a variant's sidecars (serving/sidecar.py) on ports of their own and keep them until
    SIGTERM, SIGINT or the end of one of them; once every one is ready, `ports_file` gets a line
    `name=port` each (the verify scripts pass them to `ctax launch-command --sidecar-port`).
    Exit 0 when stopped, 1 (its reason on stderr, one line) when one could not start or ended."""
    from connector_tax.launch.command import SIDECAR_PORTS, launch_spec
    from connector_tax.serving.lifecycle import stop_on_signals
    from connector_tax.serving.server_process import ServerStartError, free_port
    from connector_tax.serving.sidecar import Sidecars

    stop_on_signals()
    variant = study.variant(name)
    ports = {n: free_port(variant.host or study.host, block=SIDECAR_PORTS) for n in sidecar_names(study, variant)}
    spec = launch_spec("-", study, variant, 8000, sidecars=ports)  # only its sidecars are started
    try:
        with Sidecars(spec.sidecars, log_dir) as sidecars:
            ports_file.write_text("".join(f"{n}={p}\n" for n, p in ports.items()), encoding="utf-8")
            while (why := sidecars.failure()) is None:
                time.sleep(0.2)
    except ServerStartError as exc:
        why = str(exc)
    except KeyboardInterrupt:
        return 0
    print(f"{PROG} sidecars: {why}", file=sys.stderr)
    return 1


def _dump_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("names", help="every config name of a study, one per line")
    p.add_argument("config")
    runs(p, NamesArgs, names)

    p = sub.add_parser("gated", help="the config names a pre-flight check gates, one per line")
    p.add_argument("config")
    p.add_argument("check", choices=sorted(PREFLIGHT_SCRIPTS))
    p.add_argument("--only", metavar="NAME", help="just this config (empty if it is not gated)")
    runs(p, GatedArgs, gated)

    p = sub.add_parser("plan", help="JSON: what a verify/smoke client checks for one config")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--port", type=number(int, 0, 65535), required=True)
    p.add_argument("--check", choices=sorted(CHECK_PLANS))
    runs(p, PlanArgs, client_plan)

    p = sub.add_parser("smoke-config", help="write a GPU smoke-test copy of a study config")
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--model", default=SMOKE_MODEL)
    p.add_argument("--max-model-len", type=number(int, 1), default=4096)
    p.add_argument("--gpu-memory-utilization", type=number(float, 0, 1, low_open=True), default=0.6)
    p.add_argument("--mooncake-protocol", choices=["tcp", "rdma"], default="tcp")
    p.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false")
    runs(p, SmokeConfigArgs, write_smoke_config)

    p = sub.add_parser(
        "missing-connector",
        help="print vLLM's message if a server log says a connector package is missing (exit 0), else exit 1",
    )
    p.add_argument("server_log")
    runs(p, ServerLogArgs, missing_connector)

    p = sub.add_parser(
        "root-cause",
        help="print the most telling line of a failed server's log (vLLM's own root cause), else exit 1",
    )
    p.add_argument("server_log")
    runs(p, ServerLogArgs, root_cause)

    p = sub.add_parser("sidecars", help="run a config's sidecars until stopped; their ports to --ports-file")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--ports-file", type=Path, required=True)
    runs(p, SidecarsArgs, sidecars)

    p = sub.add_parser(
        "wait-released",
        help="wait until a GPU's memory is released for a config's launch (vLLM's start-up check); "
        "print the seconds waited, or exit 1 with one line",
    )
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--gpu", required=True)
    runs(p, WaitReleasedArgs, wait_released)

    p = sub.add_parser("step-timing", help="JSON: is step timing available for a step log")
    p.add_argument("step_log")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--connector", dest="has_connector", action="store_true")
    group.add_argument("--no-connector", dest="has_connector", action="store_false")
    runs(p, StepTimingArgs, step_timing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m connector_tax.commands.{PROG}")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except (ConfigError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
