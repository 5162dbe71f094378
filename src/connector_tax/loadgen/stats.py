"""A cell's summary: counts, rates, latency percentiles, and the validity gate.

Validity is about the instrument, not the server: did the load generator send what it was
asked, when it was asked, with CPU to spare? A cell that fails a check is marked invalid
with the reasons, so the analysis can exclude or flag it. Thresholds come from the config's
`validity:` section.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from connector_tax.loadgen.records import RequestRecord

QUANTILES = {"p50": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True)
class ValidityThresholds:
    max_rate_error: float = 0.05  # |achieved - scheduled| / scheduled dispatch rate
    max_lateness_p99_us: float = 1000.0  # t_send - t_scheduled
    max_lateness_max_us: float = 100_000.0
    max_error_frac: float = 0.01  # errors + timeouts among post-warm-up requests sent
    max_dropped_frac: float = 1.0  # drops are the design's overload signal: counted, not fatal
    max_cpu_frac: float = 0.95  # of one core, for any load-generator process

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> ValidityThresholds:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in known})


def percentiles(values: np.ndarray | list[float]) -> dict[str, float | int | None]:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"n": 0, "mean": None, **{k: None for k in QUANTILES}}
    qs = np.percentile(arr, list(QUANTILES.values()))
    return {"n": int(arr.size), "mean": round(float(arr.mean()), 4), **{k: round(float(v), 4) for k, v in zip(QUANTILES, qs)}}


def _rate(times: list[int]) -> float | None:
    if len(times) < 2:
        return None
    span = (max(times) - min(times)) / 1e9
    return (len(times) - 1) / span if span > 0 else None


def summarize(
    cell: dict[str, Any],
    records: list[RequestRecord],
    itl_us: list[np.ndarray],
    t_warmup_end_ns: int,
    t_issue_end_ns: int,
    cpu_frac: dict[str, float],
    thresholds: ValidityThresholds,
) -> dict[str, Any]:
    post = [r for r in records if not r.warmup]
    ok = [r for r in post if r.status == "ok"]
    sent = [r for r in records if r.t_send_ns is not None]
    count = {s: sum(r.status == s for r in post) for s in ("ok", "error", "timeout", "dropped")}

    ttft = [(r.t_first_token_ns - r.t_send_ns) / 1e6 for r in ok if r.t_first_token_ns]
    ttft_sched = [(r.t_first_token_ns - r.t_scheduled_ns) / 1e6 for r in ok if r.t_first_token_ns]
    tpot = [
        (r.t_last_token_ns - r.t_first_token_ns) / 1e6 / (r.completion_tokens - 1)
        for r in ok
        if r.t_first_token_ns and r.t_last_token_ns and (r.completion_tokens or 0) > 1
    ]
    e2e = [(r.t_last_token_ns - r.t_send_ns) / 1e6 for r in ok if r.t_last_token_ns]
    itl = np.concatenate(itl_us) / 1e3 if itl_us else np.empty(0)
    lateness = [(r.t_send_ns - r.t_scheduled_ns) / 1e3 for r in sent]

    scheduled_rate = _rate([r.t_scheduled_ns for r in sent])
    achieved_rate = _rate([r.t_send_ns for r in sent])  # type: ignore[misc]
    window_s = max((t_issue_end_ns - t_warmup_end_ns) / 1e9, 1e-9)
    in_window = [r for r in records if r.t_scheduled_ns >= t_warmup_end_ns and r.t_scheduled_ns <= t_issue_end_ns]
    # Completions are counted over the window shifted by the median E2E latency: a request
    # that arrived near the window's end completes after it, and in a short window those
    # would otherwise read as lost throughput; in saturation the rate still falls short.
    shift = int(np.median(e2e) * 1e6) if e2e else 0
    completed_in_window = sum(
        1 for r in records
        if r.status == "ok" and r.t_last_token_ns and t_warmup_end_ns + shift <= r.t_last_token_ns <= t_issue_end_ns + shift
    )
    effective = completed_in_window / window_s
    offered = len(in_window) / window_s

    lat = percentiles(lateness)
    rate_error = abs(achieved_rate - scheduled_rate) / scheduled_rate if scheduled_rate and achieved_rate else 0.0
    sent_post = count["ok"] + count["error"] + count["timeout"]
    error_frac = (count["error"] + count["timeout"]) / sent_post if sent_post else 0.0
    dropped_frac = count["dropped"] / len(post) if post else 0.0
    checks = [
        _check("dispatch_rate_error", rate_error, thresholds.max_rate_error),
        _check("lateness_p99_us", lat["p99"] or 0.0, thresholds.max_lateness_p99_us),
        _check("lateness_max_us", max(lateness, default=0.0), thresholds.max_lateness_max_us),
        _check("error_frac", error_frac, thresholds.max_error_frac),
        _check("dropped_frac", dropped_frac, thresholds.max_dropped_frac),
        *(_check(f"cpu_frac_{name}", frac, thresholds.max_cpu_frac) for name, frac in cpu_frac.items()),
    ]
    min_completed = cell.get("min_completed")
    if min_completed:
        checks.append(_check("min_completed_shortfall", max(0, min_completed - count["ok"]), 0))
    failed = [c for c in checks if not c["passed"]]
    return {
        **cell,
        "counts": {
            "scheduled": len(records),
            "warmup": len(records) - len(post),
            "post_warmup": len(post),
            **count,
        },
        "rates": {
            "requested_rps": cell.get("rate"),
            "scheduled_rps": _round(scheduled_rate),
            "achieved_dispatch_rps": _round(achieved_rate),
            "offered_in_window_rps": _round(offered),
            "effective_throughput_rps": _round(effective),
            "throughput_ratio": _round(effective / offered) if offered else None,
            "completion_window_shift_ms": _round(shift / 1e6),
        },
        "latency_ms": {
            "ttft": percentiles(ttft),
            "ttft_from_scheduled": percentiles(ttft_sched),
            "tpot": percentiles(tpot),
            "e2e": percentiles(e2e),
            "itl": percentiles(itl),
        },
        "lateness_us": {**lat, "max": _round(max(lateness, default=0.0))},
        "cpu_frac": {k: _round(v) for k, v in cpu_frac.items()},
        "validity": {
            "valid": not failed,
            "reasons": [f"{c['name']} {c['value']} > {c['threshold']}" for c in failed],
            "checks": checks,
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _check(name: str, value: float, threshold: float) -> dict[str, Any]:
    return {"name": name, "value": _round(value), "threshold": threshold, "passed": bool(value <= threshold)}
