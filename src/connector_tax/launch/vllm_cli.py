"""What the GPU-host shell scripts (tools/verify_*.sh, tools/gpu_smoke.sh) ask the package.

    python -m connector_tax.launch.vllm_cli names CONFIG
    python -m connector_tax.launch.vllm_cli gated CONFIG CHECK [--only NAME]
    python -m connector_tax.launch.vllm_cli plan CONFIG NAME --port P
    python -m connector_tax.launch.vllm_cli smoke-config BASE OUT [--model M] ...
    python -m connector_tax.launch.vllm_cli step-timing STEP_LOG (--connector | --no-connector)
    python -m connector_tax.launch.vllm_cli missing-connector SERVER_LOG
    python -m connector_tax.launch.vllm_cli root-cause SERVER_LOG
    python -m connector_tax.launch.vllm_cli sidecars CONFIG NAME --log-dir DIR --ports-file FILE

The scripts never parse YAML or interpolate config values into shell code: names come out one
per line (config names match ^[a-z0-9][a-z0-9_-]*$), everything else as JSON files that the
Python client in tools/ reads. Bad input: one line on stderr naming the key, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from connector_tax.arguments import number
from connector_tax.config import ConfigError, StudyConfig, load_study
from connector_tax.config.smoke import SMOKE_MODEL, smoke_config
from connector_tax.launch.command import sidecar_names
from connector_tax.launch.steptiming import step_timing_status
from connector_tax.launch.vllm import PREFLIGHT_SCRIPTS, preflight_check, side_ports

# The study's pre-flight checks: requests sent one after another, tokens each, and the time
# all of them must complete in (docs/study-design.md, Pre-flight).
CHECK_PLANS = {
    "kv_consumer": {"requests": 1, "max_tokens": 4, "budget_s": 30.0, "bootstrap": True},
    "multi_connector": {"requests": 5, "max_tokens": 32, "budget_s": 60.0, "bootstrap": False},
    "noop_connector": {"requests": 5, "max_tokens": 32, "budget_s": 30.0, "bootstrap": False},
    "smoke": {"requests": 3, "max_tokens": 16, "budget_s": 120.0, "bootstrap": False},
}

# How much of a failed server's log root-cause reads (as ServerProcess does for ServerStartError):
# vLLM prints the engine's root cause a few dozen lines above its last line.
ROOT_CAUSE_LINES = 200


def connect_host(host: str) -> str:
    """Where a client on this host reaches a server bound to `host`."""
    if host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def plan(study: StudyConfig, name: str, port: int, check: str | None = None) -> dict[str, Any]:
    variant = study.variant(name)
    check = check or preflight_check(variant) or "smoke"
    if check not in CHECK_PLANS:
        raise ValueError(f"CHECK: {check!r} is not one of {', '.join(CHECK_PLANS)}")
    side_ports(port)
    return {
        "name": name,
        "check": check,
        "backend": study.backend,
        "url": f"http://{connect_host(variant.host or study.host)}:{port}",
        "model": study.model.served,
        "has_connector": bool(variant.connector),
        "sidecars": sidecar_names(study, variant),
        "endpoint": study.workload.request.endpoint,
        **CHECK_PLANS[check],
    }


def run_sidecars(study: StudyConfig, name: str, log_dir: Path, ports_file: Path) -> int:
    """Start a variant's sidecars (serving/sidecar.py) on ports of their own and keep them until
    SIGTERM, SIGINT or the end of one of them; once every one is ready, `ports_file` gets a line
    `name=port` each (the verify scripts pass them to `ctax launch-command --sidecar-port`).
    Exit 0 when stopped, 1 (its reason on stderr, one line) when one could not start or ended."""
    from connector_tax.launch.command import SIDECAR_PORTS, launch_spec
    from connector_tax.serving.lifecycle import stop_on_signals
    from connector_tax.serving.process import ServerStartError, free_port
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
    print(f"vllm_cli sidecars: {why}", file=sys.stderr)
    return 1


def _dump_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.launch.vllm_cli")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("names", help="every config name of a study, one per line")
    p.add_argument("config")

    p = sub.add_parser("gated", help="the config names a pre-flight check gates, one per line")
    p.add_argument("config")
    p.add_argument("check", choices=sorted(PREFLIGHT_SCRIPTS))
    p.add_argument("--only", metavar="NAME", help="just this config (empty if it is not gated)")

    p = sub.add_parser("plan", help="JSON: what a verify/smoke client checks for one config")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--port", type=number(int, 0, 65535), required=True)
    p.add_argument("--check", choices=sorted(CHECK_PLANS))

    p = sub.add_parser("smoke-config", help="write a GPU smoke-test copy of a study config")
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--model", default=SMOKE_MODEL)
    p.add_argument("--max-model-len", type=number(int, 1), default=4096)
    p.add_argument("--gpu-memory-utilization", type=number(float, 0, 1, low_open=True), default=0.6)
    p.add_argument("--mooncake-protocol", choices=["tcp", "rdma"], default="tcp")
    p.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false")

    p = sub.add_parser(
        "missing-connector",
        help="print vLLM's message if a server log says a connector package is missing (exit 0), else exit 1",
    )
    p.add_argument("server_log")

    p = sub.add_parser(
        "root-cause",
        help="print the most telling line of a failed server's log (vLLM's own root cause), else exit 1",
    )
    p.add_argument("server_log")

    p = sub.add_parser("sidecars", help="run a config's sidecars until stopped; their ports to --ports-file")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--ports-file", type=Path, required=True)
    p = sub.add_parser(
        "wait-released",
        help="wait until a GPU's memory is released for a config's launch (vLLM's start-up check); "
        "print the seconds waited, or exit 1 with one line",
    )
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--gpu", required=True)

    p = sub.add_parser("step-timing", help="JSON: is step timing available for a step log")
    p.add_argument("step_log")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--connector", dest="has_connector", action="store_true")
    group.add_argument("--no-connector", dest="has_connector", action="store_false")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = "vllm_cli"
    try:
        if args.command == "names":
            for name in load_study(args.config).names:
                print(name)
        elif args.command == "gated":
            study = load_study(args.config)
            names = [v.name for v in study.variants if preflight_check(v) == args.check]
            if args.only:
                study.variant(args.only)  # ConfigError naming it
                names = [n for n in names if n == args.only]
            for name in names:
                print(name)
        elif args.command == "plan":
            print(json.dumps(plan(load_study(args.config), args.name, args.port, args.check)))
        elif args.command == "smoke-config":
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
        elif args.command in ("missing-connector", "root-cause"):
            from connector_tax.serving.process import missing_connector, root_cause, tail

            log = Path(args.server_log)
            if not log.is_file():
                raise ValueError(f"SERVER_LOG: {log}: no such file")
            if args.command == "missing-connector":
                reason = missing_connector(log.read_text(encoding="utf-8", errors="replace"))
            else:  # the same lines ServerStartError reads, so a SKIP reads alike on both paths
                reason = root_cause(tail(log, ROOT_CAUSE_LINES)) or None
            if reason is None:
                return 1
            print(reason)
        elif args.command == "sidecars":
            return run_sidecars(load_study(args.config), args.name, args.log_dir, args.ports_file)
        elif args.command == "wait-released":
            from connector_tax.serving.gpus import wait_released

            study = load_study(args.config)
            need = study.server_of(study.variant(args.name))["gpu_memory_utilization"]
            try:
                print(f"{wait_released(args.gpu, float(need)):.1f}")
            except RuntimeError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 1
        elif args.command == "step-timing":
            ok, reason = step_timing_status(args.step_log, args.has_connector)
            print(json.dumps({"step_timing_available": ok, "reason": reason}))
            return 0 if ok else 1
    except (ConfigError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
