"""`ctax bench`: drive an OpenAI-compatible server with the load generator from the shell; with
`--url` given more than once, several servers side by side (a duet), each sent the same requests
at the same times, each target's cells in `--out`/target<k>/."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.arguments import unwritable
from connector_tax.commands._bench_output import line, report_progress
from connector_tax.commands.namespace import runs
from connector_tax.config.cells import Cell
from connector_tax.loadgen import flags
from connector_tax.loadgen.schedule.options import check_cell
from connector_tax.loadgen.schedule.probe import Api, ServerProblem, check_server
from connector_tax.loadgen.schedule.schedulers import ARRIVAL_KINDS
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions
from connector_tax.loadgen.schedule.shapes import ShapePair, parse_shapes, shape_spec
from connector_tax.loadgen.worker.prompts import POOL_TOKENS

# LoadgenOptions / Cell fields, as the flags that set them (their errors name the flag; a
# cell's shape is set by --shapes when given, else by --input-len and --output-len: _shape_flag).
_FLAGS = {
    "url": "--url",
    "other_urls": "--url",
    "target_cpus": "--target-cpus",
    "seed": "--seed",
    "api_key_env": "--api-key-env",
    "tls_ca_file": "--cacert",
    "trace": "--trace",
    "tokenizer": "--tokenizer",
}


@dataclass(frozen=True)
class Args:
    """`ctax bench`."""

    url: list[str]  # given more than once: servers side by side (a duet)
    model: str
    api_key_env: str | None
    insecure: bool
    cacert: str | None
    rate: float | None
    rates: list[float] | None
    concurrency: int | None
    arrival: str
    gamma_shape: float
    rampup: float
    input_len: int
    output_len: int
    shapes: list[ShapePair] | None
    duration: float
    warmup: float
    min_completed: int
    max_duration: float | None
    num_requests: int | None
    inflight_cap: int
    timeout: float
    workers: int
    target_cpus: list[tuple[int, ...]] | None
    trace: Path | None
    time_scale: float
    endpoint: str
    prompt: str
    tokenizer: str
    seed: int
    no_affinity: bool
    cpu_latency_us: int | None
    rt_priority: int | None
    chunk_log: bool
    events_log: bool
    phase: str
    out: Path


def _shape_flag(args: Args) -> str:
    return "--shapes" if args.shapes else "--input-len"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        required=True,
        action="append",
        type=flags.url,
        help="server URL as curl reads it: http://127.0.0.1:8000, localhost:8000, https://h/v1, [::1]:8000; "
        "again for servers side by side (a duet: each sent the same requests at the same times)",
    )
    p.add_argument("--model", required=True, type=flags.nonempty, help="model name sent in each request")
    p.add_argument(
        "--api-key-env",
        type=flags.env_name,
        metavar="NAME",
        help="send 'Authorization: Bearer $NAME' with every request",
    )
    p.add_argument("--insecure", action="store_true", help="https: do not verify the server's certificate")
    p.add_argument("--cacert", type=flags.file, help="https: verify the server against this CA bundle (PEM)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=flags.positive(float), help="requests per second (one cell)")
    rate.add_argument("--rates", type=flags.rates, help="comma-separated rates: one cell each")
    rate.add_argument("--concurrency", type=flags.positive(int), help="closed loop: requests kept in flight")
    p.add_argument("--arrival", choices=[k for k in ARRIVAL_KINDS], default="poisson")
    p.add_argument("--gamma-shape", type=flags.positive(float), default=1.0)
    p.add_argument("--rampup", type=flags.seconds, default=0.0, help="closed loop ramp-up seconds")
    p.add_argument("--input-len", type=flags.positive(int), default=1024)
    p.add_argument("--output-len", type=flags.positive(int), default=128)
    p.add_argument("--shapes", type=flags.shapes, help="INxOUT,... : one cell each (e.g. 512x64,4096x256)")
    p.add_argument("--duration", type=flags.positive(float), default=60.0, help="seconds after warm-up (floor)")
    p.add_argument("--warmup", type=flags.seconds, default=10.0)
    p.add_argument(
        "--min-completed",
        type=flags.non_negative(int, "a whole number"),
        default=0,
        help="extend a cell until this many completed",
    )
    p.add_argument("--max-duration", type=flags.positive(float), help="hard end of a cell's extension")
    p.add_argument("--num-requests", type=flags.positive(int), help="with --arrival max, or a cap on --trace")
    p.add_argument("--inflight-cap", type=flags.positive(int), default=LoadgenOptions.inflight_cap)
    p.add_argument(
        "--timeout", type=flags.positive(float), default=LoadgenOptions.timeout_s, help="per-request timeout (s)"
    )
    p.add_argument("--workers", type=flags.positive(int), default=1, help="per --url: each worker drives one server")
    p.add_argument(
        "--target-cpus",
        action="append",
        type=flags.cpus,
        metavar="LIST",
        help="once per --url, in order (e.g. 0 and 1): each server's workers pinned to its CPUs, "
        "the main process floating over all",
    )
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace to replay")
    p.add_argument("--time-scale", type=flags.positive(float), default=1.0, help="trace speed-up factor")
    p.add_argument("--endpoint", choices=["completions", "chat"], default=LoadgenOptions.endpoint)
    p.add_argument("--prompt", choices=["token_ids", "text"], default=LoadgenOptions.prompt)
    p.add_argument(
        "--tokenizer",
        type=flags.nonempty,
        default=LoadgenOptions.tokenizer,
        metavar="auto|server|usage|PATH",
        help="how text and chat prompts get the cell's length by the server's count: auto (/tokenize where the "
        "server has it, else usage of one-token requests), server, usage, or a tokenizer.json (or its folder)",
    )
    p.add_argument("--seed", type=flags.seed, default=0)
    p.add_argument("--no-affinity", action="store_true", help="do not pin CPUs")
    p.add_argument(
        "--cpu-latency-us",
        type=flags.cpu_latency,
        default=0,
        metavar="US|off",
        help="hold the kernel's CPU wake-up latency limit (/dev/cpu_dma_latency) at US while running; "
        "0 (default) keeps idle CPUs polling; off leaves it alone",
    )
    p.add_argument(
        "--rt-priority",
        type=flags.rt_priority,
        default=None,
        metavar="1-99",
        help="run the timing threads SCHED_FIFO at this priority (root or RLIMIT_RTPRIO): punctual "
        "sends on a host the server fills; default: the normal class",
    )
    p.add_argument("--chunk-log", action="store_true", help="per-chunk arrival times to a side file")
    p.add_argument("--events-log", action="store_true", help="dump the session's events as JSONL")
    p.add_argument("--phase", type=flags.name, default="bench", help="phase name in output file names")
    p.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory")
    flags.reject_unknown(p)
    runs(p, Args, main)


def cells_from_args(args: Args) -> list[Cell]:
    common: dict[str, Any] = dict(
        phase=args.phase,
        warmup_s=args.warmup,
        duration_s=args.duration,
        min_completed=args.min_completed,
        max_duration_s=args.max_duration,
    )
    if args.trace:
        from connector_tax.loadgen.schedule.trace import load_trace

        try:
            trace = tuple(load_trace(args.trace))
        except (ValueError, OSError) as exc:
            raise ValueError(f"--trace: {exc}") from None
        cells = [
            Cell(
                label="trace",
                arrival="trace",
                trace=trace,
                time_scale=args.time_scale,
                num_requests=args.num_requests,
                **common,
            )
        ]
        _check(cells, args)
        return cells
    shapes = args.shapes or [parse_shapes(f"{args.input_len}x{args.output_len}")[0]]
    longest = max(s.input for s in shapes)
    if longest >= POOL_TOKENS:
        raise ValueError(
            f"{_shape_flag(args)}: {longest} tokens is over the load generator's limit of {POOL_TOKENS - 1}"
        )
    if args.concurrency:
        return [
            Cell(
                label=f"c{args.concurrency}-{s}",
                arrival="concurrency",
                concurrency=args.concurrency,
                rampup_s=args.rampup,
                shape=shape_spec(s),
                **common,
            )
            for s in shapes
        ]
    if args.arrival == "max":
        if not args.num_requests:
            raise ValueError("--arrival max needs --num-requests")
        return [
            Cell(
                label=f"max{args.num_requests}-{s}",
                arrival="max",
                num_requests=args.num_requests,
                shape=shape_spec(s),
                **common,
            )
            for s in shapes
        ]
    rates = args.rates or [args.rate or 1.0]
    if len(rates) > 1 and len(shapes) > 1:
        raise ValueError("--rates and --shapes: sweep one or the other")
    return [
        Cell(
            label=f"r{r:g}-{s}",
            arrival=args.arrival,
            rate=r,
            gamma_shape=args.gamma_shape,
            shape=shape_spec(s),
            **common,
        )
        for r in rates
        for s in shapes
    ]


def _check(cells: list[Cell], args: Args) -> None:
    for cell in cells:
        try:
            check_cell(cell)
        except ValueError as exc:
            raise ValueError(_flagged(exc, args)) from None


def _flagged(exc: Exception, args: Args) -> str:
    """An error naming an option or cell field, as the flag that sets it."""
    field, sep, rest = str(exc).partition(": ")
    flags = {**_FLAGS, "shape": _shape_flag(args)}
    return f"{flags[field]}: {rest}" if sep and field in flags else str(exc)


def main(args: Args) -> int:
    try:
        cells = cells_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"ctax bench: {exc}", file=sys.stderr)
        return 2
    urls = args.url
    options = LoadgenOptions(
        url=urls[0],
        other_urls=tuple(urls[1:]),
        target_cpus=tuple(args.target_cpus) if args.target_cpus else None,
        model=args.model,
        endpoint=args.endpoint,
        prompt=args.prompt,
        tokenizer=args.tokenizer,
        workers=args.workers,
        inflight_cap=args.inflight_cap,
        timeout_s=args.timeout,
        seed=args.seed,
        affinity=not args.no_affinity,
        cpu_latency_us=args.cpu_latency_us,
        rt_priority=args.rt_priority,
        chunk_log=args.chunk_log,
        events_log=args.events_log,
        api_key_env=args.api_key_env,
        tls_verify=not args.insecure,
        tls_ca_file=args.cacert,
    )
    try:
        options.check()
    except ValueError as exc:
        print(f"ctax bench: {_flagged(exc, args)}", file=sys.stderr)
        return 2
    # One target: its cells in --out, as always; several: each target's in a folder of its own.
    outs = [args.out] if len(urls) == 1 else [args.out / f"target{t}" for t in range(len(urls))]
    for out in outs:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"ctax bench: --out: cannot create {str(out)!r}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if why := unwritable(out, "--out", folder=True):  # a folder that is there but not writable
            print(f"ctax bench: {why}", file=sys.stderr)
            return 2
    try:
        for url in urls:  # every server answers, with the model, before any cell
            with Api(dataclasses.replace(options, url=url)) as api:
                check_server(api)
        gen = LoadGenerator(options)  # sizes text prompts on the first server
    except (ServerProblem, ValueError) as exc:
        print(f"ctax bench: {_flagged(exc, args)}", file=sys.stderr)
        return 2
    try:
        for cell in cells:
            gen.check_cell(cell)
    except ValueError as exc:
        gen.pool.close()
        print(f"ctax bench: {_flagged(exc, args)}", file=sys.stderr)
        return 2
    if len(urls) > 1:
        for t, (url, out) in enumerate(zip(urls, outs)):
            print(f"ctax bench: target{t} {url} -> {out}", file=sys.stderr, flush=True)
    invalid = 0
    with gen:
        for cell in cells:
            done = threading.Event()
            reporter = threading.Thread(target=report_progress, args=(gen, cell.label, done), daemon=True)
            reporter.start()
            try:
                summaries = gen.run_duet_cell(cell, outs)
            finally:
                done.set()
                reporter.join()
            for t, summary in enumerate(summaries):
                print(line(summary, f"@target{t}" if len(urls) > 1 else ""), flush=True)
                invalid += not summary.valid
    return 1 if invalid else 0
