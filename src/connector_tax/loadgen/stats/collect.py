"""A cell's results, one Collector per target: requests in flight, results matched to them,
records and statistics.

The session thread registers each request as it issues it (`issue`); the pool's receiver
thread hands every worker result to `on_result`, which matches it by cell id, target, request
index *and* request id — a result from another cell run (a late one from the cell before), from
another target, or one whose id does not match is never attached to a request: it is written as
an `error` record of its own ("unmatched result …") and counted, and the cell is invalid. Each record is
appended and flushed as it completes and folded into the cell's bounded statistics; nothing
per request is kept once its record is written.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from connector_tax.loadgen import ipc
from connector_tax.loadgen.stats.request_file import RecordWriter, RequestRecord
from connector_tax.loadgen.stats.summarize import RequestStats

FINISHED_HORIZON_NS = 2_000_000_000  # result times kept for the in-flight correction


@dataclass
class Progress:
    issued: int = 0
    completed: int = 0
    in_flight: int = 0
    dropped: int = 0
    errors: int = 0
    recent_ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=256))

    def ttft_p50_ms(self) -> float | None:
        # The receiver thread appends while the progress thread reads: deque.copy() is one
        # C call under the GIL, iterating the live deque could raise "mutated during iteration".
        recent = self.recent_ttft_ms.copy()
        return float(np.median(recent)) if recent else None


class Pending(NamedTuple):
    t_sched: int  # its scheduled time
    in_flight: int  # requests issued and unanswered when this one was issued
    warmup: bool
    spec: ipc.RequestSpec
    worker: int
    issued: int


class Collector:
    def __init__(
        self, cell_id: str, writer: RecordWriter, stats: RequestStats, progress: Progress, target: int = 0
    ) -> None:
        self.cell_id = cell_id
        self.target = target
        self.writer = writer
        self.stats = stats
        self.progress = progress
        self.lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.pending: dict[int, Pending] = {}
        # When results arrived (the receiver's clock only moves forward: sorted), for the
        # in-flight correction; only the last FINISHED_HORIZON_NS are kept.
        self._finished = array("q")
        self.completed_post = 0
        self.on_done: Callable[[int], Any] | None = None  # called with each result's index (closed loop)

    # -- session thread ----------------------------------------------------------------
    def issue(
        self, t_sched: int, spec: ipc.RequestSpec, worker: int, warmup: bool, admits: Callable[[int], bool]
    ) -> int | None:
        """Register a request about to be sent: its in-flight count, or None if the cell's rules
        do not admit another one in flight (the in-flight cap)."""
        with self.lock:
            in_flight = len(self.pending)
            if not admits(in_flight):
                return None
            self.pending[spec.index] = Pending(t_sched, in_flight, warmup, spec, worker, time.monotonic_ns())
        self.progress.in_flight = in_flight + 1
        return in_flight

    def forget(self, index: int) -> None:
        with self.lock:
            self.pending.pop(index, None)

    def take_pending(self) -> dict[int, Pending]:
        with self.lock:
            lost, self.pending = self.pending, {}
        return lost

    def awaiting(self, live_workers: set[int]) -> bool:
        """Requests in flight on a live worker (a dead worker's will never answer)."""
        with self.lock:
            return any(p.worker in live_workers for p in self.pending.values())

    # -- receiver thread ---------------------------------------------------------------
    def on_result(self, res: ipc.RequestResult) -> None:
        now = time.monotonic_ns()
        with self.lock:
            entry = self.pending.get(res.index) if res.cell == self.cell_id and res.target == self.target else None
            if entry is not None and entry.spec.request_id == res.request_id:
                del self.pending[res.index]
            else:
                entry = None
            self.progress.in_flight = len(self.pending)
        if entry is None:
            self._unmatched(res)
            return
        self._note_finished(now)
        # Counted when issued, send_ahead_us before its time; those that finished in between
        # were no longer in flight when it was sent. Later issues have later times, so
        # nothing else needs correcting.
        f = self._finished
        in_flight = entry.in_flight - (bisect_right(f, entry.t_sched) - bisect_right(f, entry.issued))
        spec = entry.spec
        usage = res.usage_completion_tokens
        record = RequestRecord(
            spec.request_id,
            entry.t_sched,
            res.t_send_ns,
            res.t_first_token_ns,
            res.t_last_token_ns,
            res.prompt_tokens if res.prompt_tokens is not None else spec.input_len,
            res.completion_tokens,
            max(0, in_flight),
            entry.warmup,
            res.status,
            res.error,
            spec.input_len,
            spec.output_len,
            res.chunks,
            res.http_status,
            res.worker,
            self.cell_id,
            usage,
            usage is not None and usage != res.chunks,
            res.prompt_tokens,
        )
        if res.status == "ok":
            self.progress.completed += 1
            if not entry.warmup:
                self.completed_post += 1
            if res.t_first_token_ns and res.t_send_ns:
                self.progress.recent_ttft_ms.append((res.t_first_token_ns - res.t_send_ns) / 1e6)
        else:
            self.progress.errors += 1
        if self.on_done is not None:
            self.on_done(res.index)
        self.record(record, res.itl_us if res.status == "ok" else None)

    def _note_finished(self, now: int) -> None:
        f = self._finished
        f.append(now)
        # Drop what no pending request can need any more (bounded: a cell's memory is flat).
        if len(f) >= 8192 and f[len(f) // 2] < now - FINISHED_HORIZON_NS:
            del f[: len(f) // 2]

    def _unmatched(self, res: ipc.RequestResult) -> None:
        with self._stats_lock:
            self.stats.unmatched += 1
        if res.cell != self.cell_id:
            why = "another cell run"
        elif res.target != self.target:
            why = f"target {res.target}, not {self.target}"
        else:
            why = "no request of this cell in flight with that index and id"
        # No timings: they belong to no request of this cell. Not one of its requests either,
        # so only the unmatched count (and the validity check on it) sees it.
        self.record(
            RequestRecord(
                res.request_id or f"?{res.index}",
                res.t_send_ns or 0,
                None,
                None,
                None,
                None,
                None,
                0,
                False,
                "error",
                f"unmatched result from cell {res.cell!r} index {res.index}: {why}",
                0,
                0,
                res.chunks,
                res.http_status,
                res.worker,
                res.cell or None,
            ),
            counted=False,
        )

    def record(self, record: RequestRecord, itl_us: bytes | None = None, counted: bool = True) -> None:
        """Write it (flushed) and fold it into the statistics; thread-safe."""
        self.writer.write(record)
        if counted:
            with self._stats_lock:  # dropped records come from the session thread
                self.stats.add(record, itl_us)
