"""A cell's summary (summary_<phase>_<label>.json) as one typed record, from the load generator's
statistics to the seal, and its decoder.

The load generator makes it (loadgen.stats.summarize: counts, rates, latencies, the instrument's validity
checks; the run adds how it ran), the runner adds the host's report (metrics.host), the measuring
loop the gate's verdict, why the cell ended and its attempts (measure.loop), and the seal its
fingerprint and the files it vouches for (contract.index). Every field has a default, so a summary
written before a field existed still decodes (`decode_summary`), and a field a writer adds that
this type does not know is ignored on reading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from connector_tax.atomic import write_atomic

SUMMARY_SCHEMA = "connector-tax/cell-summary/2"


class Check(msgspec.Struct, omit_defaults=True):
    """One bound of the validity gate: `value` against `threshold`; `why` words its failure where
    `name value > threshold` would not say it (written only where set)."""

    name: str
    value: float | None
    threshold: float | None
    passed: bool
    why: str | None = None

    @property
    def reason(self) -> str:
        """The failed check in words: its own, or `name value > threshold`."""
        return self.why or f"{self.name} {self.value} > {self.threshold}"


# The reason a cell stands invalid, not measured again, when the study's own server starved the load
# generator (measure.gate.self_starved); the report's advice (analysis.contention) reads it back.
SELF_STARVED = (
    "the load generator was late on a host otherwise quiet: the server under test took the CPU it "
    "needed (not measured again: another attempt would find the same)"
)


class Verdict(msgspec.Struct):
    """The validity gate's verdict (the summary's `validity`). The load generator fills `valid`,
    `reasons` and `checks` for the instrument; the gate (measure.gate.judge) adds the host's
    checks and keeps the two apart: `instrument_valid`, `host_busy` (None: no host was measured),
    and `perturbation`, how far past its bound the worst timing or host check went."""

    valid: bool = True
    reasons: list[str] = msgspec.field(default_factory=list)
    checks: list[Check] = msgspec.field(default_factory=list)
    instrument_valid: bool | None = None
    host_busy: bool | None = None
    perturbation: float | None = None

    def invalidate(self, reason: str) -> None:
        self.valid = False
        self.reasons.append(reason)


class Counts(msgspec.Struct):
    scheduled: int = 0
    warmup: int = 0
    post_warmup: int = 0
    ok: int = 0
    error: int = 0
    timeout: int = 0
    dropped: int = 0
    unissued: int = 0
    unmatched: int = 0
    token_count_mismatch: int = 0


class Rates(msgspec.Struct):
    """Requests per second: asked for, scheduled, sent, offered and completed in the window."""

    requested_rps: float | None = None
    scheduled_rps: float | None = None
    achieved_dispatch_rps: float | None = None
    offered_in_window_rps: float | None = None
    effective_throughput_rps: float | None = None
    throughput_ratio: float | None = None
    completion_window_shift_ms: float | None = None


class Percentiles(msgspec.Struct):
    """A latency's count, mean and percentiles; `approx_rel_err` when they come from the sketch
    past its exact cap (loadgen.stats.sketch); `max` where the summary keeps it (lateness)."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    approx_rel_err: float | None = None
    max: float | None = None


class Latencies(msgspec.Struct):
    """Per-request latencies in ms (TTFT from the send and from the scheduled time, TPOT, E2E,
    and the inter-chunk gaps)."""

    ttft: Percentiles = msgspec.field(default_factory=Percentiles)
    ttft_from_scheduled: Percentiles = msgspec.field(default_factory=Percentiles)
    tpot: Percentiles = msgspec.field(default_factory=Percentiles)
    e2e: Percentiles = msgspec.field(default_factory=Percentiles)
    itl: Percentiles = msgspec.field(default_factory=Percentiles)


class Spread(msgspec.Struct):
    """A token count's median and range over the measured requests (None: none counted)."""

    median: float | None = None
    min: float | None = None
    max: float | None = None


class TokenCounts(msgspec.Struct):
    """One token count (prompt or completion): what the requests asked for, what the server
    counted (`reported` of them had a count), and how many were off by more than the rule allows."""

    requested: Spread = msgspec.field(default_factory=Spread)
    server: Spread = msgspec.field(default_factory=Spread)
    reported: int = 0
    off: int = 0


class ShapeRuleNote(msgspec.Struct):
    """How close the server's counts had to be, in words (loadgen.stats.usage.ShapeRule.describe)."""

    prompt: str = ""
    completion: str = ""


class Usage(msgspec.Struct):
    """Is the cell the shape it claims (loadgen.stats.usage): the server's own token counts of the
    measured requests against what they asked for; `status` checked | unchecked (with why) | no
    requests; `sizing`, how text prompts were sized on the server (loadgen.schedule.sizing.Sizing.describe)."""

    requests: int = 0
    rule: ShapeRuleNote = msgspec.field(default_factory=ShapeRuleNote)
    prompt_tokens: TokenCounts = msgspec.field(default_factory=TokenCounts)
    completion_tokens: TokenCounts = msgspec.field(default_factory=TokenCounts)
    status: str = "no requests"
    unchecked: str | None = None
    sizing: dict[str, Any] | None = None


class TopProcess(msgspec.Struct):
    pid: int
    name: str
    cores: float | None


