"""The true reference rates: the study's own saturation criteria and reference rule applied to the
oracle's steady-state cells at every Phase A rate, instead of to short measured cells.

Every variant runs at every Phase A rate in virtual time (cells.run_cell: the study's arrival
process and Phase A shape, `requests` measured after `warmup` discarded ones, independent
replications on common random numbers, as truth.py). Each (variant, rate) becomes an aggregate
row as the analysis builds one — TTFT p90 pooled over the replications with a Student-t interval
from the replications' own p90s, the throughput ratio of requests finished within the arrival
span to those that arrived in it — and `analysis.reference_rates.reference_from_rows` picks ref_safe
and ref_load by the study's thresholds: no criterion or rule is restated here. Criterion 2 (the
queue's median) has no /metrics to read in the oracle and is left unjudged; on a stable queue it
cannot fire, and an unstable one fails criteria 1 and 3 long before a steady state.

A study whose short cells pick other rates than these has a bias to explain (the default study's
quiet runs picked ref_safe 32 while this says 16: a re-measured cell re-sent its prompts into the
server's prefix cache; loadgen.worker.prompts.prompt_key).
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from connector_tax.analysis import constants as K
from connector_tax.analysis.batchmeans import t975
from connector_tax.analysis.reference_rates import reference_from_rows
from connector_tax.config import PHASE_A, Cell, Saturation, StudyConfig
from connector_tax.config.cells import phase_a_cells
from connector_tax.oracle.truth import TruthSettings
from connector_tax.oracle.virtual_cells import run_cell, seed_for
from connector_tax.sim.settings import resolve


def _replicate(job: tuple[StudyConfig, str, Cell, int, TruthSettings]) -> tuple[str, float, float, float]:
    """(variant, rate, TTFT p90 ms, throughput ratio) of one replication."""
    study, name, load, rep, ts = job
    settings = resolve(study, study.variant(name), {})
    run = run_cell(
        settings,
        load,
        ts.warmup + ts.requests,
        seed_for(ts.seed, load, rep),
        ignore_eos=study.workload.request.ignore_eos,
    ).after(ts.warmup)
    out = float(load.pair[1]) if load.pair else 1.0
    finish_s = run.arrival_s + (run.ttft_ms + np.nan_to_num(run.tpot_ms) * max(out - 1, 0)) / 1000.0
    span = run.arrival_s[-1]
    arrived = int(np.sum(run.arrival_s <= span))
    done = int(np.sum(finish_s <= span))
    # The last requests of the span cannot have finished by its end even on an idle server:
    # count the ratio over the arrivals at least one unloaded request's time before the end.
    slack = float(np.nanmin(finish_s - run.arrival_s))
    arrived = int(np.sum(run.arrival_s <= span - slack)) or arrived
    return name, load.rps, float(np.nanpercentile(run.ttft_ms, 90)), min(1.0, done / max(arrived, 1))


def true_reference(study: StudyConfig, ts: TruthSettings, variants: list[str] | None = None) -> dict[str, Any]:
    """The reference-rate document (analysis.reference_rates's) of the oracle's cells, with
    `oracle: {requests, warmup, replications}` added."""
    names = variants or study.names
    loads = phase_a_cells(study)
    reps = max(2, ts.min_replications)
    jobs = [(study, name, load, r, ts) for name in names for load in loads for r in range(reps)]
    if ts.jobs > 1:
        with ProcessPoolExecutor(ts.jobs) as pool:
            results = list(pool.map(_replicate, jobs))
    else:
        results = [_replicate(j) for j in jobs]
    by: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for name, rate, p90, ratio in results:
        by.setdefault((name, rate), []).append((p90, ratio))
    rows = []
    for (name, rate), values in by.items():
        p90s = np.array([v[0] for v in values])
        half = t975(len(p90s) - 1) * float(p90s.std(ddof=1)) / math.sqrt(len(p90s))
        est = float(np.median(p90s))
        rows.append(
            {
                "variant": name,
                "phase": PHASE_A,
                "rate": rate,
                "replicate": 1,
                "valid": True,
                "throughput_ratio": float(np.mean([v[1] for v in values])),
                "n_post_warmup": reps * ts.requests,
                "waiting_p50": None,
                "ttft_ms_p90": est,
                "ttft_ms_p90_ci_lo": est - half,
                "ttft_ms_p90_ci_hi": est + half,
                "ttft_ms_n": reps * ts.requests,
            }
        )
    thresholds: Saturation = study.saturation
    doc = reference_from_rows(
        rows,
        names,
        {n: None for n in names},
        [c.rps for c in loads],
        thresholds,
        baseline=K.PLAIN if K.PLAIN in names else names[0],
        simulated=True,
    )
    doc["oracle"] = {"requests": ts.requests, "warmup": ts.warmup, "replications": reps, "seed": ts.seed}
    return doc
