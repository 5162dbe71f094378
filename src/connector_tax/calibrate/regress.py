"""Least squares that says which terms the data identify, and how well the rest fits.

A cost model is linear in a few terms (a fixed cost, per prefill token, per decoding sequence,
...), and the data decide which of them can be told apart from noise. `fit_terms` fits all the
candidate terms, then drops, one at a time, the term that the data cannot identify (a column
that does not vary, or a coefficient whose 95 % interval reaches zero or that comes out negative,
which no cost can be), refitting after each drop; what remains is the model, and each dropped
term is reported with why, never guessed. Fit quality is R², the residuals' standard deviation
and median absolute deviation, and each coefficient's standard error and 95 % interval.

Consecutive engine steps are correlated (a busy stretch of the host slows several in a row),
so classical standard errors would be too narrow. With `cluster` (the cell of each row, rows of
a cell in time order) they are cluster-robust when there are enough cells, else Newey-West with
lags inside each cell: both hold when steps of different cells are independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats


@dataclass
class Term:
    name: str
    value: float  # 0 when not identified (a scale: its neutral value is the caller's business)
    se: float | None = None
    ci: tuple[float, float] | None = None
    identified: bool = True
    why: str | None = None  # why it was not identified

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": _round(self.value), "identified": self.identified}
        if self.se is not None:
            out["se"] = _round(self.se)
        if self.ci is not None:
            out["ci95"] = [_round(self.ci[0]), _round(self.ci[1])]
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class Fit:
    target: str
    n: int
    terms: dict[str, Term] = field(default_factory=dict)
    r2: float | None = None
    residual_sd: float | None = None
    residual_mad: float | None = None
    mean: float | None = None
    note: str | None = None

    def value(self, name: str) -> float:
        term = self.terms.get(name)
        return term.value if term is not None and term.identified else 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "n": self.n}
        for key in ("r2", "residual_sd", "residual_mad", "mean"):
            value = getattr(self, key)
            if value is not None:
                out[key] = _round(value)
        out["terms"] = {k: t.as_dict() for k, t in self.terms.items()}
        if self.note:
            out["note"] = self.note
        return out


def _round(x: float) -> float:
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.4g}")


MIN_CLUSTERS = 10  # fewer groups than this: Newey-West within each group instead of cluster-robust


def _hac_meat(x: np.ndarray, resid: np.ndarray, groups: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Newey-West (Bartlett) sum of score outer products, lags counted within each group only
    (rows of a group in time order); returns (meat, lag)."""
    n, k = x.shape
    lag = int(math.ceil(4 * (n / 100) ** (2 / 9)))
    scores = x * resid[:, None]
    meat = scores.T @ scores
    for j in range(1, min(lag, n - 1) + 1):
        w = 1.0 - j / (lag + 1)
        a, b = scores[j:], scores[:-j]
        if groups is not None:
            keep = groups[j:] == groups[:-j]
            a, b = a[keep], b[keep]
        gamma = a.T @ b
        meat += w * (gamma + gamma.T)
    return meat, lag


def _solve(x: np.ndarray, y: np.ndarray, cluster: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(coefficients, standard errors, residuals, degrees of freedom). Standard errors: cluster-
    robust over `cluster` when it has MIN_CLUSTERS groups or more, else Newey-West with the lags
    inside each group (consecutive steps of one cell are correlated, steps of two cells not)."""
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    n, k = x.shape
    dof = max(n - k, 1)
    xtx_inv = np.linalg.pinv(x.T @ x)
    groups = np.unique(cluster) if cluster is not None else np.array([])
    if cluster is not None and len(groups) >= MIN_CLUSTERS:
        meat = np.zeros((k, k))
        for g in groups:
            sel = cluster == g
            score = x[sel].T @ resid[sel]
            meat += np.outer(score, score)
        correction = len(groups) / (len(groups) - 1) * (n - 1) / dof
        cov = xtx_inv @ meat @ xtx_inv * correction
        dof = len(groups) - 1
    else:
        meat, _ = _hac_meat(x, resid, cluster)
        cov = xtx_inv @ meat @ xtx_inv * n / dof
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return beta, se, resid, dof


def fit_terms(
    target: str,
    y: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    intercept: str | None = None,
    cluster: np.ndarray | None = None,
    min_rows: int = 10,
    keep: tuple[str, ...] = (),
    signs_free: bool = False,
) -> Fit:
    """Fit y ~ intercept + sum(coef * column); drop what the data cannot identify (see the
    module docstring). `keep`: terms never dropped (still reported with their intervals);
    `signs_free`: the terms are differences, not costs, so a negative one may stay."""
    y = np.asarray(y, dtype=float)
    cols = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    ok = np.isfinite(y)
    for v in cols.values():
        ok &= np.isfinite(v)
    y = y[ok]
    cols = {k: v[ok] for k, v in cols.items()}
    cl = np.asarray(cluster)[ok] if cluster is not None else None
    names = ([intercept] if intercept else []) + list(cols)
    fit = Fit(target=target, n=int(y.size))
    if y.size < min_rows:
        fit.note = f"{y.size} rows: too few to fit (at least {min_rows})"
        for name in names:
            fit.terms[name] = Term(name, 0.0, identified=False, why="too few rows")
        return fit
    active = list(names)
    dropped: dict[str, str] = {}
    for name in list(cols):
        spread = float(np.ptp(cols[name]))
        if spread <= 1e-12 * max(1.0, float(np.abs(cols[name]).max())):
            active.remove(name)
            dropped[name] = "the data do not vary it (every row has the same value)"
    while True:
        if not active:
            beta, se, resid, dof = np.zeros(0), np.zeros(0), y.copy(), max(y.size - 1, 1)
            break
        x = np.column_stack([np.ones(y.size) if n == intercept else cols[n] for n in active])
        beta, se, resid, dof = _solve(x, y, cl)
        t_crit = float(stats.t.ppf(0.975, dof))
        worst, worst_why, worst_t = None, None, math.inf
        for name, b, s in zip(active, beta, se):
            if name in keep:
                continue
            tval = abs(b) / s if s > 0 else math.inf
            if b < 0 and not signs_free and tval < worst_t:
                worst, worst_t = name, tval
                worst_why = f"fitted negative ({b:.4g} ± {t_crit * s:.3g}), which no cost can be"
            elif (b >= 0 or signs_free) and tval < t_crit and tval < worst_t:
                worst, worst_t = name, tval
                worst_why = f"its 95 % interval reaches zero ({b:.4g} ± {t_crit * s:.3g})"
        if worst is None:
            break
        active.remove(worst)
        dropped[worst] = worst_why or "not identified"
    t_crit = float(stats.t.ppf(0.975, dof))
    for name in names:
        if name in active:
            i = active.index(name)
            coef, err = float(beta[i]), float(se[i])
            fit.terms[name] = Term(name, coef, err, (coef - t_crit * err, coef + t_crit * err))
        else:
            fit.terms[name] = Term(name, 0.0, identified=False, why=dropped.get(name, "not identified"))
    total = float(((y - y.mean()) ** 2).sum())
    fit.r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else None
    fit.residual_sd = float(resid.std(ddof=min(len(active), y.size - 1)))
    fit.residual_mad = float(np.median(np.abs(resid - np.median(resid))))
    fit.mean = float(y.mean())
    return fit
