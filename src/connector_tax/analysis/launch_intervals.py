"""Tax intervals that include the launch, and p90 intervals that respect what they measure.

A latency p90 and a tax are positive and ratio quantities, and a server launch has a bias of its
own (on the real CPU engine, two launches of the same server differ by a few percent per step).
This module gives:

* **A cell's p90 interval on the log scale** (`log_percentile_ci`): batch means (batchmeans.py)
  of log p90s, exponentiated back, so the interval is never below zero and is as wide as the
  tail is heavy. A cell with fewer than MIN_P90_SAMPLES requests gets no interval, and says it is
  too small to bound its p90 (MLPerf's early stopping needs 64 samples for a p90 at all).
* **A paired tax per launch** (`paired_log_ratio`): with common random numbers the variant's and
  the baseline's cells of one (phase, cell, replicate) sent identical requests, so request i of
  one is paired with request i of the other: the tax is the log ratio of the two p90s over the
  requests both completed, and its within-launch variance the batch means of the per-batch log
  ratios (consecutive requests in the same batches of both cells). The traffic both saw cancels;
  what is left is what the two servers did differently. Cells without common traffic fall back
  to two independent cells (the sum of their log variances).
* **The launch's variance** (`launch_variance`): in one replicate every variant saw the same
  traffic, so the variants' log p90s of a cell form a variants x replicates table: rows are the
  variants, columns the replicates' traffic, and what is left (the interaction) is each launch's
  own bias plus the small within-launch noise. Its mean square, less that noise, is the launch
  variance of the cell (the same engine: one per cell and metric for every variant), truncated at
  zero, with (variants - 1)(replicates - 1) degrees of freedom. The A/A control adds a row.
* **The tax's interval** (`tax_interval`): the mean over the k replicates of the paired log
  ratios, with variance 2 s_L^2 / k (each replicate compares two launches; fewer where both
  sides are one measurement, whose bias cancels: launch_weight) + the mean within-launch
  variance / k, and a Student-t quantile at the Satterthwaite degrees of freedom; exponentiated
  back, so a ratio's interval never reaches -100 %. With one launch per variant
  the launch variance is not estimated, and every output says so. Each tax reports the share of
  its variance that is launch to launch.

Assumptions, stated in every output: launch biases are independent between launches and have one
variance per (cell, metric) for every variant (the A/A control checks it); consecutive
batches of requests are nearly independent (batchmeans.py); the log p90 is close to normal
across batches and launches. A random-effects interval, not a bootstrap: with k = 2 or 3 launches
a bootstrap over launches has too few distinct resamples to mean anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from connector_tax.analysis.batchmeans import batch_count, t975

MIN_P90_SAMPLES = 64  # MLPerf LoadGen's early stopping: fewer samples cannot bound a p90 at all
TOO_SMALL = f"too small to bound its p90 (fewer than {MIN_P90_SAMPLES} requests)"

METHOD = (
    "per replicate, the log ratio of the variant's and the baseline's p90 over the requests both "
    "sent (common random numbers pair request i with request i), its within-launch variance from batch "
    "means and the jackknife of the batches; over replicates, the mean log ratio with a random-effects "
    "variance (2 s_L^2 / k for the launches, s_L^2 the variants x replicates interaction of the cell's log "
    "p90s less the within-launch noise, plus the within-launch variance / k) and a Student-t quantile at Satterthwaite's degrees of freedom; "
    "exponentiated back (never below -100 %). Assumes independent launch biases of one variance per cell "
    "and metric, consecutive batches of requests nearly independent, log p90s nearly normal"
)
P90_METHOD = (
    "batch means on the log scale: the requests in send order cut into batches, as many of about 80 as "
    "fit, 5 at least and 20 at most (64 requests: 5 of about 13), a "
    "Student-t 95% interval from the spread of the batches' log p90s, exponentiated back around the p90 "
    f"of all requests (never below zero); fewer than {MIN_P90_SAMPLES} requests: no interval"
)
ONE_LAUNCH = "between-launch variance not estimated: one launch per variant (workload.replicates: 1)"


@dataclass
class Series:
    """One metric of one cell: each completed request's value and its index in the cell's
    schedule (the index common random numbers pair on), in send order."""

    index: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        order = np.argsort(self.index, kind="stable")
        self.index = np.asarray(self.index, dtype=np.int64)[order]
        self.values = np.asarray(self.values, dtype=np.float64)[order]
        keep = np.isfinite(self.values) & (self.values > 0)
        self.index, self.values = self.index[keep], self.values[keep]

    @property
    def n(self) -> int:
        return int(self.values.size)


def _batches(values: np.ndarray) -> list[np.ndarray]:
    return np.array_split(values, batch_count(values.size))


def log_percentile_ci(values: np.ndarray, p: float = 90) -> tuple[float | None, float | None, float | None]:
    """(p-th percentile, lower, upper) of positive values in send order: batch means of the
    batches' log percentiles, around the log percentile of all; no bounds below MIN_P90_SAMPLES."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None, None, None
    est = float(np.percentile(arr, p))
    if arr.size < MIN_P90_SAMPLES or est <= 0:
        return est, None, None
    per = np.array([np.percentile(b, p) for b in _batches(arr)])
    if (per <= 0).any():
        return est, None, None
    logs = np.log(per)
    half = t975(len(per) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(per))
    return est, est * math.exp(-half), est * math.exp(half)


