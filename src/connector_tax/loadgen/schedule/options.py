"""The load generator's options (LoadgenOptions) and what it can send of a cell (check_cell),
each checked before anything starts (ValueError naming the field). The cell itself is the study
config's (connector_tax.config.Cell)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from connector_tax.config import StudyConfig, Validity, default_request, default_validity
from connector_tax.config.cells import Cell
from connector_tax.config.checks import tokenizer_problem
from connector_tax.loadgen.host.affinity import allowed_cpus, check_target_cpus
from connector_tax.loadgen.schedule.shapes import ShapeSampler
from connector_tax.loadgen.stats.sketch import DEFAULT_EXACT_CAP
from connector_tax.loadgen.worker.prompts import POOL_TOKENS
from connector_tax.loadgen.worker.urls import parse_url


def check_cell(cell: Cell) -> None:
    """ValueError naming the field, before any request is sent: what the load generator can send."""
    if cell.trace is not None:
        longest = max((r.input_length for r in cell.trace), default=0)
        if longest >= POOL_TOKENS:
            raise ValueError(f"trace: input_length {longest} is over the load generator's limit of {POOL_TOKENS - 1}")
    else:
        longest = max(p.input for p in ShapeSampler(cell.shape, 0).pairs)
        if longest >= POOL_TOKENS:
            raise ValueError(f"shape: input {longest} is over the load generator's limit of {POOL_TOKENS - 1}")


# What a request asks and how long it may take, by default: the study config schema's defaults,
# written there once (a study's cells and `ctax bench` send the same requests).
_REQUEST = default_request()


@dataclass(frozen=True)
class LoadgenOptions:
    url: str  # the server driven (target 0)
    model: str
    # Servers driven beside `url` (targets 1, 2, ...): each gets every request of a cell at the
    # same scheduled time, the same prompt and shape (a duet: a baseline and a variant served side
    # by side), through workers of its own, into a cell of its own (LoadGenerator.run_duet_cell).
    other_urls: tuple[str, ...] = ()
    # One CPU set per target (url first): target t's workers run in its set, the main process
    # floats over every CPU (host.affinity.plan_paired); None: the default plan (`affinity`).
    target_cpus: tuple[tuple[int, ...], ...] | None = None
    endpoint: str = _REQUEST.endpoint
    prompt: str = _REQUEST.prompt
    # How text and chat prompts are sized: auto | server | usage | a tokenizer file (sizing.py).
    tokenizer: str = _REQUEST.tokenizer
    temperature: float = _REQUEST.temperature
    ignore_eos: bool = _REQUEST.ignore_eos
    workers: int = 1  # per target: each worker serves one target
    inflight_cap: int = _REQUEST.inflight_cap  # per target: a slow server's drops are its own
    timeout_s: float = _REQUEST.timeout_s
    drain_timeout_s: float = 30.0
    # ...plus this much per output token of the longest request issued, up to timeout_s: a request
    # sent at the end of a cell needs its whole stream, and 1,024 tokens at a loaded TPOT take
    # longer than 30 s (0.1 s/token is past any TPOT a valid cell has). It only bounds the wait:
    # the drain ends as soon as nothing is in flight.
    drain_s_per_token: float = 0.1
    # Requests leave for their worker this early; the worker fires them at their time. Must
    # exceed the hand-over's worst case: IPC p99 is ~0.5 ms here, but the session thread and
    # the ZMQ I/O threads share a core with the server, and 2 ms left ~1 % of requests late at
    # 100 req/s. It costs a request held a little longer in the worker's timer heap.
    send_ahead_us: float = 10_000.0
    # The worker wakes up to spin_us before a request's time and spins the rest, which absorbs
    # the wake-up latency (up to ~1 ms at the tail on a virtual CPU); spin_share caps that spin
    # at this share of the mean time between the worker's requests (floor 200 µs), so it costs
    # at most ~10 % of a core at 100 req/s instead of all of it at 1,000 req/s. Within that cap
    # the spin is only as long as the worker's recent timer wake-ups were late (firetimer.py).
    spin_us: float = 1000.0
    spin_share: float = 0.1
    seed: int = 0
    affinity: bool = True
    # PM QoS limit on CPU wake-up latency held while the generator runs (cpu_latency.py): 0 keeps
    # idle CPUs polling, so neither a send nor the worker's timer waits for a halted CPU; None
    # leaves the machine's setting alone.
    cpu_latency_us: int | None = 0
    # SCHED_FIFO priority of the timing threads (priority.py), or None: the normal class. On a
    # host the server can fill, the fair class left sends 100+ ms late; root (or RLIMIT_RTPRIO).
    rt_priority: int | None = None
    chunk_log: bool = False
    events_log: bool = False
    validity: Validity = field(default_factory=default_validity)
    # Sent as "Authorization: Bearer <value of this environment variable>" when set.
    api_key_env: str | None = None
    tls_verify: bool = True  # https: check the server's certificate (curl's --insecure turns it off)
    tls_ca_file: str | None = None
    # Latency values a cell's summary keeps exactly; past this, percentiles are within 0.5 %
    # (sketch.py). The JSONL records are always complete.
    summary_exact_cap: int = DEFAULT_EXACT_CAP

    @property
    def urls(self) -> tuple[str, ...]:
        """Every target's URL, target 0 first."""
        return (self.url, *self.other_urls)

    @classmethod
    def of_study(
        cls,
        study: StudyConfig,
        url: str,
        other_urls: tuple[str, ...] = (),
        target_cpus: tuple[tuple[int, ...], ...] | None = None,
    ) -> LoadgenOptions:
        """The options a study's cells run with, against the server at `url` (and those at
        `other_urls` beside it, each in its CPU set of `target_cpus` where given)."""
        request, loadgen = study.workload.request, study.loadgen
        return cls(
            url=url,
            other_urls=other_urls,
            target_cpus=target_cpus,
            model=study.model.served,
            endpoint=request.endpoint,
            prompt=request.prompt,
            tokenizer=request.tokenizer,
            temperature=request.temperature,
            ignore_eos=request.ignore_eos,
            inflight_cap=request.inflight_cap,
            timeout_s=request.timeout_s,
            seed=study.seed,
            workers=loadgen.workers,
            affinity=loadgen.affinity,
            cpu_latency_us=loadgen.cpu_latency_us,
            rt_priority=loadgen.rt_priority,
            validity=study.validity,
            api_key_env=study.api_key_env,
        )

    def check(self) -> None:
        """ValueError naming the option, before any worker starts."""
        seen: dict[str, int] = {}
        for t, url in enumerate(self.urls):
            name = "url" if t == 0 else "other_urls"
            try:
                where = parse_url(url, self.endpoint).describe()
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            if where in seen:
                raise ValueError(f"{name}: {url!r} is target {seen[where]} already (each server once)")
            seen[where] = t
        if self.target_cpus is not None:
            if not self.affinity:
                raise ValueError("target_cpus: set with affinity off (nothing would be pinned)")
            check_target_cpus(self.target_cpus, len(self.urls), allowed_cpus())
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: must be an integer in 0..2^63-1, got {self.seed!r}")
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"api_key_env: environment variable {self.api_key_env!r} is not set")
        if self.rt_priority is not None and not 1 <= self.rt_priority <= 99:
            raise ValueError(f"rt_priority: must be 1..99 (SCHED_FIFO), got {self.rt_priority!r}")
        problem = tokenizer_problem(self.tokenizer)
        if problem:
            raise ValueError(f"tokenizer: {problem}")
        if self.tls_ca_file is not None and not os.path.isfile(self.tls_ca_file):
            raise ValueError(f"tls_ca_file: {self.tls_ca_file!r} is not a file")
