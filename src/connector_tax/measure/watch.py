"""A real-time cell's watch: its progress on the console, and a stop when its server (or a sidecar
of it) dies or is stuck (the measuring loop seals such a cell as failed and relaunches the server)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from tqdm import tqdm

from connector_tax.loadgen.schedule.session import LoadGenerator, Progress
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.serving.server_process import ServerProcess

STALL_S = 30.0  # no answer and no engine work for this long, requests in flight: the server is stuck

PROGRESS_S = 5.0  # a progress line per cell this often, in the job's log and snakemake's console


class ServerWatch:
    """Stops the running cell when its server exits or is stuck; `failure` says why. Prints the
    cell's progress every PROGRESS_S (elapsed, sent, completed, errors, recent TTFT p50).

    Stuck: requests in flight, none answered (ok or error) for `stall_s`, and the engine's work
    counters on /metrics still for as long (or /metrics not answering). A long request that is
    still decoding moves the counters; a slow /metrics alone, with requests completing, is not a
    stuck server."""

    def __init__(
        self,
        server: ServerProcess,
        gen: LoadGenerator,
        sampler: MetricsSampler,
        name: str,
        stall_s: float = STALL_S,
        beside: Callable[[], str | None] = lambda: None,
    ) -> None:
        """beside(): why a process the server needs (a sidecar: serving/sidecar.py) has failed, or None."""
        self.server, self.gen, self.sampler, self.stall_s, self.name = server, gen, sampler, stall_s, name
        self.beside = beside
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-server-watch", daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _run(self) -> None:
        start = time.monotonic()
        answered, since, shown = -1, start, start
        # By hand in a terminal: a live bar; under snakemake (a pipe and a log): a line every PROGRESS_S.
        bar = tqdm(desc=self.name, unit="req", file=sys.stderr, leave=False) if sys.stderr.isatty() else None
        try:
            while not self._stop.wait(0.5):
                now = time.monotonic()
                progress = self.gen.progress
                if bar is not None:
                    self._show_bar(bar, progress)
                elif now - shown >= PROGRESS_S:
                    shown = now
                    print(f"  {self.name}: {now - start:.0f} s, {self._counts(progress)}", flush=True)
                if progress.completed + progress.errors != answered or progress.in_flight == 0:
                    answered, since = progress.completed + progress.errors, now
                if self._check(progress, start, now, since):
                    return
        finally:
            if bar is not None:
                bar.close()

    @staticmethod
    def _counts(progress: Progress) -> str:
        ttft = progress.ttft_p50_ms()
        return (
            f"sent {progress.issued}, completed {progress.completed}, errors {progress.errors}, "
            f"in flight {progress.in_flight}" + (f", TTFT p50 {ttft:.1f} ms" if ttft is not None else "")
        )

    @staticmethod
    def _show_bar(bar: tqdm, progress: Progress) -> None:
        bar.n = progress.completed
        ttft = progress.ttft_p50_ms()
        bar.set_postfix_str(
            f"sent {progress.issued}, in flight {progress.in_flight}, errors {progress.errors}"
            + (f", TTFT p50 {ttft:.1f} ms" if ttft is not None else ""),
            refresh=True,
        )

    def _check(self, progress: Progress, start: float, now: float, since: float) -> bool:
        """Set `failure` and stop the cell when the server exited or is stuck."""
        worked = max(self.sampler.last_work or start, start)
        code = self.server.exited()
        if code is not None:
            self.failure = f"server exited with code {code} during the cell"
        elif (why := self.beside()) is not None:
            self.failure = f"{why} during the cell"
        elif now - since > self.stall_s and now - worked > self.stall_s:
            self.failure = (
                f"server stuck: no response and no engine work for {self.stall_s:g} s "
                f"with {progress.in_flight} requests in flight"
            )
        if self.failure:
            self.gen.stop()
            return True
        return False