def log_variance(series: Series, p: float = 90) -> tuple[float, int] | None:
    """(variance of the cell's log p-th percentile, its degrees of freedom), or None when the cell
    is too small to bound it."""
    if series.n < MIN_P90_SAMPLES:
        return None
    per = np.array([np.percentile(b, p) for b in _batches(series.values)])
    if (per <= 0).any():
        return None
    return float(np.log(per).var(ddof=1)) / len(per), len(per) - 1


@dataclass
class PairedRatio:
    """One replicate's tax of a variant over the baseline: log(p90 x / p90 base)."""

    value: float  # the log ratio
    variance: float | None  # within-launch variance of it (None: the cells are too small)
    df: int
    n: int  # requests in the comparison (paired: common to both cells)
    paired: bool
    launches: float = 2.0  # the launch biases it carries, in launch variances (launch_weight)


def same_measurement(a: Series, b: Series) -> bool:
    """Two series that are one cell's measurement (the same requests with the same values: a study
    compared with a copy or a re-analysis of itself, a variant with itself), so one launch's bias."""
    return a is b or (np.array_equal(a.index, b.index) and np.array_equal(a.values, b.values))


def launch_weight(terms: list[tuple[int, Series]]) -> float:
    """How many launch variances a signed sum of log p90s carries: over its distinct launches, the
    square of each one's net sign. Two launches: 2 (a tax, a p90 in two studies); four: 4 (a tax's
    change across studies); the same measurement on both sides cancels its launch's bias: 0, so a
    study compared with itself is 0 [0, 0] however many replicates it has. Series that are not the
    same measurement count as launches of their own (two measurements of one launch are not
    recognised as such: the weight then errs high, the interval wide)."""
    groups: list[tuple[Series, int]] = []
    for sign, series in terms:
        for i, (first, net) in enumerate(groups):
            if same_measurement(first, series):
                groups[i] = (first, net + sign)
                break
        else:
            groups.append((series, sign))
    return float(sum(net * net for _, net in groups))


def paired_log_ratio(x: Series, base: Series, p: float = 90, common_traffic: bool = True) -> PairedRatio | None:
    """The log ratio of x's and the baseline's p-th percentiles in one replicate: over the requests
    both cells completed, paired by index, when they share traffic (common random numbers); else
    (no common request, or `common_traffic` false: two studies of other seeds, whose request i
    differ) over each whole cell, as two independent cells. One measurement on both sides is one
    traffic and one launch."""
    launches = launch_weight([(1, x), (-1, base)])
    common_traffic = common_traffic or launches == 0
    common, xi, bi = np.intersect1d(x.index, base.index, assume_unique=True, return_indices=True)
    if common_traffic and common.size > 0 and common.size >= 0.5 * min(x.n, base.n):
        xv, bv = x.values[xi], base.values[bi]  # both in index (send) order
        value = math.log(np.percentile(xv, p) / np.percentile(bv, p))
        if common.size < MIN_P90_SAMPLES:
            return PairedRatio(value, None, 0, int(common.size), True, launches)
        variance = _paired_variance(xv, bv, p)
        return PairedRatio(value, variance, batch_count(xv.size) - 1, int(common.size), True, launches)
    if x.n == 0 or base.n == 0:
        return None
    value = math.log(np.percentile(x.values, p) / np.percentile(base.values, p))
    vx, vb = log_variance(x, p), log_variance(base, p)
    if vx is None or vb is None:
        return PairedRatio(value, None, 0, min(x.n, base.n), False, launches)
    return PairedRatio(value, vx[0] + vb[0], min(vx[1], vb[1]), min(x.n, base.n), False, launches)


