"""The rules that decide a cell's course, one copy for both clocks: the load generator's run in
real time (realtime.py) and the simulator's run in virtual time (oracle/virtual_run.py).

A cell issues from t0: requests due before the warm-up's end are issued, recorded and flagged
warm-up; issuing goes on to the duration floor, then for as long as min-completed post-warm-up
requests are not done or the caller's `enough` (the pipeline's precision watch) says no, up to
max_duration_s; the caller's `give_up` (the overload guard) ends it at once past the floor. A
trace ends when it runs out. A request over the in-flight cap is dropped (recorded, never sent).
After the last issue the drain waits for what is in flight, at most the drain budget, which
grows with the longest stream issued up to the request timeout. If the two clocks ended cells by
different rules, a virtual cell would measure something else than a real one.
"""

from __future__ import annotations

from collections.abc import Callable

from connector_tax.config.cells import Cell, TraceRequest
from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.loadgen.schedule.trace import trace_arrivals

_NS = 1_000_000_000


class CellRules:
    """The course of one cell started at `t0` (ns on the cell's clock).

    enough:   past the floor and min-completed, may the cell end? (None: yes)
    give_up:  end now, past the floor, min-completed or not (None: never)
    ask_every_ns: ask `enough` at most this often on the cell's clock, keeping its last answer
              (the virtual clock's precision check recomputes; the real one reads a flag a
              thread keeps, so it is asked every time)."""

    def __init__(
        self,
        cell: Cell,
        options: LoadgenOptions,
        t0: int,
        enough: Callable[[], bool] | None = None,
        give_up: Callable[[], bool] | None = None,
        ask_every_ns: int | None = None,
    ) -> None:
        self.cell, self.options, self.t0 = cell, options, t0
        self.enough, self.give_up, self.ask_every_ns = enough, give_up, ask_every_ns
        self.warm_end = t0 + int(cell.warmup_s * _NS)
        self.issue_end = self.warm_end + int(cell.duration_s * _NS)
        self.hard_end = self.warm_end + int(cell.max_duration() * _NS)
        if cell.arrival == "trace":  # a trace ends when it runs out
            self.issue_end = self.hard_end = (
                t0 + max(trace_arrivals(list(self.trace()), cell.time_scale), default=0) + 1
            )
        self.planned_end = self.issue_end  # the hard end once the cell extends past its floor
        self.longest_output = 0  # output tokens of the longest request issued (sizes the drain)
        self._next_ask = self.issue_end
        self._was_enough = False

    def trace(self) -> tuple[TraceRequest, ...]:
        cell = self.cell
        assert cell.trace is not None
        return cell.trace[: cell.num_requests] if cell.num_requests else cell.trace

    def warmup(self, t: int) -> bool:
        """A request due at `t` is a warm-up request (issued, recorded, excluded)."""
        return t < self.warm_end

    def admits(self, in_flight: int) -> bool:
        """A request may be sent with `in_flight` others unanswered (else it is dropped)."""
        return in_flight < self.options.inflight_cap

    def issued(self, output_len: int) -> None:
        self.longest_output = max(self.longest_output, output_len)

    def done(self, t: int, completed_post: int) -> bool:
        """Does the cell stop issuing at `t`, with `completed_post` post-warm-up requests done?"""
        if t < self.issue_end:
            return False
        if t >= self.hard_end or (self.give_up is not None and self.give_up()):
            return True
        if completed_post >= self.cell.min_completed and self._enough(t):
            return True
        self.planned_end = self.hard_end  # extended: its planned end is the hard one
        return False

    def _enough(self, t: int) -> bool:
        if self.enough is None:
            return True
        if self.ask_every_ns is None:
            return self.enough()
        if t >= self._next_ask:
            self._was_enough = self.enough()
            self._next_ask = t + self.ask_every_ns
        return self._was_enough

    def extended(self, t_issue_end: int) -> bool:
        """Did issuing go on past the duration floor (more than 0.1 s)?"""
        return t_issue_end > self.warm_end + int(self.cell.duration_s * _NS) + 100_000_000

    def drain_budget_s(self) -> float:
        """The drain's bound: the base, plus time for the longest stream issued, up to the
        request timeout."""
        opts = self.options
        return min(
            max(opts.timeout_s, opts.drain_timeout_s),
            opts.drain_timeout_s + self.longest_output * opts.drain_s_per_token,
        )
