"""A cell's summary: counts, rates, latency percentiles, and the validity gate.

Validity is about the instrument, not the server: did the load generator send what it was
asked, when it was asked, with CPU to spare, and did every result come back to its request?
Lateness is judged by what it does to the measurement, not by an absolute bound: relative to the
cell's mean inter-arrival gap (is the arrival process the one asked for?) and to its TTFT p90
(the first token's stamp waits for the same worker as the send: how far can TTFT p90 be off?).
A cell that fails a check is marked invalid with the reasons; the pipeline adds the host's
contention (metrics/host.py) and measures an invalid cell again (measure/gate.py). Bounds come
from the config's `validity:` section (config.Validity; the schema states why each is what it is).

The summary streams: `RequestStats.add` takes each record as it completes and keeps only bounded
state (sketch.Quantiles per latency, counters, and 10 ms bins of the scheduled and completion
times for the window counts), so a cell's memory does not grow with its length; the records
themselves go to the JSONL file as they complete.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from connector_tax.config import Validity
from connector_tax.contract.summary import CellSummary, Check, Counts, Latencies, Percentiles, Rates, Verdict
from connector_tax.loadgen.stats.request_file import RequestRecord
from connector_tax.loadgen.stats.sketch import DEFAULT_EXACT_CAP, Quantiles
from connector_tax.loadgen.stats.usage import ShapeRule, UsageTally

QUANTILES = {"p50": 50, "p90": 90, "p99": 99}
# Window counts resolve completion and schedule times to 10 ms: at 1,000 req/s an edge is off by
# at most ~10 of a 30 s window's 30,000 requests, and the bins cost 400 bytes per second of cell
# (1 ms bins would be 8 KB per second of cell, 4.8 MB for 10 minutes).
BIN_NS = 10_000_000
ITL_PENDING = 16_384  # gaps (uint32 µs) held before they reach the ITL Quantiles


def _describe(q: Quantiles) -> Percentiles:
    if not q.count:
        return Percentiles()
    p50, p90, p99 = (round(v, 4) for v in q.percentiles(list(QUANTILES.values())))
    return Percentiles(q.count, round(q.total / q.count, 4), p50, p90, p99, None if q.exact else 0.005)


def percentiles(values: np.ndarray | list[float]) -> Percentiles:
    q = Quantiles(max(1, len(values)))
    q.extend(np.asarray(values, dtype=np.float64))
    return _describe(q)


class _Span:
    """Count, first and last of a time series: a rate without the series."""

    __slots__ = ("n", "lo", "hi")

    def __init__(self) -> None:
        self.n, self.lo, self.hi = 0, 0, 0

    def add(self, t: int) -> None:
        if not self.n:
            self.lo = self.hi = t
        elif t < self.lo:
            self.lo = t
        elif t > self.hi:
            self.hi = t
        self.n += 1

    def rate(self) -> float | None:
        span = (self.hi - self.lo) / 1e9
        return (self.n - 1) / span if self.n >= 2 and span > 0 else None


class _Bins:
    """Counts per BIN_NS from a base time: 4 bytes per 10 ms of the cell."""

    def __init__(self, base_ns: int) -> None:
        self.base = base_ns
        self.counts = array("I")

    def add(self, t: int) -> None:
        b = max(0, (t - self.base) // BIN_NS)
        if b >= len(self.counts):
            self.counts.frombytes(bytes(4 * (b + 1 - len(self.counts) + 1024)))
        self.counts[b] += 1

    def between(self, lo_ns: int, hi_ns: int) -> int:
        """Times in [lo_ns, hi_ns], at BIN_NS resolution."""
        lo = max(0, -(-(lo_ns - self.base) // BIN_NS))
        hi = (hi_ns - self.base) // BIN_NS
        if hi < lo or lo >= len(self.counts):
            return 0
        return int(np.frombuffer(self.counts, dtype=np.uint32)[lo : hi + 1].sum())


class RequestStats:
    """Everything the summary needs, fed one record at a time, in bounded memory."""

    def __init__(self, base_ns: int, exact_cap: int = DEFAULT_EXACT_CAP, rule: ShapeRule | None = None) -> None:
        self.counts = {s: 0 for s in ("ok", "error", "timeout", "dropped")}
        self.records = 0
        self.warmup = 0
        self.token_mismatch = 0  # ok requests whose usage disagreed with the chunks counted
        self.unmatched = 0
        self.ttft, self.ttft_sched, self.tpot, self.e2e, self._itl, self.lateness = (
            Quantiles(exact_cap) for _ in range(6)
        )
        # A result's gaps, as the worker sent them (µs), held until there are many: converted and
        # extended one result at a time, they were part of the ~100 µs a result's statistics
        # took on the receiver thread (sketch.py holds single values the same way, as doubles).
        self._itl_us = array("I")
        self.sched, self.sent = _Span(), _Span()
        self.sched_post = _Bins(base_ns)  # post-warm-up scheduled times
        self.done_ok = _Bins(base_ns)  # completion times of ok requests
        self.usage = UsageTally(rule or ShapeRule(), exact_cap)  # the server's counts against the cell's

    def add(self, r: RequestRecord, itl_us: bytes | None = None) -> None:
        self.records += 1
        if r.t_send_ns is not None:
            self.sched.add(r.t_scheduled_ns)
            self.sent.add(r.t_send_ns)
            self.lateness.add((r.t_send_ns - r.t_scheduled_ns) / 1e3)
        if r.status == "ok" and r.t_last_token_ns:
            self.done_ok.add(r.t_last_token_ns)
        if r.warmup:
            self.warmup += 1
            return
        self.sched_post.add(r.t_scheduled_ns)
        self.counts[r.status] = self.counts.get(r.status, 0) + 1
        if r.status != "ok":
            return
        if r.token_mismatch:
            self.token_mismatch += 1
        self.usage.add(r)
        first, last, send = r.t_first_token_ns, r.t_last_token_ns, r.t_send_ns
        if first and send:
            self.ttft.add((first - send) / 1e6)
        if first:
            self.ttft_sched.add((first - r.t_scheduled_ns) / 1e6)
        tokens = r.completion_tokens or 0
        if first and last and tokens > 1:
            self.tpot.add((last - first) / 1e6 / (tokens - 1))
        if last and send:
            self.e2e.add((last - send) / 1e6)
        if itl_us:
            self._itl_us.frombytes(itl_us)
            if len(self._itl_us) >= ITL_PENDING:
                self._take_itl()

    @property
    def itl(self) -> Quantiles:
        self._take_itl()
        return self._itl

    def _take_itl(self) -> None:
        if self._itl_us:
            gaps_ms = np.frombuffer(self._itl_us, dtype=np.uint32) / 1e3
            self._itl_us = array("I")
            self._itl.extend(gaps_ms)

    def nbytes(self) -> int:
        qs = (self.ttft, self.ttft_sched, self.tpot, self.e2e, self.itl, self.lateness, *self.usage.quantiles())
        held = 4 * (len(self.sched_post.counts) + len(self.done_ok.counts) + ITL_PENDING)
        return sum(q.nbytes() for q in qs) + held

    def summary(
        self,
        cell: dict[str, Any],
        t_warmup_end_ns: int,
        t_issue_end_ns: int,
        cpu_frac: dict[str, float],
        thresholds: Validity,
        unissued: int = 0,
        overrun_ms: float = 0.0,
    ) -> CellSummary:
        """`cell`: the cell's own fields (config.cells.Cell.describe)."""
        count = dict(self.counts)
        post = self.records - self.warmup
        scheduled_rate, achieved_rate = self.sched.rate(), self.sent.rate()
        window_s = max((t_issue_end_ns - t_warmup_end_ns) / 1e9, 1e-9)
        # Completions are counted over the window shifted by the median E2E latency: a request
        # that arrived near the window's end completes after it, and in a short window those
        # would otherwise read as lost throughput; in saturation the rate still falls short.
        shift = int(self.e2e.percentiles([50])[0] * 1e6) if self.e2e.count else 0
        effective = self.done_ok.between(t_warmup_end_ns + shift, t_issue_end_ns + shift) / window_s
        offered = self.sched_post.between(t_warmup_end_ns, t_issue_end_ns) / window_s
        lat = _describe(self.lateness)
        lat_max = self.lateness.max if self.lateness.count else 0.0
        lat.max = _round(lat_max)
        rate_error = abs(achieved_rate - scheduled_rate) / scheduled_rate if scheduled_rate and achieved_rate else 0.0
        sent_post = count["ok"] + count["error"] + count["timeout"]
        error_frac = (count["error"] + count["timeout"]) / sent_post if sent_post else 0.0
        dropped_frac = count["dropped"] / post if post else 0.0
        t = thresholds
        checks = [
            _check("dispatch_rate_error", rate_error, t.max_rate_error),
            *lateness_checks(
                lat, lat_max, scheduled_rate, self.ttft.percentiles([90])[0] if self.ttft.count else None, t
            ),
            _check("error_frac", error_frac, t.max_error_frac),
            _check("dropped_frac", dropped_frac, t.max_dropped_frac),
            _check("unissued", unissued, t.max_unissued),
            _check("issue_overrun_ms", overrun_ms, t.max_overrun_ms),
            _check("unmatched_results", self.unmatched, t.max_unmatched),
            *(_check(f"cpu_frac_{name}", frac, t.max_cpu_frac) for name, frac in cpu_frac.items()),
        ]
        usage, usage_checks = self.usage.summary()
        checks += usage_checks
        min_completed = cell.get("min_completed")
        if min_completed:
            checks.append(_check("min_completed_shortfall", max(0, min_completed - count["ok"]), 0))
        # A cell that measured nothing says nothing, whatever else passed: every request in the
        # warm-up, or none answered (a dead URL, a wrong path or model: all errors).
        checks.append(
            _check(
                "measured_requests_missing",
                0 if count["ok"] else 1,
                0,
                "no request measured: none ended ok after the warm-up",
            )
        )
        failed = [c for c in checks if not c.passed]
        return CellSummary(
            **cell,
            counts=Counts(
                scheduled=self.records,
                warmup=self.warmup,
                post_warmup=post,
                ok=count["ok"],
                error=count["error"],
                timeout=count["timeout"],
                dropped=count["dropped"],
                unissued=unissued,
                unmatched=self.unmatched,
                token_count_mismatch=self.token_mismatch,
            ),
            rates=Rates(
                requested_rps=cell.get("rate"),
                scheduled_rps=_round(scheduled_rate),
                achieved_dispatch_rps=_round(achieved_rate),
                offered_in_window_rps=_round(offered),
                effective_throughput_rps=_round(effective),
                throughput_ratio=_round(effective / offered) if offered else None,
                completion_window_shift_ms=_round(shift / 1e6),
            ),
            latency_ms=Latencies(
                ttft=_describe(self.ttft),
                ttft_from_scheduled=_describe(self.ttft_sched),
                tpot=_describe(self.tpot),
                e2e=_describe(self.e2e),
                itl=_describe(self.itl),
            ),
            usage=usage,
            lateness_us=lat,
            cpu_frac={k: _round(v) for k, v in cpu_frac.items()},
            validity=Verdict(
                valid=not failed,
                reasons=[c.reason for c in failed],
                checks=checks,
            ),
        )