def _paired_variance(xv: np.ndarray, bv: np.ndarray, p: float) -> float:
    """Within-launch variance of log(p90 x / p90 b) over paired requests: the larger of the batch
    means' and the delete-one-batch jackknife's. A ratio of two p90s is not a smooth function of
    the batches (which request sits at the 90th rank jumps between clusters of similar latencies),
    and either estimate alone can be several times too small: on the simulator's TPOT of a cheap
    connector, batch means covered 51-59 % of traffic realisations, the jackknife 85 %, the larger
    of the two 88-90 % (one launch, 400 requests, against a 40,000-request truth)."""
    return _aligned_variance([xv, bv], (1, -1), p)


def _aligned_variance(arrays: list[np.ndarray], signs: tuple[int, ...], p: float) -> float:
    """_paired_variance's estimate for sum(sign * log p-th percentile) over arrays aligned request
    by request (the same traffic), cut into the same batches."""
    batched = [_batches(a) for a in arrays]
    g = len(batched[0])

    def stat(parts: list[np.ndarray]) -> float:
        return sum(sign * math.log(np.percentile(part, p)) for sign, part in zip(signs, parts))

    per_batch = np.array([stat([b[j] for b in batched]) for j in range(g)])
    batch_means = float(per_batch.var(ddof=1)) / g
    left_out = np.array([stat([np.concatenate(b[:j] + b[j + 1 :]) for b in batched]) for j in range(g)])
    jackknife = (g - 1) / g * float(((left_out - left_out.mean()) ** 2).sum())
    return max(batch_means, jackknife)


def aligned_log_ratio(terms: list[tuple[int, Series]], p: float = 90) -> PairedRatio | None:
    """sum(sign * log p-th percentile) over series that drew the same traffic (one study's variant
    and baseline, and another study of the same seed's two): over the requests every one of them
    completed, paired by index, with _paired_variance's within-launch variance. None where they
    share fewer than half of the smallest one's requests (then they are not the same traffic)."""
    series = [s for _, s in terms]
    common = series[0].index
    for s in series[1:]:
        common = np.intersect1d(common, s.index, assume_unique=True)
    if common.size == 0 or common.size < 0.5 * min(s.n for s in series):
        return None
    aligned = [s.values[np.intersect1d(s.index, common, assume_unique=True, return_indices=True)[1]] for s in series]
    signs = tuple(sign for sign, _ in terms)
    value = sum(sign * math.log(np.percentile(v, p)) for sign, v in zip(signs, aligned))
    launches = launch_weight(terms)
    if common.size < MIN_P90_SAMPLES:
        return PairedRatio(value, None, 0, int(common.size), True, launches)
    variance = _aligned_variance(aligned, signs, p)
    return PairedRatio(value, variance, batch_count(common.size) - 1, int(common.size), True, launches)


@dataclass
class LaunchVariance:
    """The launch-to-launch variance of a cell's log p90, pooled over variants."""

    variance: float | None  # None: not estimated (fewer than two variants with two launches)
    df: int
    variants: list[str] = field(default_factory=list)


def pooled(a: LaunchVariance, b: LaunchVariance) -> LaunchVariance:
    """One launch variance from two studies' estimates of it (the same assumption as within a
    study: one variance per cell and metric), weighted by their degrees of freedom; one alone
    stands for both."""
    known = [(v.variance, v) for v in (a, b) if v.variance is not None and v.df > 0]
    if not known:
        return LaunchVariance(None, 0)
    df = sum(v.df for _, v in known)
    return LaunchVariance(
        sum(var * v.df for var, v in known) / df, df, sorted({n for _, v in known for n in v.variants})
    )


def log_p90(series: Series, p: float = 90) -> float | None:
    return math.log(float(np.percentile(series.values, p))) if series.n else None


