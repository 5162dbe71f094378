"""Adaptive cell length: a cell goes on past its floor until what it feeds is known well enough.

The idea of MLPerf LoadGen's early stopping, for percentiles. Past the warm-up, the duration
floor and min-completed, a cell keeps sending until the 95% intervals of its TTFT p90 and TPOT
p90 are within `workload.precision.target` (relative half-width) of their estimates, or until
`workload.precision.max_duration_s`. The intervals are batch means over the cell's requests in
send order (analysis.batchmeans), the method the analysis reports, so consecutive requests'
correlation does not make the cell stop too early.

With `workload.precision.of: tax`, a variant's cell stops on the precision of the taxes it feeds
instead: its requests are paired, index by index, with the baseline's sealed cell of the same
(phase, cell, replicate), which sent the same requests (common random numbers), and the cell ends
once the 95% intervals of both paired taxes (analysis.launch_intervals, the analysis's own
method) are within the target, or once every baseline request is paired (more cannot tighten
the pairs). A tax is far more precise than either p90 on the same requests, so such a cell needs
far fewer of them. Without a baseline cell to pair with, it stops on its own p90s.

A `PrecisionWatch` thread follows the cell's requests file as the load generator appends to it
(complete lines only), recomputes both half-widths once a second, and flips `reached`; the load
generator asks it, cheaply, whether it may end. Why the cell ended is sealed into its summary.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from connector_tax.analysis.batchmeans import relative_half_width, t975
from connector_tax.analysis.launch_intervals import MIN_P90_SAMPLES, Series, paired_log_ratio
from connector_tax.contract.summary import CellSummary

CHECK_S = 1.0


class OverloadGuard:
    """Phase B's overload guard: a shape the server cannot take at the reference rate (the
    queue's median above saturation criterion 2's threshold since the warm-up) ends at its
    floor instead of running to its cap; it is flagged, and the analysis leaves it out of H5/H6."""

    def __init__(self, waiting: list[tuple[float, float]], since: float, threshold: float, active: bool) -> None:
        """waiting: (monotonic s, vllm:num_requests_waiting) scrapes, appended as they come."""
        self.waiting, self.since, self.threshold, self.active = waiting, since, threshold, active
        self.waiting_p50: float | None = None

    def overloaded(self) -> bool:
        if not self.active:
            return False
        queue = [w for t, w in list(self.waiting) if t >= self.since]
        if len(queue) < 3:
            return False
        self.waiting_p50 = float(np.median(queue))
        return self.waiting_p50 > self.threshold


def _index(request_id: str) -> int:
    return int(request_id.rsplit("-", 1)[-1])


def _latencies(r: dict[str, Any]) -> tuple[float, float] | None:
    """(TTFT ms, TPOT ms or nan) of a completed post-warm-up request record, else None."""
    if r.get("warmup") or r.get("status") != "ok" or not r.get("t_first_token_ns") or not r.get("t_send_ns"):
        return None
    ttft = (r["t_first_token_ns"] - r["t_send_ns"]) / 1e6
    n = r.get("completion_tokens") or 0
    tpot = (
        (r["t_last_token_ns"] - r["t_first_token_ns"]) / 1e6 / (n - 1) if n > 1 and r.get("t_last_token_ns") else np.nan
    )
    return ttft, tpot


def _baseline(path: Path) -> dict[str, Series] | None:
    """The baseline cell's completed requests, per metric, by schedule index."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    rows = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        lat = _latencies(r)
        if lat is not None and r.get("request_id"):
            rows.append((_index(r["request_id"]), *lat))
    if not rows:
        return None
    arr = np.array(rows)
    return {"ttft_ms": Series(arr[:, 0], arr[:, 1]), "tpot_ms": Series(arr[:, 0], arr[:, 2])}


