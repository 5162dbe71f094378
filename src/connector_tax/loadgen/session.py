"""A benchmark session: one worker pool, many cells in a row (a rate sweep or a shape sweep).

A cell runs on the calling thread (the session thread): it walks the arrival schedule,
sleeps to each request's send-ahead time and issues without blocking (the worker fires it
on the dot); results come back on the pool's receiver thread, which writes each record as
it completes. Cell control
follows the design: warm-up (issued, recorded, excluded), a duration floor, extension until
enough post-warm-up requests completed (bounded by max_duration_s), an in-flight cap whose
excess is recorded as dropped, and a drain that waits, then cancels what is left.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from connector_tax.atomic import write_json
from connector_tax.loadgen import ipc
from connector_tax.loadgen.cpu_latency import CpuLatencyHold
from connector_tax.loadgen.prompts import BodySettings
from connector_tax.loadgen.records import RecordWriter, RequestRecord
from connector_tax.loadgen.schedulers import ConcurrencyGate, arrivals
from connector_tax.loadgen.shapes import ShapeSampler
from connector_tax.loadgen.stats import ValidityThresholds, summarize
from connector_tax.loadgen.timing import set_timer_slack
from connector_tax.loadgen.trace import TraceRequest, prefix_blocks, trace_arrivals
from connector_tax.loadgen.workers import WorkerPool

START_LEAD_NS = 20_000_000  # let the first wait begin from a settled state


@dataclass(frozen=True)
class CellSpec:
    phase: str
    label: str
    arrival: str = "poisson"  # poisson | gamma | fixed | max | concurrency | trace
    rate: float | None = None
    gamma_shape: float = 1.0
    shape: dict[str, Any] = field(default_factory=lambda: {"input": 1024, "output": 128})
    concurrency: int | None = None
    rampup_s: float = 0.0
    num_requests: int | None = None  # max-throughput count, or a cap on a trace
    trace: tuple[TraceRequest, ...] | None = None
    time_scale: float = 1.0
    warmup_s: float = 0.0
    duration_s: float = 60.0
    min_completed: int = 0
    max_duration_s: float | None = None  # hard end of the extension (default 10x duration + 60 s)

    def describe(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "cell": self.label, "arrival": self.arrival, "rate": self.rate,
            "gamma_shape": self.gamma_shape if self.arrival == "gamma" else None,
            "shape": self.shape if self.trace is None else "trace", "concurrency": self.concurrency,
            "rampup_s": self.rampup_s, "warmup_s": self.warmup_s, "duration_s": self.duration_s,
            "min_completed": self.min_completed, "max_duration_s": self._max_duration(),
        }  # fmt: skip

    def _max_duration(self) -> float:
        return self.max_duration_s if self.max_duration_s is not None else 10 * self.duration_s + 60


@dataclass(frozen=True)
class LoadgenOptions:
    url: str
    model: str
    endpoint: str = "completions"
    prompt: str = "token_ids"
    temperature: float = 0.0
    ignore_eos: bool = True
    workers: int = 1
    inflight_cap: int = 256
    timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    # Requests leave for their worker this early; the worker fires them at their time. Must
    # exceed the hand-over's worst case: IPC p99 is ~0.5 ms here, but the session thread and
    # the ZMQ I/O threads share a core with the server, and 2 ms left ~1 % of requests late at
    # 100 req/s. It costs a request held a little longer in the worker's timer heap.
    send_ahead_us: float = 10_000.0
    # The worker wakes up to spin_us before a request's time and spins the rest, which absorbs
    # the wake-up latency (up to ~1 ms at the tail on a virtual CPU); spin_share caps that spin
    # at this share of the mean time between the worker's requests (floor 200 µs), so it costs
    # ~10 % of a core at 100 req/s instead of all of it at 1,000 req/s.
    spin_us: float = 1000.0
    spin_share: float = 0.1
    seed: int = 0
    affinity: bool = True
    # PM QoS limit on CPU wake-up latency held while the generator runs (cpu_latency.py): 0 keeps
    # idle CPUs polling, so neither a send nor the worker's timer waits for a halted CPU; None
    # leaves the machine's setting alone.
    cpu_latency_us: int | None = 0
    chunk_log: bool = False
    events_log: bool = False
    validity: ValidityThresholds = field(default_factory=ValidityThresholds)


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


class LoadGenerator:
    def __init__(self, options: LoadgenOptions) -> None:
        self.options = options
        body = BodySettings(
            model=options.model,
            endpoint=options.endpoint,
            prompt=options.prompt,
            temperature=options.temperature,
            ignore_eos=options.ignore_eos,
        )
        self.pool = WorkerPool(
            url=options.url,
            body=body,
            n_workers=options.workers,
            seed=options.seed,
            timeout_s=options.timeout_s,
            max_connections=max(options.inflight_cap, options.workers),
            spin_ns=int(options.spin_us * 1000),
            spin_share=options.spin_share,
            affinity=options.affinity,
        )
        self.cpu_latency = CpuLatencyHold(options.cpu_latency_us)
        self.stop_event = threading.Event()
        self.progress = Progress()

    def __enter__(self) -> LoadGenerator:
        self.cpu_latency.acquire()
        try:
            self.pool.start()
        except BaseException:
            self.cpu_latency.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.pool.close()
        finally:
            self.cpu_latency.release()

    def stop(self) -> None:
        """Ask the running cell to stop issuing and drain (from any thread)."""
        self.stop_event.set()

    def run_cell(self, cell: CellSpec, out_dir: Path) -> dict[str, Any]:
        self.stop_event.clear()
        self.progress = Progress()
        return _CellRun(self, cell, Path(out_dir)).run()


class _CellRun:
    def __init__(self, gen: LoadGenerator, cell: CellSpec, out_dir: Path) -> None:
        self.gen = gen
        self.opts = gen.options
        self.cell = cell
        self.out_dir = out_dir
        self.name = f"{cell.phase}_{cell.label}"
        self.lock = threading.Lock()
        # index -> (target, in flight at issue, warmup, spec, worker, issued at)
        self.pending: dict[int, tuple[int, int, bool, ipc.RequestSpec, int, int]] = {}
        # When each result arrived (the receiver's clock only moves forward: sorted), so that a
        # request's in-flight count at issue can drop those that finished before it was sent.
        self.finished_ns = array("q")
        self.records: list[RequestRecord] = []
        self.itl: list[np.ndarray] = []
        self.completed_post = 0
        self.gate: ConcurrencyGate | None = None
        self.events: list[tuple[int, str]] = []
        self.progress = gen.progress
        self.send_ahead_ns = int(self.opts.send_ahead_us * 1000)

    # -- issuing (session thread) -----------------------------------------------------
    def run(self) -> dict[str, Any]:
        pool = self.gen.pool
        self.writer = RecordWriter(self.out_dir / f"requests_{self.name}.jsonl")
        chunk_paths = [
            str(self.out_dir / f"chunks_{self.name}_w{k}.jsonl") if self.opts.chunk_log else None
            for k in range(pool.n_workers)
        ]
        pool.set_cell(chunk_paths)
        pool.set_handler(self.on_message)
        set_timer_slack()  # this thread's sleeps wake closer to their targets
        cpu0, wall0 = pool.cpu_seconds(), time.monotonic()
        t0 = time.monotonic_ns() + START_LEAD_NS
        self.t_warm_end = t0 + int(self.cell.warmup_s * 1e9)
        interrupted = None
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
        if self.opts.chunk_log:
            pool.set_cell([None] * pool.n_workers)  # workers close (flush) the cell's side files
        pool.set_handler(None)
        self.writer.close()
        wall = max(time.monotonic() - wall0, 1e-9)
        cpu1 = pool.cpu_seconds()
        cpu_frac = {k: (cpu1[k] - cpu0.get(k, 0.0)) / wall for k in cpu1}
        summary = summarize(
            self.cell.describe(), sorted(self.records, key=lambda r: r.t_scheduled_ns), self.itl,
            self.t_warm_end, self.t_issue_end, cpu_frac, self.opts.validity,
        )  # fmt: skip
        summary["wall_s"] = round(wall, 3)
        summary["cpu_latency"] = self.gen.cpu_latency.state.describe()
        summary["extended"] = self.t_issue_end > self.t_warm_end + int(self.cell.duration_s * 1e9) + 100_000_000
        if not pool.alive():
            summary["validity"]["valid"] = False
            summary["validity"]["reasons"].append("load generator worker died")
        stopped = interrupted or ("stopped" if self.gen.stop_event.is_set() else None)
        if stopped:
            summary["validity"]["valid"] = False
            summary["validity"]["reasons"].append(f"cell {stopped} before its end")
        summary["complete"] = stopped is None
        write_json(self.out_dir / f"summary_{self.name}.json", summary)
        if self.opts.events_log:
            self._write_events()
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _schedule(self, t0: int) -> Iterator[tuple[int, ipc.RequestSpec | None]]:
        """(target time, spec) pairs; a target of -1 means "as soon as the gate allows"."""
        cell = self.cell
        seed = self.opts.seed
        if cell.arrival == "trace":
            assert cell.trace is not None
            trace = cell.trace[: cell.num_requests] if cell.num_requests else cell.trace
            for (i, req), offset in zip(enumerate(trace), trace_arrivals(list(trace), cell.time_scale)):
                blocks = tuple(prefix_blocks(req))
                yield t0 + offset, ipc.RequestSpec(i, self._rid(i), req.input_length, req.output_length, blocks)
            return
        shapes = ShapeSampler(cell.shape, seed)
        if cell.arrival == "concurrency":
            offsets: Iterator[int] = itertools.repeat(-1)
        else:
            offsets = arrivals(cell.arrival, cell.rate, seed, cell.gamma_shape, cell.num_requests)
        for i, offset in enumerate(offsets):
            pair = shapes.next()
            yield (t0 + offset if offset >= 0 else -1), ipc.RequestSpec(i, self._rid(i), pair.input, pair.output)

    def _rid(self, index: int) -> str:
        return f"{self.name}-{index}"

    def _issue_all(self, t0: int) -> None:
        cell = self.cell
        stop = self.gen.stop_event
        issue_end = self.t_warm_end + int(cell.duration_s * 1e9)
        hard_end = self.t_warm_end + int(cell._max_duration() * 1e9)
        if cell.arrival == "trace":
            issue_end = hard_end = 2**62  # a trace ends when it runs out
        if cell.arrival == "concurrency":
            self.gate = ConcurrencyGate(cell.concurrency or 1, cell.rampup_s)
            self.gate.start(t0)
        for target, spec in self._schedule(t0):
            if stop.is_set():
                return
            if self.gate is not None:
                while not self.gate.acquire(timeout_s=0.05):
                    if stop.is_set() or self._done(time.monotonic_ns(), issue_end, hard_end):
                        return
                target = time.monotonic_ns()
            if self._done(target, issue_end, hard_end):
                if self.gate is not None:
                    self.gate.release()
                return
            if target > 0:
                self._wait(target - self.send_ahead_ns)
            self._issue(target, spec)

    def _done(self, t: int, issue_end: int, hard_end: int) -> bool:
        if t < issue_end:
            return False
        return self.completed_post >= self.cell.min_completed or t >= hard_end

    def _wait(self, target: int) -> None:
        """Sleep to a request's send-ahead time. No spin: the worker fires it on the dot, and
        the send-ahead lead absorbs this sleep's wake-up jitter (~0.1 ms)."""
        remaining = target - time.monotonic_ns()
        if remaining > 0:
            self.gen.stop_event.wait(remaining / 1e9)

    def _issue(self, target: int, spec: ipc.RequestSpec) -> None:
        warmup = target < self.t_warm_end
        pool = self.gen.pool
        with self.lock:
            in_flight = len(self.pending)
            drop = in_flight >= self.opts.inflight_cap
            if not drop:
                worker = spec.index % pool.n_workers
                self.pending[spec.index] = (target, in_flight, warmup, spec, worker, time.monotonic_ns())
        self.progress.issued += 1
        if drop:
            self.progress.dropped += 1
            if self.gate is not None:
                self.gate.release()
            self._record(RequestRecord(spec.request_id, target, None, None, None, None, None, in_flight, warmup,
                                       "dropped", "in-flight cap reached", spec.input_len, spec.output_len))  # fmt: skip
            return
        if not pool.fire(worker, spec, target):  # the worker died: the request is lost
            with self.lock:
                self.pending.pop(spec.index, None)
            self.progress.errors += 1
            if self.gate is not None:
                self.gate.release()
            self._record(RequestRecord(spec.request_id, target, None, None, None, None, None, in_flight, warmup,
                                       "error", f"load generator worker died (worker {worker})",
                                       spec.input_len, spec.output_len, worker=worker))  # fmt: skip
            return
        self.progress.in_flight = in_flight + 1

    # -- results (receiver thread) ----------------------------------------------------
    def on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] != ipc.RESULT:
            return
        res: ipc.RequestResult = message[1]
        with self.lock:
            entry = self.pending.pop(res.index, None)
            self.progress.in_flight = len(self.pending)
        if entry is None:
            return
        self.finished_ns.append(time.monotonic_ns())
        target, in_flight, warmup, spec, _, issued = entry
        # Counted when issued, send_ahead_us before its time; those that finished in between
        # were no longer in flight when it was sent. Later issues have later targets, so
        # nothing else needs correcting.
        finished = self.finished_ns
        in_flight -= bisect_right(finished, target) - bisect_right(finished, issued)
        record = RequestRecord(
            spec.request_id, target, res.t_send_ns, res.t_first_token_ns, res.t_last_token_ns,
            res.prompt_tokens if res.prompt_tokens is not None else spec.input_len,
            res.completion_tokens, max(0, in_flight), warmup, res.status, res.error,
            spec.input_len, spec.output_len, res.chunks, res.http_status, res.worker,
        )  # fmt: skip
        if res.status == "ok":
            self.progress.completed += 1
            if not warmup:
                self.completed_post += 1
                self.itl.append(np.frombuffer(res.itl_us, dtype=np.uint32))
            if res.t_first_token_ns and res.t_send_ns:
                self.progress.recent_ttft_ms.append((res.t_first_token_ns - res.t_send_ns) / 1e6)
        else:
            self.progress.errors += 1
        if self.gate is not None:
            self.gate.release()
        self._record(record)

    def _record(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.writer.write(record)

    # -- drain ------------------------------------------------------------------------
    def _drain(self, short: bool) -> None:
        deadline = time.monotonic() + (2.0 if short else self.opts.drain_timeout_s)
        while self._awaiting() and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._awaiting():
            self.gen.pool.broadcast((ipc.CANCEL_ALL, f"drain timeout after {self.opts.drain_timeout_s:g} s"))
            deadline = time.monotonic() + 3.0
            while self._awaiting() and time.monotonic() < deadline:
                time.sleep(0.005)
        with self.lock:
            lost, self.pending = self.pending, {}
        live = self.gen.pool.live_workers()
        for target, in_flight, warmup, spec, worker, _ in lost.values():
            why = "no result from worker" if worker in live else "load generator worker died"
            self._record(RequestRecord(spec.request_id, target, None, None, None, None, None, in_flight, warmup,
                                       "error", f"{why} (worker {worker})", spec.input_len, spec.output_len,
                                       worker=worker))  # fmt: skip
        if self.gate is not None:
            self.gate.close()

    def _awaiting(self) -> bool:
        """Requests in flight on a live worker (a dead worker's will never answer)."""
        live = self.gen.pool.live_workers()
        with self.lock:
            return any(entry[4] in live for entry in self.pending.values())

    def _write_events(self) -> None:
        """Seed 001's events, derived from the records after the cell: nothing on the hot path."""
        events = list(self.events)
        for r in self.records:
            events.append((r.t_scheduled_ns, f"LOADGEN_ISSUE_CALLED {r.request_id}"))
            if r.t_send_ns:
                events.append((r.t_send_ns, f"HTTP_REQUEST_ISSUED {r.request_id}"))
            if r.t_first_token_ns:
                events.append((r.t_first_token_ns, f"FIRST_CHUNK {r.request_id}"))
            if r.t_last_token_ns:
                events.append((r.t_last_token_ns, f"COMPLETE {r.request_id} {r.status}"))
            elif r.status != "ok":
                events.append((r.t_scheduled_ns, f"COMPLETE {r.request_id} {r.status}"))
        events.append((self.t_warm_end, "STOP_WARMUP"))
        with open(self.out_dir / f"events_{self.name}.jsonl", "w", encoding="utf-8") as f:
            for t_ns, text in sorted(events):
                name, *rest = text.split(" ", 1)
                f.write(json.dumps({"t_ns": t_ns, "event": name, "detail": rest[0] if rest else None}) + "\n")