def launch_variance(logs: dict[str, dict[int, float]], within: float) -> LaunchVariance:
    """The variance of one launch's log p90 of a cell, from every variant's launches of it.

    `logs`: {variant: {replicate: log p90}}; `within`: the variance of a log p90 around what the
    replicate's traffic gives every variant alike (half a paired log ratio's within-launch
    variance). Common random numbers give every variant the same traffic in a replicate, so the
    log p90s form a variants x replicates table whose row effects are the variants, whose column
    effects are the replicates' traffic, and whose interaction is the launches' own biases plus
    `within`: the interaction's mean square minus `within` (truncated at zero), with
    (variants - 1)(replicates - 1) degrees of freedom."""
    complete = {v: d for v, d in logs.items() if len(d) >= 2}
    if len(complete) < 2:
        return LaunchVariance(None, 0)
    common = sorted(set.intersection(*(set(d) for d in complete.values())))
    if len(common) < 2:
        return LaunchVariance(None, 0)
    names = sorted(complete)
    y = np.array([[complete[v][r] for r in common] for v in names])
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    df = (len(names) - 1) * (len(common) - 1)
    return LaunchVariance(max(0.0, float((resid**2).sum()) / df - within), df, names)


def tax_interval(replicates: list[PairedRatio], launch: LaunchVariance) -> dict[str, Any]:
    """A tax (x / base - 1) over its replicates, with its 95% interval and the share of its
    variance that is launch to launch: each replicate adds its launch weight (2 for a variant
    against the baseline) times the launch variance, over k^2."""
    if not replicates:
        return {"value": None, "ci": None}
    k = len(replicates)
    mean = float(np.mean([r.value for r in replicates]))
    out: dict[str, Any] = {
        "value": math.exp(mean) - 1.0,
        "ci": None,
        "replicates": k,
        "paired": all(r.paired for r in replicates),
        "n": [r.n for r in replicates],
        "launch_share": None,
        "launch_sd": None if launch.variance is None else math.sqrt(launch.variance),
        "launch_df": launch.df,
    }
    variances = [r.variance for r in replicates if r.variance is not None]
    if len(variances) < len(replicates):
        out["note"] = TOO_SMALL.replace("its p90", "the p90 of a cell behind it")
        return out
    within = sum(variances) / k**2
    df_within = sum(r.df for r in replicates)
    if k < 2 or launch.variance is None:
        between, df_between = 0.0, None
        out["note"] = ONE_LAUNCH if k < 2 else "between-launch variance not estimated: no variant has two launches"
    else:
        between, df_between = launch.variance * sum(r.launches for r in replicates) / k**2, launch.df
    total = within + between
    if total <= 0:
        out["ci"] = [out["value"], out["value"]]
        return out
    terms = [(within, df_within)] + ([(between, df_between)] if df_between else [])
    denominator = sum(v**2 / d for v, d in terms if v > 0 and d > 0)
    df = max(1, int(total**2 / denominator)) if denominator > 0 else max(1, df_within)
    half = t975(df) * math.sqrt(total)
    out.update(
        ci=[math.exp(mean - half) - 1.0, math.exp(mean + half) - 1.0],
        df=df,
        log_half_width=half,
        launch_share=None if df_between is None else between / total,
    )
    return out


def survives(tax: dict[str, Any] | None, aa: dict[str, Any] | None) -> tuple[bool | None, str]:
    """Does a tax stand out of the study's own noise? Its 95% interval (launch included) must
    exclude 0, and, with an A/A control, its size must exceed the largest the A/A control's
    interval allows at the same cell and metric (the tax a server identical to the baseline
    shows). None: no interval to judge by."""
    if not tax or tax.get("value") is None or not tax.get("ci") or None in tax["ci"]:
        return None, "no interval"
    lo, hi = tax["ci"]
    if lo <= 0 <= hi:
        return False, "its interval includes 0"
    if aa is None or not aa.get("ci") or None in aa["ci"]:
        return True, "its interval excludes 0" + ("" if aa is None else " (the A/A control has no interval here)")
    floor = max(abs(aa["ci"][0]), abs(aa["ci"][1]))
    if abs(tax["value"]) <= floor:
        return False, f"within the A/A control's noise floor (±{floor * 100:.1f}%)"
    return True, f"beyond the A/A control's noise floor (±{floor * 100:.1f}%)"
