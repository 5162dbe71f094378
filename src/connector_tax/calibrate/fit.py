"""`ctax calibrate RESULTS_DIR -o PROFILE.yaml`: the simulator's engine profile, fitted from a real
study's records (study_tables.py), every term with its fit quality (regress.py).

What is fitted, in the simulator's own model (sim/costs.py):

* **the engine step of the baseline variant** (no connector): `engine_step_us = step_base_us +
  prefill_token_us x prefill tokens + decode_seq_us x decoding sequences + context_token_us x
  context tokens`, over every scheduled step of every cell of the baseline;
* **the scheduler's share** (`step_duration_us`, Scheduler.schedule(), minus build_meta, which
  runs inside it): `schedule_base_us + schedule_request_us x running`, on the baseline;
* **the engine loop's gap** between steps (median, baseline): `step_gap_us`;
* **what the API server adds** (study_tables.py): ingress and egress distributions, the baseline's
  for the profile and each variant's own where it has enough of them;
* **per variant with a connector**: each hook (`build_meta` in the scheduler, `get_finished` and
  `start_load_kv` in the worker) as `fixed_us + per_request_us x running + per_block_us x KV
  blocks`; then the step time the hooks do not explain, `engine_step_us - hooks`, against the
  baseline's fitted forward: `forward x forward_scale + extra_us` (a connector whose threads
  compete with the model for the CPU shows as a scale); the scheduler's share as a scale of the
  baseline's (`schedule_scale`).

A term the data cannot identify is 0 (a scale: 1) and is listed as not identified, with why.
Standard errors are cluster-robust by cell (consecutive steps are correlated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from connector_tax.calibrate.profile_provenance import provenance
from connector_tax.calibrate.regress import Fit, Term, fit_terms
from connector_tax.calibrate.study_tables import CalibrationError, StudyData, read_study
from connector_tax.config.profile import (
    HOOK_NAMES,
    QUANTILES,
    ApiProfile,
    EngineProfile,
    VariantProfile,
    model_names,
)

FORWARD_TERMS = {
    "prefill_tokens": "prefill_token_us",
    "decode_tokens": "decode_seq_us",
    "context_tokens": "context_token_us",
}
HOOK_TERMS = {"num_running": "per_request_us", "blocks": "per_block_us"}
MIN_API_SAMPLES = 20  # a variant's own API distribution needs this many samples, else the baseline's
DEFAULT_KV_BLOCKS = 65536  # when /metrics does not say (cache_config_info), ample for the study's prompts
OTHER_WORKER_HOOKS = ("wait_for_layer_load_us", "save_kv_layer_us", "wait_for_save_us")


def _quantiles(values: np.ndarray) -> tuple[float, ...]:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return ()
    return tuple(round(float(v), 1) for v in np.quantile(values, QUANTILES))


def _api_summary(values: np.ndarray) -> dict[str, Any]:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"n": 0}
    p = np.percentile(values, [50, 90])
    return {"n": int(values.size), "p50_us": round(float(p[0]), 1), "p90_us": round(float(p[1]), 1)}


def baseline_of(data: StudyData) -> str:
    variants = data.variants
    plain = [v for v in variants if not _connector(data, v)]
    if "plain" in plain:
        return "plain"
    if plain:
        return plain[0]
    raise CalibrationError(
        f"{data.study.root}: no variant without a connector among {', '.join(variants)}: the engine's own step "
        "cannot be told from a connector's costs"
    )


def _connector(data: StudyData, variant: str) -> dict[str, Any] | None:
    connector = data.study.settings.variant(variant).connector
    return None if connector is None else dict(connector)


def scheduled(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps that ran the model: schedule() was called and gave it at least one token. (vLLM
    also takes steps that schedule nothing, e.g. while finished requests are released; the
    simulator has no such step, and they are reported, not fitted.)"""
    tokens = steps["prefill_tokens"].fillna(0) + steps["decode_tokens"].fillna(0)
    return steps[steps["step_duration_us"].notna() & (tokens > 0)]


