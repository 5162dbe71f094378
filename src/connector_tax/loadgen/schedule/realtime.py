"""One cell's run in real time, on the session thread: walk the arrival schedule, sleep to each
request's send-ahead time and issue without blocking (the worker fires it on the dot), while the
pool's receiver thread writes each record as it completes; then drain, and seal the summary.
When the cell ends, what is warm-up, what is dropped and how long the drain waits are the cell's
rules (rules.py), which the simulator's virtual-time runner follows too.

A cell may drive several targets (a duet: servers side by side): each scheduled request goes to
every target at the same time, the same spec to each, through that target's own workers, and
each target's records, summary and checks are a cell of their own in its own folder (sides.py).
The rules apply to the cell as a whole: min-completed is met when every target has met it; the
in-flight cap is each target's own, so a slow target's drops change nothing the others are sent.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import Any

from connector_tax.config.cells import Cell
from connector_tax.contract.layout import CellFiles
from connector_tax.contract.summary import CellSummary, RtPriority, write_summary
from connector_tax.loadgen import ipc
from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold
from connector_tax.loadgen.host.priority import PriorityState, raised
from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.loadgen.schedule.rules import CellRules
from connector_tax.loadgen.schedule.schedulers import ConcurrencyGate, arrivals
from connector_tax.loadgen.schedule.shapes import ShapeSampler, shape_seed
from connector_tax.loadgen.schedule.sides import Copies, Side
from connector_tax.loadgen.schedule.sizing import Sizing
from connector_tax.loadgen.schedule.trace import prefix_blocks, trace_arrivals
from connector_tax.loadgen.schedule.workers import WorkerPool
from connector_tax.loadgen.stats.collect import Collector, Progress
from connector_tax.loadgen.stats.request_file import RecordWriter, RequestRecord, read_records
from connector_tax.loadgen.stats.summarize import RequestStats
from connector_tax.loadgen.stats.usage import shape_rule
from connector_tax.loadgen.worker.prompts import BodySettings, prompt_key
from connector_tax.loadgen.worker.timing import set_timer_slack

START_LEAD_NS = 20_000_000  # let the first wait begin from a settled state
_RUNS = itertools.count(1)  # cell runs in this process: a cell id is unique even when a label repeats


@dataclass(frozen=True)
class Session:
    """What a cell's run uses of the session that runs many cells (session.LoadGenerator)."""

    options: LoadgenOptions
    pool: WorkerPool
    progresses: Sequence[Progress]  # one per target
    stop_event: Event
    cpu_latency: CpuLatencyHold
    body: BodySettings | None = None  # what the workers send (None: token ids, as the options say)
    sizing: Sizing | None = None  # how text prompts were sized on this server


