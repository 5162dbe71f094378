"""Adaptive cell length: a cell goes on past its floor until its p90s are known well enough.

The idea of MLPerf LoadGen's early stopping, for percentiles. Past the warm-up, the duration
floor and min-completed, a cell keeps sending until the 95% intervals of its TTFT p90 and TPOT
p90 are within `workload.precision.target` (relative half-width) of their estimates, or until
`workload.precision.max_duration_s`. The intervals are batch means over the cell's requests in
send order (analysis.batchmeans), the method the analysis reports, so consecutive requests'
correlation does not make the cell stop too early.

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

from connector_tax.analysis.batchmeans import relative_half_width

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


class PrecisionWatch:
    def __init__(self, requests: Path, target: float | None) -> None:
        self.requests, self.target = requests, target
        self.reached = target is None  # no target: the floor and min-completed decide alone
        self.widths: dict[str, float | None] = {"ttft_p90": None, "tpot_p90": None}
        self._rows: list[tuple[int, float, float]] = []  # (t_scheduled_ns, ttft ms, tpot ms or nan)
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
            if r.get("warmup") or r.get("status") != "ok" or not r.get("t_first_token_ns") or not r.get("t_send_ns"):
                continue
            ttft = (r["t_first_token_ns"] - r["t_send_ns"]) / 1e6
            n = r.get("completion_tokens") or 0
            tpot = (
                (r["t_last_token_ns"] - r["t_first_token_ns"]) / 1e6 / (n - 1)
                if n > 1 and r.get("t_last_token_ns")
                else np.nan
            )
            self._rows.append((int(r["t_scheduled_ns"]), ttft, tpot))

    def check(self) -> bool:
        """Read what was appended since, recompute the two relative half-widths; whether the
        target is reached (always, without a target)."""
        if self.target is None:
            return True
        self._read()
        if not self._rows:
            return self.reached
        rows = np.array(sorted(self._rows))
        self.widths = {"ttft_p90": relative_half_width(rows[:, 1], 90)}
        if not np.isnan(rows[:, 2]).all():  # one-token outputs have no TPOT to be precise about
            self.widths["tpot_p90"] = relative_half_width(rows[:, 2], 90)
        assert self.target is not None
        self.reached = all(w is not None and w <= self.target for w in self.widths.values())
        return self.reached

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            self.check()

    def describe(self, summary: dict[str, Any], guard: OverloadGuard | None = None) -> dict[str, Any]:
        """Why the cell ended, for its sealed summary."""
        overloaded = guard is not None and guard.waiting_p50 is not None and guard.waiting_p50 > guard.threshold
        if summary.get("complete") is False:
            why = "stopped"
        elif overloaded:
            why = (
                f"ended at its floor: saturated at this rate (waiting p50 {guard.waiting_p50:g} > "
                f"{guard.threshold:g}); left out of H5/H6"
            )  # type: ignore[union-attr]
        elif self.target is None:
            why = "duration floor and min-completed"
        elif self.reached:
            why = f"precision reached (target ±{self.target:.0%})"
        else:
            why = "cap reached (max_duration_s) before the precision target"
        return {
            "stop_reason": why,
            "overloaded": overloaded,
            "precision_target": self.target,
            "precision": {k: None if v is None else round(v, 4) for k, v in self.widths.items()},
        }