def empty_steps(steps: pd.DataFrame) -> dict[str, Any]:
    tokens = steps["prefill_tokens"].fillna(0) + steps["decode_tokens"].fillna(0)
    empty = steps[tokens <= 0]["engine_step_us"]
    return {
        "n": int(empty.size),
        "share": round(float(empty.size / max(len(steps), 1)), 3),
        "median_us": round(float(empty.median()), 1) if empty.size else None,
        "note": "steps that scheduled no token (not modelled by the simulator)",
    }


def fit_forward(steps: pd.DataFrame) -> Fit:
    """engine_step_us of scheduled steps ~ step_base_us + the FORWARD_TERMS (no hooks: the baseline)."""
    s = scheduled(steps)
    return fit_terms(
        "engine_step_us",
        s["engine_step_us"].to_numpy(),
        {FORWARD_TERMS[c]: s[c].to_numpy() for c in FORWARD_TERMS},
        intercept="step_base_us",
        cluster=s["cell"].to_numpy(),
    )


def predict_forward(fit: Fit, steps: pd.DataFrame) -> np.ndarray:
    out = np.full(len(steps), fit.value("step_base_us"))
    for column, name in FORWARD_TERMS.items():
        out = out + fit.value(name) * steps[column].fillna(0).to_numpy()
    return out


def step_scatter(steps: pd.DataFrame, forward: Fit) -> dict[str, Any]:
    """How the baseline's measured steps scatter around the fit: the ratio measured / fitted
    (scaled to mean 1) at a few percentiles, and `phi`, the lag-1 correlation of consecutive
    steps' ratios (normal scores) within a cell. Reported, not simulated: the simulator's step is
    the fitted mean. Drawing steps from this scatter (a Gaussian AR(1) through these quantiles)
    was tried and made the check's error on the fitted study itself larger (docs/calibration.md)."""
    s = scheduled(steps)
    pred = predict_forward(forward, s)
    ok = pred > 0
    ratio = s["engine_step_us"].to_numpy()[ok] / pred[ok]
    cells = s["cell"].to_numpy()[ok]
    if ratio.size < 50 or float(np.std(ratio)) < 1e-3:
        return {"n": int(ratio.size), "note": "the steps do not scatter around the fit (or too few)"}
    ratio = ratio / ratio.mean()
    z = stats.norm.ppf(stats.rankdata(ratio) / (ratio.size + 1))
    same = cells[1:] == cells[:-1]
    a, b = z[1:][same], z[:-1][same]
    phi = float(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b))) if a.size > 2 else None
    return {
        "n": int(ratio.size),
        "ratio_p10_p50_p90_p99": [round(float(v), 3) for v in np.percentile(ratio, [10, 50, 90, 99])],
        "phi": None if phi is None else round(phi, 3),
        "note": "measured / fitted engine step of the baseline, mean 1 (not simulated: the simulator's step is the fitted mean)",
    }


def fit_schedule(steps: pd.DataFrame) -> Fit:
    s = scheduled(steps)
    own = s["step_duration_us"] - s["build_meta_us"].fillna(0)
    return fit_terms(
        "step_duration_us - build_meta_us",
        own.to_numpy(),
        {"schedule_request_us": s["num_running"].fillna(0).to_numpy()},
        intercept="schedule_base_us",
        cluster=s["cell"].to_numpy(),
    )


def fit_hook(steps: pd.DataFrame, hook: str) -> Fit:
    column = f"{hook}_us"
    s = steps[steps[column].notna()]
    return fit_terms(
        column,
        s[column].to_numpy(),
        {HOOK_TERMS[c]: s[c].fillna(0).to_numpy() for c in HOOK_TERMS},
        intercept="fixed_us",
        cluster=s["cell"].to_numpy(),
    )


