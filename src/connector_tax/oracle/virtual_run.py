"""One study cell in the simulator's virtual time (`sim.clock: virtual`): the load generator's
schedule and cell rules driving the simulated engine, leaving the records a real cell leaves.

A real simulated cell sleeps through its seconds; this one computes them. Everything that
decides what a cell measures is the real cell's: the arrival offsets, shapes and prompts' token
ids come from the load generator's own generators with the cell's traffic seed (loadgen.schedule.schedulers,
loadgen.schedule.shapes, loadgen.worker.prompts; config.cells.traffic_seed), so every variant and both clocks
send the same requests in the same cell and replicate (common random numbers); the
cell's course is the load generator's own rules (loadgen.schedule.rules.CellRules: warm-up, floor,
min-completed, the caller's `enough` and `give_up`, the cap, the in-flight cap, the drain
budget), asking `enough` once a virtual second as the pipeline's precision watch recomputes once
a second; the scrapes land in the caller's `waiting` list as a metrics sampler's do (the overload
guard reads them); the summary is the load generator's own (loadgen.stats.summarize.RequestStats). The engine
is the one `ctax sim` serves with (settings.resolve), stepped in virtual time (sim/virtual.py's
convention: a token is stamped at the end of the step that produced it).

What it leaves out is what a real run adds: HTTP, the client's and the server's CPU time, send
lateness (t_send = t_scheduled), scheduling noise. Every record says `clock: virtual`, and the
study's outputs say "simulated vLLM (ctax sim, virtual time)".
"""

from __future__ import annotations

import functools
import heapq
import json
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from connector_tax.config.cells import Cell
from connector_tax.contract.layout import CellFiles
from connector_tax.contract.records import encode_line
from connector_tax.contract.summary import CellSummary, write_summary
from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.loadgen.schedule.rules import CellRules
from connector_tax.loadgen.schedule.schedulers import arrivals
from connector_tax.loadgen.schedule.shapes import ShapeSampler, shape_seed
from connector_tax.loadgen.stats.request_file import RecordWriter, RequestRecord
from connector_tax.loadgen.stats.summarize import RequestStats
from connector_tax.loadgen.stats.usage import shape_rule
from connector_tax.loadgen.worker.prompts import BodyBuilder, BodySettings, prompt_key
from connector_tax.sim.apidelay import ApiDelays
from connector_tax.sim.engine import EngineCore, SimRequest, StepResult
from connector_tax.sim.metrics import cache_config_labels
from connector_tax.sim.settings import SimSettings
from connector_tax.sim.steplog import step_record
from connector_tax.sim.tokens import natural_length

_NS = 1_000_000_000
CHECK_S = 1.0  # `enough` is asked this often (virtual seconds), as the precision watch recomputes


@functools.lru_cache(maxsize=2)
def _prompts(seed: int) -> BodyBuilder:
    """The load generator's prompt builder for a session seed (its token pool takes ~0.2 s)."""
    return BodyBuilder(BodySettings(model=""), seed)


@dataclass
class _InFlight:
    record: RequestRecord
    request: SimRequest
    egress_first_ns: int = 0  # what the API server adds to the first token, and to the others
    egress_ns: int = 0