def summarize(
    cell: dict[str, Any],
    records: list[RequestRecord],
    itl_us: list[np.ndarray],
    t_warmup_end_ns: int,
    t_issue_end_ns: int,
    cpu_frac: dict[str, float],
    thresholds: Validity,
) -> CellSummary:
    """The summary of records held in a list (tests, re-summaries); the cell streams instead."""
    stats = RequestStats(min((r.t_scheduled_ns for r in records), default=0))
    for r in records:
        stats.add(r)
    for gaps in itl_us:
        stats.itl.extend(np.asarray(gaps, dtype=np.float64) / 1e3)
    return stats.summary(cell, t_warmup_end_ns, t_issue_end_ns, cpu_frac, thresholds)


def lateness_checks(
    lateness: Percentiles, lateness_max: float, rate: float | None, ttft_p90_ms: float | None, t: Validity
) -> list[Check]:
    """Send lateness judged by its effect: p99 against the mean gap between arrivals (the arrival
    process), p90 against TTFT p90 (the bias of what is measured); the worst single send; an
    absolute p99 bound only when the config sets one. A ratio with no denominator (closed loop,
    no TTFT) is not judged: the cell's other checks speak for it."""
    p90, p99 = lateness.p90 or 0.0, lateness.p99 or 0.0
    checks = []
    if rate:
        checks.append(_check("lateness_gap_frac", p99 / (1e6 / rate), t.max_lateness_gap_frac))
    if ttft_p90_ms:
        checks.append(_check("lateness_ttft_frac", p90 / (ttft_p90_ms * 1e3), t.max_lateness_ttft_frac))
    checks.append(_check("lateness_max_us", lateness_max, t.max_lateness_max_us))
    if t.max_lateness_p99_us is not None:
        checks.append(_check("lateness_p99_us", p99, t.max_lateness_p99_us))
    return checks


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _check(name: str, value: float, threshold: float, why: str | None = None) -> Check:
    """A check passes when value <= threshold; `why` words its failure (default: name value > bound)."""
    return Check(name, _round(value), threshold, bool(value <= threshold), why)
