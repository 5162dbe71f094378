"""One cell's statistics: the tidy row of aggregate.csv, from the cell's raw files.

Request statistics come from the raw request records (post-warm-up, status ok), never from the
load generator's summary; the summary supplies what the records cannot: the ITL percentiles
(inter-chunk gaps are not in the records), the rates measured over the cell's exact window,
and the validity verdict. Metrics samples and engine steps are restricted to the cell's
measurement window [first post-warm-up t_scheduled, last t_scheduled] (all records share
CLOCK_MONOTONIC), so warm-up and drain do not dilute them; if that leaves nothing (a clock
mismatch) every sample is used and `window_note` says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from connector_tax.analysis.batchmeans import percentile_ci
from connector_tax.analysis.columns import COLUMNS, COUNTS, LATENCIES, METRICS, STEP_STATS, STEPS
from connector_tax.analysis.constants import CALLBACK_FIELDS, METRIC_NAMES
from connector_tax.analysis.jsonl import NULL_INT, read_columns
from connector_tax.analysis.launch_intervals import Series, log_percentile_ci
from connector_tax.analysis.quantiles import cdf_grid, summarize
from connector_tax.analysis.streams import stream_stats
from connector_tax.analysis.usable_cells import Measurement
from connector_tax.config import PHASE_A
from connector_tax.contract.records import MetricsSample, RequestRecord, StepRecord, columns
from connector_tax.contract.summary import Percentiles, Rates

REQUEST_FIELDS = columns(
    RequestRecord,
    "t_scheduled_ns",
    "t_send_ns",
    "t_first_token_ns",
    "t_last_token_ns",
    "completion_tokens",
    "warmup",
    "status",
)
METRIC_FIELDS = columns(MetricsSample, "t_ns", *METRIC_NAMES.values())
STEP_FIELDS_READ = columns(
    StepRecord,
    "t_ns",
    "step_duration_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "engine_step_us",
    "worker_step_us",
)
# Worker-side hooks that a worker record carries and the study's callback time adds up.
WORKER_CALLBACKS = ("get_finished_us", "start_load_kv_us")


def time_series_stats(
    values: np.ndarray, order: np.ndarray, ci_p: float, ps: tuple[float, ...] = (50, 90, 99), log: bool = False
) -> dict[str, float | int | None]:
    """Percentiles of `values`, and the batch-means 95% interval of the ci_p-th, the values taken
    in the order of `order` (send or step times): consecutive requests and steps are correlated.
    log: on the log scale (latencies: never below zero; none below MIN_P90_SAMPLES requests)."""
    st = summarize(values, ps=ps, ci_for=(ci_p,))
    finite = ~np.isnan(np.asarray(values, dtype=np.float64))
    ordered = np.asarray(values)[finite][np.argsort(np.asarray(order)[finite], kind="stable")]
    _, lo, hi = log_percentile_ci(ordered, ci_p) if log else percentile_ci(ordered, ci_p)
    st[f"p{ci_p:g}_ci_lo"], st[f"p{ci_p:g}_ci_hi"] = lo, hi
    return st


def _null(a: np.ndarray) -> np.ndarray:
    null: np.ndarray = a == NULL_INT
    return null


def _window(t_sched: np.ndarray, post: np.ndarray) -> tuple[int | None, int | None]:
    if t_sched.size == 0:
        return None, None
    valid = ~_null(t_sched)
    lo_candidates = t_sched[valid & post]
    lo = int(lo_candidates.min()) if lo_candidates.size else None
    hi = int(t_sched[valid].max()) if valid.any() else None
    return lo, hi


def _indexes(request_ids: np.ndarray) -> np.ndarray:
    """Each request's index in its cell's schedule (request ids end in `-<index>`)."""
    return np.fromiter((int(str(r).rsplit("-", 1)[-1]) for r in request_ids), dtype=np.int64, count=len(request_ids))


def request_stats(
    cell: Measurement, series: dict[str, Series] | None = None
) -> tuple[dict[str, Any], tuple[int | None, int | None], dict[str, Any]]:
    """(row fields, measurement window, fallback rates); `series`, when given, receives each
    completed request's TTFT and TPOT with its schedule index (launch_intervals.Series)."""
    row: dict[str, Any] = {}
    if not cell.has("requests"):
        for k in COUNTS:
            row[k] = 0
        for m in LATENCIES:
            row.update({f"{m}_{k}": v for k, v in summarize(np.empty(0)).items()})
        return row, (None, None), {}
    r = read_columns(
        cell.path("requests"),
        {**REQUEST_FIELDS, **columns(RequestRecord, "request_id")} if series is not None else REQUEST_FIELDS,
    )
    status = r["status"]
    post = ~r["warmup"]
    ok = post & (status == "ok")
    row["n_records"] = int(status.size)
    row["n_warmup"] = int((~post).sum())
    row["n_post_warmup"] = int(post.sum())
    for s in ("ok", "error", "dropped", "timeout"):
        row[f"n_{s}"] = int((post & (status == s)).sum())
    send, first, last, sched = r["t_send_ns"], r["t_first_token_ns"], r["t_last_token_ns"], r["t_scheduled_ns"]
    has_first, has_last, has_send = ~_null(first), ~_null(last), ~_null(send)
    ct = r["completion_tokens"]
    m = ok & has_first & has_send
    ttft = ((first[m] - send[m]) / 1e6, sched[m])
    m = ok & has_first & ~_null(sched)
    ttft_sched = ((first[m] - sched[m]) / 1e6, sched[m])
    m = ok & has_first & has_last & ~_null(ct) & (ct > 1)
    tpot = ((last[m] - first[m]) / 1e6 / (ct[m] - 1), sched[m])
    m = ok & has_last & has_send
    e2e = ((last[m] - send[m]) / 1e6, sched[m])
    for name, (values, order) in (("ttft_ms", ttft), ("ttft_sched_ms", ttft_sched), ("tpot_ms", tpot), ("e2e_ms", e2e)):
        row.update({f"{name}_{k}": v for k, v in time_series_stats(values, order, ci_p=90, log=True).items()})
    if series is not None:
        index = _indexes(r["request_id"])
        m = ok & has_first & has_send
        series["ttft_ms"] = Series(index[m], ttft[0])
        m = ok & has_first & has_last & ~_null(ct) & (ct > 1)
        series["tpot_ms"] = Series(index[m], tpot[0])
    lo, hi = _window(sched, post)
    fallback: dict[str, Any] = {}
    if lo is not None and hi is not None and hi > lo:
        span = (hi - lo) / 1e9
        in_window = (~_null(sched)) & (sched >= lo) & (sched <= hi)
        done = (status == "ok") & has_last & (last >= lo) & (last <= hi)
        fallback = {"offered_rps": float(in_window.sum() / span), "effective_rps": float(done.sum() / span)}
        sent = has_send & ~_null(sched)
        if sent.sum() >= 2:
            fallback["achieved_dispatch_rps"] = float(
                (sent.sum() - 1) / max((send[sent].max() - send[sent].min()) / 1e9, 1e-9)
            )
    return row, (lo, hi), fallback


