"""A benchmark session: one worker pool and its CPU-latency hold, many cells in a row (a rate sweep
or a shape sweep); each cell runs on the calling thread (realtime.py), against one target (the
server at `url`: `run_cell`) or several side by side (`other_urls` too: `run_duet_cell`, a cell
of its own per target, each in its own folder). Text and chat prompts are
sized by the server's tokenizer once, before the workers start (sizing.py): the server must be up.
Token-id prompts need nothing from the server, so a session of them may start while it boots
(`needs_server`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
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
            urls=options.urls,
            body=body,
            workers_per_target=options.workers,
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
            target_cpus=options.target_cpus,
        )
        self.cpu_latency = CpuLatencyHold(options.cpu_latency_us)
        self.stop_event = threading.Event()
        self.progresses = [Progress() for _ in options.urls]  # the running cell's, per target

    @property
    def progress(self) -> Progress:
        """The running cell's progress on target 0 (the only one, but in a duet)."""
        return self.progresses[0]

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
        if len(self.options.urls) != 1:
            raise ValueError(f"out_dir: this generator drives {len(self.options.urls)} targets: run_duet_cell")
        return self.run_duet_cell(cell, [Path(out_dir)], enough, give_up)[0]

    def run_duet_cell(
        self,
        cell: Cell,
        out_dirs: Sequence[Path],
        enough: Callable[[], bool] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> list[CellSummary]:
        """Run one cell against every target at once, target t's records and summary into
        `out_dirs[t]` as a cell of its own: the same requests at the same scheduled times to each.
        The cell ends by its rules as a whole (min-completed: on every target); `enough` and
        `give_up` as in run_cell. One summary per target, target 0 first."""
        dirs = [Path(d) for d in out_dirs]
        if len(dirs) != len(self.options.urls):
            raise ValueError(f"out_dirs: {len(dirs)} folders for {len(self.options.urls)} targets (one per target)")
        if len({d.resolve() for d in dirs}) != len(dirs):
            raise ValueError(f"out_dirs: a folder given twice ({', '.join(map(str, dirs))}): one per target")
        self.check_cell(cell)
        self.stop_event.clear()
        self.progresses = [Progress() for _ in dirs]
        session = Session(
            self.options, self.pool, self.progresses, self.stop_event, self.cpu_latency, self.body, self.sizing
        )
        return RealTimeRun(session, cell, dirs, enough, give_up).run()