def _scale_fit(target: str, y: np.ndarray, base: np.ndarray, cells: np.ndarray, extra: bool) -> Fit:
    """y = base x scale (+ extra): identified as a difference from the baseline (scale - 1, extra)."""
    columns = {"scale_minus_1": base}
    fit = fit_terms(target, y - base, columns, intercept="extra_us" if extra else None, cluster=cells, signs_free=True)
    term = fit.terms["scale_minus_1"]
    scale = Term(
        "scale",
        1.0 + term.value if term.identified else 1.0,
        term.se,
        (1.0 + term.ci[0], 1.0 + term.ci[1]) if term.ci else None,
        term.identified,
        term.why and f"no difference from the baseline's: {term.why}",
    )
    fit.terms = {"scale": scale, **({"extra_us": fit.terms["extra_us"]} if extra else {})}
    return fit


def _sig(x: float) -> float:
    """Four significant digits: what the fit can tell, and a file a person can read."""
    return float(f"{x:.4g}")


def _not_faster(fit: Fit, base_mean: float) -> None:
    """A connector cannot make the engine faster than the baseline: where the fitted difference
    comes out faster on the variant's own steps, it is the launches' host load that differed,
    not the connector, and the difference is not identified (scale 1, extra 0)."""
    scale = fit.terms["scale"]
    extra = fit.terms.get("extra_us")
    effect = (scale.value - 1.0) * base_mean if scale.identified else 0.0
    effect += extra.value if extra is not None and extra.identified else 0.0
    if effect >= 0:
        return
    why = (
        f"the variant's steps came out faster than the baseline's ({effect:+.4g} µs at its mean step), which a "
        "connector cannot make them: the launches' host load differed"
    )
    for term in (scale, extra):
        if term is not None and term.identified:
            term.identified, term.why = False, why
            term.value = 1.0 if term is scale else 0.0


def fit_variant(steps: pd.DataFrame, forward: Fit, schedule: Fit) -> tuple[VariantProfile, dict[str, Any]]:
    """A connector variant's hooks, its unexplained step time and scheduler scale."""
    sched = scheduled(steps).copy()
    hooks: dict[str, dict[str, float]] = {}
    quality: dict[str, Any] = {"hooks": {}}
    hook_total = np.zeros(len(sched))
    for hook in HOOK_NAMES:
        if sched[f"{hook}_us"].notna().sum() == 0:
            quality["hooks"][hook] = {"n": 0, "note": "never recorded for this variant"}
            continue
        fit = fit_hook(sched, hook)
        hooks[hook] = {name: _sig(fit.value(name)) for name in ("fixed_us", *HOOK_TERMS.values())}
        quality["hooks"][hook] = fit.as_dict()
        hook_total += sched[f"{hook}_us"].fillna(0).to_numpy()
    base = predict_forward(forward, sched)
    unexplained = _scale_fit(
        "engine_step_us - hooks", sched["engine_step_us"].to_numpy() - hook_total, base, sched["cell"].to_numpy(), True
    )
    _not_faster(unexplained, float(base.mean()))
    quality["unexplained"] = unexplained.as_dict()
    own = (sched["step_duration_us"] - sched["build_meta_us"].fillna(0)).to_numpy()
    sched_base = (
        schedule.value("schedule_base_us")
        + schedule.value("schedule_request_us") * sched["num_running"].fillna(0).to_numpy()
    )
    sched_fit = _scale_fit("step_duration_us - build_meta_us", own, sched_base, sched["cell"].to_numpy(), False)
    _not_faster(sched_fit, float(sched_base.mean()))
    quality["schedule"] = sched_fit.as_dict()
    profile = VariantProfile(
        connector=None,
        hooks=hooks,
        forward_scale=round(unexplained.terms["scale"].value, 4) if unexplained.terms["scale"].identified else 1.0,
        extra_us=round(unexplained.value("extra_us"), 1),
        schedule_scale=round(sched_fit.terms["scale"].value, 4) if sched_fit.terms["scale"].identified else 1.0,
    )
    return profile, quality