class VirtualTimeRun:
    """One cell from `t0_ns` (the base of its clock: give a monotonic reading, so its times
    sort with real ones); `VirtualTimeRun(...).run()`."""

    def __init__(
        self,
        settings: SimSettings,
        cell: Cell,
        opts: LoadgenOptions,
        files: CellFiles,
        t0_ns: int,
        enough: Callable[[], bool],
        give_up: Callable[[], bool],
        waiting: list[tuple[float, float]],
        metrics_interval_s: float,
    ) -> None:
        files.folder.mkdir(parents=True, exist_ok=True)
        self.cell, self.opts, self.files = cell, opts, files
        self.waiting = waiting
        self.core = EngineCore(settings.engine, settings.cost_model)
        self.t0 = t0_ns
        self.now = self.t0
        self.rules = CellRules(cell, opts, t0_ns, enough, give_up, ask_every_ns=int(CHECK_S * _NS))
        self.name = f"{cell.phase}_{cell.label}"
        self.writer = RecordWriter(files.requests)
        # Token ids always (the engine is handed them): exact prompts; outputs by ignore_eos.
        rule = shape_rule(False, opts.ignore_eos, opts.validity.max_prompt_token_error)
        self.stats = RequestStats(self.t0, opts.summary_exact_cap, rule)
        self.in_flight: OrderedDict[int, _InFlight] = OrderedDict()  # send order: the oldest times out first
        self.by_request: dict[int, int] = {}  # id(SimRequest) -> index
        self.completed_post = 0
        self.interval_ns = int(metrics_interval_s * _NS)
        self.next_sample = self.t0
        # A calibrated profile's API server: a request reaches the engine `ingress` after its send
        # (heap of (time, index, request) on its way), its tokens the client `egress` after their step.
        self.api = ApiDelays(settings.api, opts.seed ^ zlib.crc32(cell.key.encode()))
        self.on_the_way: list[tuple[int, int, SimRequest]] = []
        self.steps: IO[bytes] = open(files.engine_step, "wb")
        self.metrics: IO[str] = open(files.metrics, "w", encoding="utf-8")
        self.tokens = {"prompt": 0, "generation": 0}
        labels = ",".join(f'{k}="{v}"' for k, v in cache_config_labels(self.core).items())
        self.cache_info = f"vllm:cache_config_info{{{labels}}}"

    def issue(self, index: int, target: int, input_len: int, output_len: int) -> None:
        warmup = self.rules.warmup(target)
        self.rules.issued(output_len)
        record = RequestRecord(
            request_id=f"{self.name}-{index}",
            t_scheduled_ns=target,
            t_send_ns=None,
            t_first_token_ns=None,
            t_last_token_ns=None,
            prompt_tokens=None,
            completion_tokens=None,
            inflight_at_send=len(self.in_flight),
            warmup=warmup,
            status="dropped",
            error=None,
            input_len=input_len,
            output_len=output_len,
            worker=0,
            cell=f"{self.name}#virtual",
        )
        if not self.rules.admits(len(self.in_flight)):
            record.error = "in-flight cap reached"
            self.finish(record)
            return
        key = prompt_key(self.cell.seed, index, self.cell.attempt) if self.cell.seed is not None else record.request_id
        ids = _prompts(self.opts.seed).token_id_list(key, input_len)
        tokens = output_len if self.opts.ignore_eos else natural_length(ids, output_len)
        request = SimRequest(record.request_id, ids, output_len, tokens)
        record.t_send_ns, record.status = target, "ok"
        ingress, egress_first, egress = self.api.draw(index)
        self.in_flight[index] = _InFlight(record, request, int(egress_first * 1000), int(egress * 1000))
        self.by_request[id(request)] = index
        if ingress <= 0:
            self.core.add_request(request)
        else:
            heapq.heappush(self.on_the_way, (target + int(ingress * 1000), index, request))

    def arrive(self) -> None:
        """The requests whose ingress has elapsed by `now` reach the engine's queue."""
        while self.on_the_way and self.on_the_way[0][0] <= self.now:
            _, index, request = heapq.heappop(self.on_the_way)
            if index in self.in_flight:  # not timed out on the way
                self.core.add_request(request)

    def next_arrival(self) -> int | None:
        return self.on_the_way[0][0] if self.on_the_way else None

    def work_until(self, t: int) -> None:
        """Run the engine up to `t` (a step that starts before `t` may end after it), idling
        until the next request on its way reaches the engine when there is nothing to do."""
        while self.now < t:
            if self.step():
                continue
            arrival = self.next_arrival()
            if arrival is None or arrival >= t:
                return
            self.advance_idle(arrival)

    def finish(self, record: RequestRecord) -> None:
        if record.status == "ok" and not record.warmup:
            self.completed_post += 1
        self.stats.add(record)
        self.writer.write(record)

    def end_request(self, index: int, status: str, error: str | None) -> None:
        entry = self.in_flight.pop(index)
        self.by_request.pop(id(entry.request), None)
        if status != "ok":
            self.core.abort_request(entry.request)
        record = entry.record
        record.status, record.error = status, error
        record.completion_tokens = len(entry.request.output_token_ids) or None
        record.usage_completion_tokens = record.completion_tokens if status == "ok" else None
        record.prompt_tokens = entry.request.prompt_len
        record.usage_prompt_tokens = record.prompt_tokens if status == "ok" else None
        record.chunks = record.completion_tokens or 0
        record.http_status = 200
        self.finish(record)

    # -- the clock ----------------------------------------------------------------------
    def step(self) -> bool:
        """One engine step from `now`; False when the engine had nothing to do."""
        self.arrive()
        result = self.core.step()
        if result is None:
            return False
        self.sample_until(self.now, result)
        # Stamped at its start, as the instrumentation and the real-time runner stamp a step.
        self.steps.write(encode_line(step_record(result, self.now)))
        end = self.now + int(result.cost.duration_us * 1000)
        self.now += int(result.cost.period_us * 1000)  # the step, then the engine loop's gap
        self.tokens["prompt"] += result.prefill_tokens
        self.tokens["generation"] += result.decode_tokens
        for out in result.outputs:
            index = self.by_request.get(id(out.request))
            if index is None:
                continue
            entry = self.in_flight[index]
            record = entry.record
            if record.t_first_token_ns is None:
                record.t_first_token_ns = end + entry.egress_first_ns
            record.t_last_token_ns = max(end + entry.egress_ns, record.t_first_token_ns)
            if out.finished:
                self.end_request(index, "ok", None)
        self.expire(self.now)
        return True

    def expire(self, t: int) -> None:
        """The request timeout, oldest send first (as the worker's per-request timer)."""
        limit = int(self.opts.timeout_s * _NS)
        while self.in_flight:
            index, entry = next(iter(self.in_flight.items()))
            if t - (entry.record.t_send_ns or t) < limit:
                return
            self.end_request(index, "timeout", f"timeout after {self.opts.timeout_s:g} s")

    def sample_until(self, t: int, result: StepResult | None) -> None:
        """The /metrics scrapes due by `t`, reading the queues as the scheduler left them."""
        while self.next_sample <= t:
            running = result.num_running if result else len(self.core.running)
            waiting = result.num_waiting if result else len(self.core.waiting)
            usage = result.kv_cache_usage if result else 0.0
            line = {
                "t_ns": self.next_sample,
                "vllm:num_requests_running": running,
                "vllm:num_requests_waiting": waiting,
                "vllm:kv_cache_usage_perc": round(usage, 6),
                "vllm:prompt_tokens_total": self.tokens["prompt"],
                "vllm:generation_tokens_total": self.tokens["generation"],
                self.cache_info: 1.0,
            }
            self.metrics.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.waiting.append((self.next_sample / _NS, float(waiting)))
            self.next_sample += self.interval_ns

    def advance_idle(self, t: int) -> None:
        """The engine is idle until `t`: the scrapes in between, then the clock."""
        self.sample_until(t, None)
        self.now = max(self.now, t)

    def close(self) -> None:
        self.writer.close()
        self.steps.close()
        self.metrics.close()

    def run(self) -> CellSummary:
        """Run the cell to its end; its records and summary land in `files`. Returns the summary."""
        cell, opts = self.cell, self.opts
        wall0 = time.monotonic()
        try:
            seed = cell.seed if cell.seed is not None else opts.seed  # as loadgen.schedule.realtime
            schedule = arrivals(cell.arrival, cell.rate, seed, cell.gamma_shape, cell.num_requests)
            shapes = ShapeSampler(cell.shape, shape_seed(seed) if cell.seed is not None else seed)
            t_issue_end = self.t0
            for index, offset in enumerate(schedule):
                target = self.t0 + offset
                self.work_until(target)  # the engine works up to the next arrival
                self.advance_idle(target)
                if self.rules.done(target, self.completed_post):
                    t_issue_end = target
                    break
                pair = shapes.next()
                self.issue(index, target, pair.input, pair.output)
            drain_end = t_issue_end + int(self.rules.drain_budget_s() * _NS)
            while self.in_flight and self.now < drain_end:
                if not self.step():
                    arrival = self.next_arrival()
                    if arrival is None or arrival >= drain_end:
                        break
                    self.advance_idle(arrival)
            self.sample_until(self.now, None)
            for index in list(self.in_flight):
                self.end_request(index, "timeout", f"drain timeout after {self.rules.drain_budget_s():g} s")
        finally:
            self.close()
        summary = self.stats.summary(cell.describe(), self.rules.warm_end, t_issue_end, {}, opts.validity)
        summary.cell_id = f"{self.name}#virtual"
        summary.clock = "virtual"
        summary.wall_s = round((self.now - self.t0) / _NS, 3)
        summary.compute_s = round(time.monotonic() - wall0, 3)
        summary.drain_budget_s = round(self.rules.drain_budget_s(), 3)
        summary.extended = self.rules.extended(t_issue_end)
        summary.complete = True
        write_summary(self.files.summary, summary)
        return summary