class PrecisionWatch:
    """`pair_with`: the baseline's sealed requests of the same (phase, cell, replicate) for a cell
    that stops on its taxes (None: it stops on its p90s)."""

    def __init__(self, requests: Path, target: float | None, pair_with: Path | None = None) -> None:
        self.requests, self.target = requests, target
        self.reached = target is None  # no target: the floor and min-completed decide alone
        self.baseline = _baseline(pair_with) if pair_with is not None and target is not None else None
        self.paired_with = str(pair_with) if self.baseline is not None else None
        self.unpaired = pair_with is not None and target is not None and self.baseline is None
        self.exhausted = False
        keys = ("ttft_tax", "tpot_tax") if self.baseline is not None else ("ttft_p90", "tpot_p90")
        self.widths: dict[str, float | None] = {k: None for k in keys}
        self._rows: list[tuple[int, int, float, float]] = []  # (t_scheduled_ns, index, ttft ms, tpot ms or nan)
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-precision-watch", daemon=True)

    def __enter__(self) -> PrecisionWatch:
        if self.target is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def enough(self) -> bool:
        return self.reached

    def _read(self) -> None:
        try:
            with open(self.requests, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            lat = _latencies(r)
            if lat is None:
                continue
            self._rows.append((int(r["t_scheduled_ns"]), _index(r.get("request_id") or "-0"), *lat))

    def check(self) -> bool:
        """Read what was appended since, recompute the half-widths; whether the target is reached
        (always, without a target)."""
        if self.target is None:
            return True
        self._read()
        if not self._rows:
            return self.reached
        rows = np.array(sorted(self._rows))
        if self.baseline is not None:
            self.reached = self._check_taxes(rows)
            return self.reached
        self.widths = {"ttft_p90": relative_half_width(rows[:, 2], 90)}
        if not np.isnan(rows[:, 3]).all():  # one-token outputs have no TPOT to be precise about
            self.widths["tpot_p90"] = relative_half_width(rows[:, 3], 90)
        assert self.target is not None
        self.reached = all(w is not None and w <= self.target for w in self.widths.values())
        return self.reached

    def _check_taxes(self, rows: np.ndarray) -> bool:
        """The paired taxes' 95% half-widths (log ratio) against the baseline's cell."""
        assert self.baseline is not None and self.target is not None
        widths: dict[str, float | None] = {}
        for metric, column in (("ttft_ms", 2), ("tpot_ms", 3)):
            base = self.baseline[metric]
            if base.n == 0:  # one-token outputs: no TPOT tax to be precise about
                continue
            pair = paired_log_ratio(Series(rows[:, 1], rows[:, column]), base)
            width = None
            if pair is not None and pair.variance is not None and pair.n >= MIN_P90_SAMPLES:
                width = t975(max(1, pair.df)) * pair.variance**0.5
            widths[metric.replace("_ms", "_tax")] = width
        self.widths = widths
        # Every baseline request has a partner: more requests cannot tighten the pairs.
        self.exhausted = len(rows) >= self.baseline["ttft_ms"].n
        return self.exhausted or all(w is not None and w <= self.target for w in widths.values())

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            self.check()

    def describe(self, summary: CellSummary, guard: OverloadGuard | None = None) -> None:
        """Why the cell ended, into its summary (sealed with it)."""
        overloaded = guard is not None and guard.waiting_p50 is not None and guard.waiting_p50 > guard.threshold
        taxes = self.baseline is not None
        if summary.complete is False:
            why = "stopped"
        elif overloaded and guard is not None:
            why = (
                f"ended at its floor: saturated at this rate (waiting p50 {guard.waiting_p50:g} > "
                f"{guard.threshold:g}); left out of H5/H6"
            )
        elif self.target is None:
            why = "duration floor and min-completed"
        elif taxes and self.reached and not self.exhausted:
            why = f"tax precision reached (target ±{self.target:.0%} on its TTFT and TPOT taxes, paired)"
        elif taxes and self.exhausted:
            why = "every request of the baseline's cell paired (more cannot tighten its taxes)"
        elif self.reached:
            why = f"precision reached (target ±{self.target:.0%})"
        else:
            why = "cap reached (max_duration_s) before the precision target"
        if self.unpaired:
            why += "; no baseline cell to pair with, so its own p90s set its length"
        summary.stop_reason = why
        summary.overloaded = overloaded
        summary.precision_target = self.target
        summary.precision_of = "tax" if taxes else "p90"
        summary.paired_with = self.paired_with
        summary.precision = {k: None if v is None else round(v, 4) for k, v in self.widths.items()}