def metric_stats(cell: Measurement, window: tuple[int | None, int | None]) -> tuple[dict[str, Any], str | None]:
    row: dict[str, Any] = {k: None for k in METRICS}
    row["metrics_n"] = 0
    if not cell.has("metrics"):
        return row, None
    m = read_columns(cell.path("metrics"), METRIC_FIELDS)
    t = m["t_ns"]
    sel = np.ones(t.size, dtype=bool)
    note = None
    lo, hi = window
    if lo is not None and hi is not None:
        inside = (t >= lo) & (t <= hi)
        if inside.any():
            sel = inside
        elif t.size:
            note = "metrics: no sample inside the request window, all samples used"
    row["metrics_n"] = int(sel.sum())
    for col, name in (("waiting_p50", "waiting"), ("running_p50", "running"), ("kv_cache_usage_p50", "kv_usage")):
        v = m[METRIC_NAMES[name]][sel]
        v = v[~np.isnan(v)]
        row[col] = float(np.percentile(v, 50)) if v.size else None
    return row, note


def join_worker_records(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Engine records only, with the worker hooks of the worker records joined in by time.

    vLLM runs the worker connector in its own process on CPU (and with TP > 1), so its hooks are
    in worker records (worker_step_us set) and the engine records' get_finished_us /
    start_load_kv_us are null. Each worker step belongs to the engine step that started last
    before it (the engine step's t_ns is its entry; the worker step's, its metadata bind, which
    comes after that step's schedule()); an engine step's hook time is the sum over its worker
    steps, null when it has none. Without worker records the engine records' own fields stand
    (the simulator; vLLM's single-process executor, where the engine record carries them)."""
    worker = ~np.isnan(cols["worker_step_us"])
    engine = {k: v[~worker] for k, v in cols.items()}
    if not worker.any() or not (~worker).any():
        return engine
    order = np.argsort(engine["t_ns"], kind="stable")
    engine = {k: v[order] for k, v in engine.items()}
    owner = np.searchsorted(engine["t_ns"], cols["t_ns"][worker], side="right") - 1
    kept = owner >= 0  # a worker step before the first engine step of the slice has no owner here
    for name in WORKER_CALLBACKS:
        total = np.zeros(engine["t_ns"].size)
        seen = np.zeros(engine["t_ns"].size, dtype=bool)
        values = cols[name][worker][kept]
        np.add.at(total, owner[kept], np.where(np.isnan(values), 0.0, values))
        seen[owner[kept]] = True
        engine[name] = np.where(seen, total, np.nan)
    return engine


def step_stats(
    cell: Measurement, window: tuple[int | None, int | None]
) -> tuple[dict[str, Any], str | None, list[float] | None]:
    """(row fields, note, step_duration CDF grid)."""
    row: dict[str, Any] = {k: None for k in STEPS}
    row["steps_n"] = 0
    if not cell.has("engine_step"):
        return row, None, None
    s = join_worker_records(read_columns(cell.path("engine_step"), STEP_FIELDS_READ))
    t = s["t_ns"]
    sel = np.ones(t.size, dtype=bool)
    note = None
    lo, hi = window
    if lo is not None and hi is not None and t.size:
        inside = (t >= lo) & (t <= hi)
        if inside.any():
            sel = inside
        else:
            note = "steps: no step inside the request window, all steps used"
    cols = {k: s[k][sel] for k in STEP_FIELDS_READ if k != "t_ns"}
    engine = ~np.isnan(cols["step_duration_us"])  # an engine step that did not schedule has none
    parts = [cols[k][engine] for k in CALLBACK_FIELDS]
    present = np.zeros(int(engine.sum()), dtype=bool)
    total = np.zeros(int(engine.sum()))
    for p in parts:
        have = ~np.isnan(p)
        present |= have
        total += np.where(have, p, 0.0)
    total[~present] = np.nan  # no connector hook at all (plain): no callback time, not zero
    cols["connector_total_us"] = total
    # schedule() less the hook timed inside it, per step (0 where no hook ran: plain): paired
    # within each step, so its p50's interval is the step's own noise, not two p50s' in quadrature.
    meta = cols["build_meta_us"][engine]
    cols["step_other_us"] = cols["step_duration_us"][engine] - np.where(np.isnan(meta), 0.0, meta)
    row["steps_n"] = int(engine.sum())
    per_engine_step = ("connector_total_us", "step_other_us")
    for name in STEP_STATS:
        st = time_series_stats(cols[name], t[sel][engine] if name in per_engine_step else t[sel], ci_p=50, ps=(50, 90))
        row[f"{name}_p50"], row[f"{name}_p90"] = st["p50"], st["p90"]
        row[f"{name}_p50_ci_lo"], row[f"{name}_p50_ci_hi"] = st["p50_ci_lo"], st["p50_ci_hi"]
    return row, note, cdf_grid(cols["step_duration_us"])


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summary_fields(cell: Measurement, fallback: dict[str, Any]) -> dict[str, Any]:
    s = cell.summary
    rates = s.rates if s is not None else Rates()
    itl = s.latency_ms.itl if s is not None else Percentiles()
    requested = rates.requested_rps or cell.rate
    row: dict[str, Any] = {
        "valid": s.validity.valid if s is not None else None,
        "validity_reasons": "; ".join(s.validity.reasons) if s is not None else "",
        "complete": s.complete if s is not None else None,
        "requested_rps": requested,
        "offered_rps": rates.offered_in_window_rps,
        "achieved_dispatch_rps": rates.achieved_dispatch_rps,
        "effective_rps": rates.effective_throughput_rps,
        "throughput_ratio": rates.throughput_ratio,
        "rates_source": "summary",
        "itl_ms_n": itl.n if s is not None else None,
        "itl_ms_p50": itl.p50,
        "itl_ms_p90": itl.p90,
        "itl_ms_p99": itl.p99,
    }
    if row["effective_rps"] is None and fallback:
        row.update(
            offered_rps=fallback.get("offered_rps"),
            effective_rps=fallback.get("effective_rps"),
            achieved_dispatch_rps=row["achieved_dispatch_rps"] or fallback.get("achieved_dispatch_rps"),
            rates_source="records",
        )
        if row["offered_rps"]:
            row["throughput_ratio"] = row["effective_rps"] / row["offered_rps"]
    host = s.host if s is not None else None
    measured = host is not None and host.measured
    row.update(
        host_measured=host.measured if host is not None else None,
        host_busy=host.busy if host is not None and measured else None,
        host_others_cpu_frac=host.others_cpu_frac if host is not None else None,
        host_others_cores_max=host.others_cores_max if host is not None else None,
        host_steal_frac=host.steal_frac if host is not None else None,
        host_run_queue_mean=host.run_queue_mean if host is not None else None,
        attempts=(len(s.attempts) or 1) if s is not None else None,
    )
    if row["effective_rps"] is None:
        row["rates_source"] = None
    if row["throughput_ratio"] is None and row["effective_rps"] is not None and row["offered_rps"]:
        row["throughput_ratio"] = row["effective_rps"] / row["offered_rps"]
    if row["effective_rps"] is not None and requested:
        row["throughput_ratio_requested"] = row["effective_rps"] / requested
    else:
        row["throughput_ratio_requested"] = None
    return row


def cell_row(
    cell: Measurement,
    *,
    backend: str | None,
    simulated: bool,
    run_status: str,
    step_timing_available: bool,
    steps: bool = True,
    series: dict[str, Series] | None = None,
) -> tuple[dict[str, Any], list[float] | None]:
    """(the aggregate row without the saturation columns, the step-duration CDF grid).
    steps=False skips the step log (the reference stage does not need it); `series` receives the
    cell's per-request TTFT and TPOT (the taxes' paired intervals)."""
    row: dict[str, Any] = {k: None for k in COLUMNS}
    shape = cell.shape
    row.update(
        variant=cell.variant,
        phase=cell.phase,
        cell=cell.label,
        replicate=cell.replicate,
        rate=cell.rate,
        input_len=shape[0] if shape else None,
        output_len=shape[1] if shape else None,
        backend=backend,
        simulated=simulated,
        run_status=run_status,
        fingerprint=cell.summary.fingerprint if cell.summary is not None else None,
    )
    req, window, fallback = request_stats(cell, series)
    row.update(req)
    row.update(summary_fields(cell, fallback))
    met, note_m = metric_stats(cell, window)
    row.update(met)
    if steps:
        step_row, note_s, grid = step_stats(cell, window)
        row.update(step_row)
    else:
        note_s, grid = None, None
        row["steps_n"] = 0
    row["step_timing_available"] = bool(step_timing_available and row["steps_n"])
    row.update(stream_stats(cell, row))  # client-side TPOT/ITL trust (analysis/streams.py)
    row["window_note"] = "; ".join(n for n in (note_m, note_s) if n) or None
    if cell.phase != PHASE_A:
        row["crit_ttft_growth"] = None
    return row, grid