def calibrate(results_dir: Path, name: str | None = None, simulated_ok: bool = False) -> EngineProfile:
    """The engine profile fitted from the study under `results_dir`; CalibrationError (one line).
    `simulated_ok`: fit the simulator's own records (tests: a known answer to recover)."""
    data = read_study(Path(results_dir), "calibration", simulated_ok)
    baseline = baseline_of(data)
    base_steps = data.steps(baseline)
    forward = fit_forward(base_steps)
    if not forward.terms["step_base_us"].identified and not any(
        forward.terms[t].identified for t in FORWARD_TERMS.values()
    ):
        raise CalibrationError(f"{results_dir}: the baseline's engine steps identify no term of the step time")
    schedule = fit_schedule(base_steps)
    gap = base_steps["gap_us"].dropna()
    requests = data.requests(baseline)
    api = ApiProfile(_quantiles(requests["ingress_us"]), _quantiles(requests["egress_us"]))
    variants: dict[str, VariantProfile] = {}
    quality: dict[str, Any] = {
        "method": "least squares, terms dropped one at a time while not identified (95 % interval reaching 0, or "
        "negative); 95 % intervals cluster-robust by cell",
        "engine_step": forward.as_dict(),
        "schedule": schedule.as_dict(),
        "step_gap_us": {"n": int(gap.size), "median": round(float(gap.median()), 1) if gap.size else None},
        "empty_steps": empty_steps(base_steps),
        "scatter": step_scatter(base_steps, forward),
        "api": {
            baseline: {"ingress": _api_summary(requests["ingress_us"]), "egress": _api_summary(requests["egress_us"])}
        },
        "variants": {},
    }
    for variant in data.variants:
        connector = _connector(data, variant)
        own = data.requests(variant)
        ingress, egress = own["ingress_us"].dropna(), own["egress_us"].dropna()
        own_api = None
        if variant != baseline and min(ingress.size, egress.size) >= MIN_API_SAMPLES:
            own_api = ApiProfile(_quantiles(ingress), _quantiles(egress))
        if variant != baseline:
            quality["api"][variant] = {"ingress": _api_summary(ingress), "egress": _api_summary(egress)}
        if not connector:
            variants[variant] = VariantProfile(connector=None, api=own_api)
            continue
        fitted, q = fit_variant(data.steps(variant), forward, schedule)
        steps = data.steps(variant)
        q["other_worker_hooks_note"] = (
            "wait_for_layer_load, save_kv_layer and wait_for_save are not modelled one by one; their time is "
            "inside engine_step_us - hooks (the unexplained part)"
        )
        q["steps"] = len(scheduled(steps))
        q["empty_steps"] = empty_steps(steps)
        quality["variants"][variant] = q
        variants[variant] = VariantProfile(
            connector=connector,
            hooks=fitted.hooks,
            forward_scale=fitted.forward_scale,
            extra_us=fitted.extra_us,
            schedule_scale=fitted.schedule_scale,
            api=own_api,
        )
    hardware = {
        "step_base_us": round(forward.value("step_base_us"), 2),
        "prefill_token_us": round(forward.value("prefill_token_us"), 4),
        "decode_seq_us": round(forward.value("decode_seq_us"), 3),
        "context_token_us": round(forward.value("context_token_us"), 5),
        "kv_cache_blocks": int(data.kv_cache_blocks or DEFAULT_KV_BLOCKS),
        "block_size": int(data.block_size),
        "schedule_base_us": round(schedule.value("schedule_base_us"), 2),
        "schedule_request_us": round(schedule.value("schedule_request_us"), 3),
        "step_gap_us": round(float(gap.median()), 1) if gap.size else 0.0,
    }
    settings = data.study.settings
    models = sorted(model_names(settings.raw), key=lambda m: m != (settings.model.served_name or ""))
    return EngineProfile(
        name=name or f"{data.study.name}-calibrated",
        kind="calibrated",
        models=tuple(models),
        hardware=hardware,
        api=api,
        variants=variants,
        provenance=provenance(data, baseline),
        fit=quality,
    )