class RealTimeRun:
    def __init__(
        self,
        session: Session,
        cell: Cell,
        out_dirs: Sequence[Path],
        enough: Callable[[], bool] | None,
        give_up: Callable[[], bool] | None,
    ) -> None:
        """`out_dirs`: one folder per target of the session, target 0 first."""
        self.gen = session
        self.enough, self.give_up = enough, give_up
        self.opts = session.options
        self.cell = cell
        self.name = f"{cell.phase}_{cell.label}"
        # The study contract names each target's files, alike in each folder.
        self.files = [CellFiles(Path(d), cell.phase, cell.label) for d in out_dirs]
        self.cell_id = f"{self.name}#{next(_RUNS)}"
        self.gate: ConcurrencyGate | None = None
        self.copies: Copies | None = None
        self.sides: list[Side] = []
        self.events: list[tuple[int, str]] = []
        self.send_ahead_ns = int(self.opts.send_ahead_us * 1000)
        self.unissued = 0  # due before the cell's end, never sent: the generator fell behind
        self._behind_from: int | None = None
        # A study cell's traffic seed (config.cells.traffic_seed), else the session's.
        self.seed = cell.seed if cell.seed is not None else self.opts.seed

    # -- issuing (session thread) -----------------------------------------------------
    def run(self) -> list[CellSummary]:
        """The cell's summary for each target, target 0 first."""
        pool = self.gen.pool
        sends_text = self.gen.body is not None and self.gen.body.sends_text
        rule = shape_rule(sends_text, self.opts.ignore_eos, self.opts.validity.max_prompt_token_error)
        base_ns = time.monotonic_ns()
        for t, (files, progress) in enumerate(zip(self.files, self.gen.progresses, strict=True)):
            writer = RecordWriter(files.requests)
            stats = RequestStats(base_ns, self.opts.summary_exact_cap, rule)
            collector = Collector(self.cell_id, writer, stats, progress, t)
            self.sides.append(Side(t, files, pool.workers_of(t), writer, stats, collector, progress))
        self.collectors = [side.collector for side in self.sides]
        chunk_paths = [
            str(self.sides[pool.target_of(k)].files.chunks(k)) if self.opts.chunk_log else None
            for k in range(pool.n_workers)
        ]
        pool.set_cell(chunk_paths)
        self.receive_errors_before = pool.receive_errors
        pool.set_handler(self.on_message)
        set_timer_slack()  # this thread's sleeps wake closer to their times
        cpu0, wall0 = pool.cpu_seconds(), time.monotonic()
        t0 = time.monotonic_ns() + START_LEAD_NS
        self.rules = CellRules(self.cell, self.opts, t0, self.enough, self.give_up)
        interrupted = None
        self.t_issue_end = t0
        with raised(self.opts.rt_priority) as priority:  # this thread sends: punctual on a full host
            try:
                self.events.append((t0, "TEST_STARTED"))
                self._issue_all(t0)
            except KeyboardInterrupt:
                interrupted = "interrupted"
            self.t_issue_end = time.monotonic_ns()
            self.events.append((self.t_issue_end, "LOADGEN_STOP"))
            try:
                self._drain(short=interrupted is not None or self.gen.stop_event.is_set())
            except KeyboardInterrupt:
                interrupted = "interrupted"
                self._drain(short=True)
        self.events.append((time.monotonic_ns(), "TEST_ENDED"))
        if self._behind_from is not None:
            self.unissued = self._count_unissued(t0, self._behind_from)
        if self.opts.chunk_log:
            pool.set_cell([None] * pool.n_workers)  # workers close (flush) the cell's side files
        pool.set_handler(None)
        for side in self.sides:
            side.writer.close()
        wall = max(time.monotonic() - wall0, 1e-9)
        cpu1 = pool.cpu_seconds()
        cpu_frac = {k: (cpu1[k] - cpu0.get(k, 0.0)) / wall for k in cpu1}
        stopped = interrupted or ("stopped" if self.gen.stop_event.is_set() else None)
        summaries = [self._summary(side, wall, cpu_frac, priority, stopped) for side in self.sides]
        if interrupted:
            raise KeyboardInterrupt
        return summaries

    def _summary(
        self, side: Side, wall: float, cpu_frac: dict[str, float], priority: PriorityState, stopped: str | None
    ) -> CellSummary:
        """A target's summary, written to its folder: its own records and workers, the cell's
        course (the same for every target)."""
        pool = self.gen.pool
        mine = {"main", *(f"worker{k}" for k in side.workers)}
        overrun_ms = max(0, self.t_issue_end - self.rules.planned_end) / 1e6
        summary = side.stats.summary(
            self.cell.describe(),
            self.rules.warm_end,
            self.t_issue_end,
            {name: frac for name, frac in cpu_frac.items() if name in mine},
            self.opts.validity,
            unissued=self.unissued,
            overrun_ms=overrun_ms,
        )
        if self.gen.sizing is not None and summary.usage is not None:
            summary.usage.sizing = self.gen.sizing.describe()
        summary.cell_id = self.cell_id
        summary.wall_s = round(wall, 3)
        summary.drain_budget_s = round(self.rules.drain_budget_s(), 3)
        summary.cpu_latency = self.gen.cpu_latency.state.describe()
        summary.rt_priority = RtPriority(
            priority.requested, priority.applied, priority.why, workers=[pool.worker_priority[k] for k in side.workers]
        )
        summary.extended = self.rules.extended(self.t_issue_end)
        summary.summary_state_bytes = side.stats.nbytes()
        if not set(side.workers) <= pool.live_workers():
            summary.validity.invalidate("load generator worker died")
        receive_errors = pool.receive_errors - self.receive_errors_before
        if receive_errors:  # their requests were recorded as errors by the drain ("no result from worker")
            summary.validity.invalidate(
                f"{receive_errors} worker messages could not be handled (first: {pool.first_receive_errors[0]})"
            )
        if stopped:
            summary.validity.invalidate(f"cell {stopped} before its end")
        summary.complete = stopped is None
        write_summary(side.files.summary, summary)
        if self.opts.events_log:
            self._write_events(side.files)
        return summary

    def _schedule(self, t0: int) -> Iterator[tuple[int, ipc.RequestSpec]]:
        """(scheduled time, spec) pairs; a time of -1 means "as soon as the gate allows"."""
        cell = self.cell
        seed = self.seed
        if cell.arrival == "trace":
            trace = self.rules.trace()
            for (i, req), offset in zip(enumerate(trace), trace_arrivals(list(trace), cell.time_scale)):
                blocks = tuple(prefix_blocks(req))
                yield t0 + offset, self._spec(i, req.input_length, req.output_length, blocks)
            return
        shapes = ShapeSampler(cell.shape, shape_seed(seed) if cell.seed is not None else seed)
        if cell.arrival == "concurrency":
            offsets: Iterator[int] = itertools.repeat(-1)
        else:
            offsets = arrivals(cell.arrival, cell.rate, seed, cell.gamma_shape, cell.num_requests)
        for i, offset in enumerate(offsets):
            pair = shapes.next()
            yield (t0 + offset if offset >= 0 else -1), self._spec(i, pair.input, pair.output)

    def _spec(self, index: int, input_len: int, output_len: int, blocks: Any = None) -> ipc.RequestSpec:
        self.rules.issued(output_len)
        key = prompt_key(self.cell.seed, index, self.cell.attempt) if self.cell.seed is not None else ""
        return ipc.RequestSpec(index, f"{self.name}-{index}", input_len, output_len, blocks, self.cell_id, key)

    def _issue_all(self, t0: int) -> None:
        cell = self.cell
        stop = self.gen.stop_event
        if cell.arrival == "concurrency":
            self.gate = ConcurrencyGate(cell.concurrency or 1, cell.rampup_s)
            self.gate.start(t0)
            self.copies = Copies(len(self.sides), self.gate.release)
            for collector in self.collectors:
                collector.on_done = self.copies.ended
        schedule = self._schedule(t0)
        for t_sched, spec in schedule:
            if stop.is_set():
                return
            if self.gate is not None:
                while not self.gate.acquire(timeout_s=0.05):
                    if stop.is_set() or self._done(time.monotonic_ns()):
                        return
                t_sched = time.monotonic_ns()
            if self._done(t_sched):
                if self.gate is not None:
                    self.gate.release()
                return
            # The wall clock ends the cell too: a rate the generator cannot issue must not run
            # past the planned end. What was due and never sent is counted, not silently lost.
            if self.gate is None and self._done(time.monotonic_ns()):
                self._behind_from = spec.index  # counted after the drain: counting takes time
                return
            if t_sched > 0:
                self._wait(t_sched - self.send_ahead_ns)
            self._issue(t_sched, spec)

    def _count_unissued(self, t0: int, first: int) -> int:
        """Schedule entries from `first` on that were due before the cell's end."""
        cell = self.cell
        if cell.arrival == "trace":
            offsets: Iterator[int] = trace_arrivals(list(self.rules.trace()), cell.time_scale)
        else:
            offsets = arrivals(cell.arrival, cell.rate, self.seed, cell.gamma_shape, cell.num_requests)
        n = 0
        for offset in itertools.islice(offsets, first, None):
            if self._done(t0 + offset):
                break
            n += 1
        return n

    def _done(self, t: int) -> bool:
        # min-completed is the cell's: met when every target has met it.
        return self.rules.done(t, min(c.completed_post for c in self.collectors))

    def _wait(self, until_ns: int) -> None:
        """Sleep to a request's send-ahead time. No spin: the worker fires it on the dot, and
        the send-ahead lead absorbs this sleep's wake-up jitter (~0.1 ms)."""
        remaining = until_ns - time.monotonic_ns()
        if remaining > 0:
            self.gen.stop_event.wait(remaining / 1e9)

    def _issue(self, t_sched: int, spec: ipc.RequestSpec) -> None:
        """Hand the request to every target's worker, the same spec and time to each."""
        warmup = self.rules.warmup(t_sched)
        if self.copies is not None:
            self.copies.issued(spec.index)
        for side in self.sides:
            self._issue_to(side, t_sched, spec, warmup)

    def _issue_to(self, side: Side, t_sched: int, spec: ipc.RequestSpec, warmup: bool) -> None:
        workers = side.workers
        worker = workers[spec.index % len(workers)]
        collector = side.collector
        in_flight = collector.issue(t_sched, spec, worker, warmup, self.rules.admits)  # this target's cap
        side.progress.issued += 1
        if in_flight is None:
            side.progress.dropped += 1
            if self.copies is not None:
                self.copies.ended(spec.index)
            collector.record(
                self._failed(spec, t_sched, self.opts.inflight_cap, warmup, "dropped", "in-flight cap reached", None)
            )
            return
        if not self.gen.pool.fire(worker, spec, t_sched):  # the worker died: the request is lost
            collector.forget(spec.index)
            side.progress.errors += 1
            if self.copies is not None:
                self.copies.ended(spec.index)
            collector.record(
                self._failed(
                    spec, t_sched, in_flight, warmup, "error", f"load generator worker died (worker {worker})", worker
                )
            )

    def _failed(
        self,
        spec: ipc.RequestSpec,
        t_sched: int,
        in_flight: int,
        warmup: bool,
        status: str,
        error: str,
        worker: int | None,
    ) -> RequestRecord:
        return RequestRecord(
            spec.request_id,
            t_sched,
            None,
            None,
            None,
            None,
            None,
            in_flight,
            warmup,
            status,
            error,
            spec.input_len,
            spec.output_len,
            worker=worker,
            cell=self.cell_id,
        )

    # -- results (receiver thread) ----------------------------------------------------
    def on_message(self, message: ipc.ToMain) -> None:
        if type(message) is ipc.Result:
            res = message.result
            # A target no side has goes to target 0's, which records it unmatched.
            side = self.sides[res.target] if 0 <= res.target < len(self.sides) else self.sides[0]
            side.collector.on_result(res)

    # -- drain ------------------------------------------------------------------------
    def _drain(self, short: bool) -> None:
        """Wait for what is in flight, at most drain_timeout_s in all (2 s after a stop):
        cancel what is left a little before that, so the cell ends by then."""
        live = self.gen.pool.live_workers

        def awaiting() -> bool:
            alive = live()
            return any(c.awaiting(alive) for c in self.collectors)

        total = 2.0 if short else self.rules.drain_budget_s()
        grace = min(3.0, total / 4)
        start = time.monotonic()
        while awaiting() and time.monotonic() < start + total - grace:
            time.sleep(0.005)
        if awaiting():
            self.gen.pool.broadcast(ipc.CancelAll(f"drain timeout after {total:g} s"))
            while awaiting() and time.monotonic() < start + total:
                time.sleep(0.005)
        alive = live()
        for collector in self.collectors:
            for p in collector.take_pending().values():
                why = "no result from worker" if p.worker in alive else "load generator worker died"
                collector.record(
                    self._failed(
                        p.spec, p.t_sched, p.in_flight, p.warmup, "error", f"{why} (worker {p.worker})", p.worker
                    )
                )
        if self.gate is not None:
            self.gate.close()

    def _write_events(self, files: CellFiles) -> None:
        """The session's events (LOADGEN_ISSUE_CALLED, FIRST_CHUNK, ...), derived from a target's
        records file after the cell: nothing on the hot path. This one reads every record back
        (memory in proportion to the cell: opt-in)."""
        events = list(self.events)
        for r in read_records(files.requests):
            rid = r.request_id
            events.append((r.t_scheduled_ns, f"LOADGEN_ISSUE_CALLED {rid}"))
            if r.t_send_ns:
                events.append((r.t_send_ns, f"HTTP_REQUEST_ISSUED {rid}"))
            if r.t_first_token_ns:
                events.append((r.t_first_token_ns, f"FIRST_CHUNK {rid}"))
            if r.t_last_token_ns:
                events.append((r.t_last_token_ns, f"COMPLETE {rid} {r.status}"))
            elif r.status != "ok":
                events.append((r.t_scheduled_ns, f"COMPLETE {rid} {r.status}"))
        events.append((self.rules.warm_end, "STOP_WARMUP"))
        with open(files.events, "w", encoding="utf-8") as f:
            for t_ns, text in sorted(events):
                name, *rest = text.split(" ", 1)
                f.write(json.dumps({"t_ns": t_ns, "event": name, "detail": rest[0] if rest else None}) + "\n")
