"""`ctax sim`: start the simulated vLLM server for one server variant of a study config
(sim/server.py serves it; its fault switches are validated here, before start-up)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.arguments import number
from connector_tax.commands.namespace import runs


@dataclass(frozen=True)
class Args:
    """`ctax sim`."""

    variant: str
    config: str | None
    host: str | None
    port: int
    ready_file: str | None
    step_log: str | None
    request_log: str | None
    seed: int
    faults: dict[str, object]  # the fault switches given, by sim.faults name (over the config's)


FAULT_FLAGS: dict[str, tuple[Callable[[str], object], str]] = {
    "fail_start": (str, "exit at start-up with this reason instead of serving"),
    "slow_start_s": (number(float, 0), "wait this long before accepting requests"),
    "crash_after_s": (number(float, 0, low_open=True), "die this many seconds after becoming ready"),
    "crash_after_requests": (number(int, 1), "die once this many requests were accepted"),
    "hang_after_tokens": (number(int, 1), "streams stall after this many tokens"),
    "hang_rate": (number(float, 0, 1), "fraction of requests that hang (with --hang-after-tokens)"),
    "http_500_rate": (number(float, 0, 1), "fraction of generation requests answered with HTTP 500"),
    "malformed_sse_rate": (number(float, 0, 1), "fraction of SSE chunks sent malformed"),
    "health_503_after_s": (number(float, 0), "engine 'dies' after this long: /health 503, requests 500"),
    "reset_rate": (number(float, 0, 1), "fraction of streams whose connection is dropped mid-stream"),
    "metrics_delay_s": (number(float, 0), "answer /metrics this much later"),
    "after_requests": (number(int, 0), "spare this many first requests from the per-request faults"),
}


class _Fault(argparse.Action):
    """A fault switch: its value goes into the `faults` mapping under its sim.faults name."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        name = self.option_strings[0].removeprefix("--").replace("-", "_")
        namespace.faults = {**namespace.faults, name: values}  # a new mapping: the default is shared


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variant",
        required=True,
        metavar="NAME",
        help="the variant of the study to serve (a connector plus its overrides), e.g. mooncake_both",
    )
    parser.add_argument("--config", metavar="FILE", help="study config (default: configs/default.yaml)")
    parser.add_argument("--host", help="address to bind (default: the config's server.host, 127.0.0.1)")
    parser.add_argument(
        "--port", type=number(int, 0, 65535), default=8000, help="port to bind; 0 picks a free one (default 8000)"
    )
    parser.add_argument("--ready-file", metavar="PATH", help="also write the 'ready http://HOST:PORT' line here")
    parser.add_argument(
        "--step-log", metavar="PATH", help="per-step JSONL log (default: $CONNECTOR_TAX_STEP_LOG, else none)"
    )
    parser.add_argument(
        "--request-log", metavar="PATH", help="per-request JSONL of the server's own first/last token times"
    )
    parser.add_argument("--seed", type=number(int), default=0, help="seed of the fault draws")
    faults = parser.add_argument_group("faults (override the config's sim.faults)")
    for name, (kind, help_text) in FAULT_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        faults.add_argument(flag, dest="faults", action=_Fault, type=kind, metavar="VALUE", help=help_text)
    parser.set_defaults(faults={})  # after the switches, so that it is each one's default too
    runs(parser, Args, main)


def main(args: Args) -> int:
    from connector_tax.config import default_config_path
    from connector_tax.sim.server import run

    return run(
        Path(args.config) if args.config else default_config_path(),
        args.variant,
        args.faults,
        host=args.host,
        port=args.port,
        ready_file=args.ready_file,
        step_log=args.step_log,
        request_log=args.request_log,
        seed=args.seed,
    )