class HostReport(msgspec.Struct):
    """The host around a cell (metrics.host): the CPU others took, steal, the run queue, judged
    against the validity bounds (`busy`, `reasons`, `checks`); `measured` False with `why` where
    no host was measured (virtual time)."""

    measured: bool = False
    why: str | None = None
    busy: bool | None = None
    reasons: list[str] = msgspec.field(default_factory=list)
    checks: list[Check] = msgspec.field(default_factory=list)
    source: str | None = None
    wall_s: float | None = None
    cpus: int | None = None
    samples: int | None = None
    others_cpu_s: float | None = None
    others_cores: float | None = None
    others_cores_max: float | None = None
    others_cpu_frac: float | None = None
    top_others: list[TopProcess] = msgspec.field(default_factory=list)
    steal_frac: float | None = None
    run_queue_mean: float | None = None
    run_queue_max: int | None = None
    cpu_pressure_some_frac: float | None = None
    study_cores: dict[str, float | None] = msgspec.field(default_factory=dict)
    host_busy_cores: float | None = None
    unattributed_cores: float | None = None


class Priority(msgspec.Struct):
    """SCHED_FIFO of the timing threads (loadgen.host.priority): asked, applied, and why not."""

    requested: int | None = None
    applied: bool = False
    why: str | None = None


class RtPriority(Priority):
    """The sending thread's, each worker's, and the phase job's own (`process`)."""

    workers: list[Priority | None] = msgspec.field(default_factory=list)
    process: Priority | None = None


class CpuLatency(msgspec.Struct):
    """The PM QoS CPU wake-up limit held while the cell ran (loadgen.host.cpu_latency)."""

    requested_us: int | None = None
    held: bool = False
    detail: str = ""


class FileCount(msgspec.Struct):
    bytes: int
    records: int


class AttemptNote(msgspec.Struct):
    """One measurement of the cell, as the summary of the attempt that stands lists it."""

    attempt: int
    valid: bool
    perturbation: float | None = None
    reasons: list[str] = msgspec.field(default_factory=list)
    host_busy: bool | None = None
    others_cpu_frac: float | None = None
    measured_again_because: str | None = None


class CellSummary(msgspec.Struct):
    # The cell as the load generator was asked to run it (config.cells.Cell.describe).
    phase: str = ""
    cell: str = ""
    arrival: str | None = None
    rate: float | None = None
    gamma_shape: float | None = None
    shape: dict[str, Any] | str | None = None  # "trace" for a trace cell
    concurrency: int | None = None
    rampup_s: float | None = None
    warmup_s: float | None = None
    duration_s: float | None = None
    min_completed: int | None = None
    max_duration_s: float | None = None
    traffic_seed: int | None = None
    replicate: int = 1
    attempt: int = 1  # which measurement of the cell in its launch (a later one sends fresh prompts)
    # What the load generator measured (loadgen.stats.summarize).
    counts: Counts = msgspec.field(default_factory=Counts)
    rates: Rates = msgspec.field(default_factory=Rates)
    latency_ms: Latencies = msgspec.field(default_factory=Latencies)
    usage: Usage | None = None  # None in a summary from before it was counted
    lateness_us: Percentiles = msgspec.field(default_factory=Percentiles)
    cpu_frac: dict[str, float | None] = msgspec.field(default_factory=dict)
    validity: Verdict = msgspec.field(default_factory=Verdict)
    # How the run went (loadgen.schedule.realtime, oracle.virtual_run).
    cell_id: str | None = None
    clock: str | None = None  # "virtual" for a cell computed in virtual time
    wall_s: float | None = None
    compute_s: float | None = None  # virtual time: what computing it took here
    drain_budget_s: float | None = None
    cpu_latency: CpuLatency | None = None
    rt_priority: RtPriority | None = None
    extended: bool | None = None
    summary_state_bytes: int | None = None
    complete: bool | None = None  # False: stopped before its end
    # The host around it (the runner's) and why it ended (the measuring loop's).
    host: HostReport | None = None
    stop_reason: str | None = None
    overloaded: bool | None = None
    precision_target: float | None = None
    precision_of: str | None = None
    paired_with: str | None = None
    precision: dict[str, float | None] | None = None
    attempts: list[AttemptNote] = msgspec.field(default_factory=list)
    # The seal (contract.index.seal_cell).
    schema: str | None = None
    fingerprint: str | None = None
    files: dict[str, FileCount] | None = None
    status: str | None = None
    reason: str | None = None
    sealed: str | None = None

    @property
    def valid(self) -> bool:
        return self.validity.valid

    @property
    def usable(self) -> bool:
        """Sealed complete: its records may be read (a baseline to pair with, a knee's evidence)."""
        return bool(self.complete)


_DECODER = msgspec.json.Decoder(CellSummary)


def decode_summary(data: bytes | str) -> CellSummary:
    """A summary from its JSON (ValueError if it is not one)."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a cell summary: {exc}") from None


def read_summary_file(path: Path) -> CellSummary | None:
    """The summary at `path`, or None if it is absent or not one."""
    try:
        return decode_summary(path.read_bytes())
    except (OSError, ValueError):
        return None


def write_summary(path: Path, summary: CellSummary) -> None:
    """The summary's file, replaced atomically (indented: a person reads it too)."""
    write_atomic(path, json.dumps(to_builtins(summary), indent=2) + "\n")


def to_builtins(summary: CellSummary) -> dict[str, Any]:
    """The summary as plain JSON values (what its file holds)."""
    out: dict[str, Any] = msgspec.to_builtins(summary)
    return out
