"""A benchmark session: one worker pool and its CPU-latency hold, many cells in a row (a rate sweep
or a shape sweep); each cell runs on the calling thread (realtime.py). Text and chat prompts are
sized by the server's tokenizer once, before the workers start (sizing.py): the server must be up.
Token-id prompts need nothing from the server, so a session of them may start while it boots
(`needs_server`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

from connector_tax.config.cells import Cell
from connector_tax.contract.summary import CellSummary
from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold
from connector_tax.loadgen.schedule.options import LoadgenOptions, check_cell
from connector_tax.loadgen.schedule.probe import Api
from connector_tax.loadgen.schedule.realtime import RealTimeRun, Session
from connector_tax.loadgen.schedule.shapes import ShapeSampler
from connector_tax.loadgen.schedule.sizing import Sizing, size_prompts
from connector_tax.loadgen.schedule.workers import WorkerPool
from connector_tax.loadgen.stats.collect import Progress
from connector_tax.loadgen.worker.prompts import BodySettings

__all__ = ["LoadGenerator", "LoadgenOptions", "Progress"]


def _body(options: LoadgenOptions) -> BodySettings:
    return BodySettings(
        model=options.model,
        endpoint=options.endpoint,
        prompt=options.prompt,
        temperature=options.temperature,
        ignore_eos=options.ignore_eos,
    )


def needs_server(options: LoadgenOptions) -> bool:
    """Does building a LoadGenerator of `options` ask the server (text prompts are sized on it)?"""
    return _body(options).sends_text


class LoadGenerator:
    def __init__(self, options: LoadgenOptions) -> None:
        options.check()
        self.options = options
        body = _body(options)
        self.sizing: Sizing | None = None
        if body.sends_text:  # ServerProblem / ValueError in one line when it cannot be done
            with Api(options) as api:
                self.sizing = size_prompts(api, body, options.tokenizer, options.seed)
            body = dataclasses.replace(body, text=self.sizing.layout)
        self.body = body
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
            api_key_env=options.api_key_env,
            tls_verify=options.tls_verify,
            tls_ca_file=options.tls_ca_file,
            rt_priority=options.rt_priority,
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

    def check_cell(self, cell: Cell) -> None:
        """ValueError naming the field: what the load generator cannot send of this cell, on this
        server (a text prompt shorter than what its lead and chat template cost there)."""
        check_cell(cell)
        if self.sizing is None:
            return
        if cell.trace is not None:
            shortest = min((r.input_length for r in cell.trace), default=1)
        else:
            shortest = min(p.input for p in ShapeSampler(cell.shape, 0).pairs)
        base = self.sizing.layout.base_tokens
        if shortest <= base:
            field = "trace" if cell.trace is not None else "shape"
            raise ValueError(
                f"{field}: input {shortest} is not longer than the {base} tokens a text prompt starts with "
                f"on this server (its lead, special tokens and any chat template)"
            )

    def run_cell(
        self,
        cell: Cell,
        out_dir: Path,
        enough: Callable[[], bool] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> CellSummary:
        """Run one cell into `out_dir`. Past its duration floor, `enough` may hold the cell beyond
        min-completed, up to its max duration, until it says True; `give_up` ends it at once,
        min-completed or not (a shape the server cannot take). Both are called often: keep them cheap."""
        self.check_cell(cell)
        self.stop_event.clear()
        self.progress = Progress()
        session = Session(
            self.options, self.pool, self.progress, self.stop_event, self.cpu_latency, self.body, self.sizing
        )
        return RealTimeRun(session, cell, Path(out_dir), enough, give_up).run()
