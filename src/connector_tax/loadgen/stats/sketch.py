"""Bounded percentile state for a cell's summary: exact while small, a log histogram after.

A cell's summary must not need every record in memory (2,000 req/s for 10 minutes is 1.2 M
records and 77 M inter-token gaps). `Quantiles` keeps the values themselves, in a numpy buffer,
up to `exact_cap` (default 100,000 values: 0.8 MB); the percentiles are then exact, as they were
when the summary read every record. Past the cap it folds them into a histogram of logarithmic
buckets, relative width 2·REL_ERR, so any percentile it reports is within REL_ERR (0.5 %) of
a value in the data at that rank; count, mean, min and max stay exact. Memory is fixed (the
buffer, plus one int64 per occupied bucket: ~1,500 buckets span 1 µs to 1 hour). Histograms of two
`Quantiles` merge by adding counts (`merge`), so per-worker or per-cell states combine.

The analysis recomputes exact percentiles from the JSONL records anyway; the summary is the
instrument's own view, and says which one it is (`exact` in `describe()`).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

REL_ERR = 0.005
_GAMMA = (1 + REL_ERR) / (1 - REL_ERR)
_LOG_GAMMA = math.log(_GAMMA)
DEFAULT_EXACT_CAP = 100_000
_FOLD_BLOCK = 65_536
PENDING = 4096  # values added one at a time, held before they reach the numpy state


class Quantiles:
    """Non-negative values (latencies): exact percentiles up to exact_cap values, then within REL_ERR."""

    def __init__(self, exact_cap: int = DEFAULT_EXACT_CAP) -> None:
        self.exact_cap = exact_cap
        self._buf = np.empty(min(exact_cap, 1024), dtype=np.float64)
        self._n_buf = 0
        self._count = 0
        self._total = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._hist: dict[int, int] | None = None  # bucket -> count, once past the cap
        self._zeros = 0  # values <= 0 (gaps of tokens that arrived in one read)
        self._pending = array("d")  # added, not yet in the state above

    # Every reading of the state takes in the pending values first.
    @property
    def count(self) -> int:
        self._absorb()
        return self._count

    @property
    def total(self) -> float:
        self._absorb()
        return self._total

    @property
    def min(self) -> float:
        self._absorb()
        return self._min

    @property
    def max(self) -> float:
        self._absorb()
        return self._max

    @property
    def exact(self) -> bool:
        self._absorb()
        return self._hist is None

    def add(self, value: float) -> None:
        pending = self._pending
        pending.append(value)
        if len(pending) >= PENDING:
            self._absorb()

    def _absorb(self) -> None:
        if self._pending:
            values = np.array(self._pending, dtype=np.float64)
            self._pending = array("d")
            self.extend(values)

    def extend(self, values: np.ndarray) -> None:
        n = len(values)
        if not n:
            return
        values = values.astype(np.float64, copy=False)
        self._count += n
        self._total += float(values.sum())
        self._min = min(self._min, float(values.min()))
        self._max = max(self._max, float(values.max()))
        while n:
            if self._n_buf == len(self._buf):
                self._make_room(n)
            take = min(n, len(self._buf) - self._n_buf)
            self._buf[self._n_buf : self._n_buf + take] = values[:take]
            self._n_buf += take
            values = values[take:]
            n -= take

    def _make_room(self, want: int) -> None:
        size = len(self._buf)
        if self._hist is None and size < self.exact_cap:
            grown = np.empty(min(self.exact_cap, max(2 * size, size + want)), dtype=np.float64)
            grown[: self._n_buf] = self._buf[: self._n_buf]
            self._buf = grown
            return
        if self._hist is None:
            self._hist = {}
        self._fold()
        if len(self._buf) > _FOLD_BLOCK:
            self._buf = np.empty(_FOLD_BLOCK, dtype=np.float64)  # fixed from here on

    def _fold(self) -> None:
        """Move the buffered values into the histogram."""
        hist = self._hist
        assert hist is not None
        values = self._buf[: self._n_buf]
        positive = values[values > 0]
        self._zeros += len(values) - len(positive)
        if len(positive):
            buckets = np.ceil(np.log(positive) / _LOG_GAMMA).astype(np.int64)
            keys, counts = np.unique(buckets, return_counts=True)
            for k, c in zip(keys.tolist(), counts.tolist()):
                hist[k] = hist.get(k, 0) + c
        self._n_buf = 0

    def merge(self, other: Quantiles) -> None:
        """Add another state's values (exact while both fit, else via the histogram)."""
        self._absorb()
        other._absorb()
        if other._hist is None:
            self.extend(other._buf[: other._n_buf].copy())
            return
        if self._hist is None:
            self._hist = {}
        self._fold()
        other_values = other._buf[: other._n_buf]
        for k, c in (other._hist or {}).items():
            self._hist[k] = self._hist.get(k, 0) + c
        self._zeros += other._zeros
        self._count += other._count - len(other_values)
        self._total += other._total - float(other_values.sum())
        self._min, self._max = min(self._min, other._min), max(self._max, other._max)
        self.extend(other_values.copy())

    def percentiles(self, qs: list[float]) -> list[float]:
        self._absorb()
        if not self._count:
            return []
        if self._hist is None:
            return [float(v) for v in np.percentile(self._buf[: self._n_buf], qs)]
        self._fold()
        keys = sorted(self._hist)
        counts = np.array([self._zeros] + [self._hist[k] for k in keys], dtype=np.int64)
        # A bucket's representative: the value within REL_ERR of every value in (γ^(k-1), γ^k].
        reps = np.array([0.0] + [2 * _GAMMA**k / (_GAMMA + 1) for k in keys])
        cum = np.cumsum(counts)
        out = []
        for q in qs:
            rank = min(self._count - 1, max(0, math.ceil(q / 100 * self._count) - 1))
            value = float(reps[int(np.searchsorted(cum, rank, side="right"))])
            out.append(min(max(value, self._min), self._max))
        return out

    def nbytes(self) -> int:
        return int(self._buf.nbytes) + 16 * len(self._hist or ()) + 8 * PENDING
