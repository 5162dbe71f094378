"""A cell's targets, when it drives several side by side (a duet): each target's share of the cell
(`Side`: its folder, its workers, its requests in flight, records and statistics, alike for every
target), and, in a closed loop, when a request's place in the gate frees (`Copies`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from connector_tax.contract.layout import CellFiles
from connector_tax.loadgen.stats.collect import Collector, Progress
from connector_tax.loadgen.stats.request_file import RecordWriter
from connector_tax.loadgen.stats.summarize import RequestStats


@dataclass(frozen=True)
class Side:
    """One target's share of a cell: its folder, its workers, its requests in flight, records and
    statistics. Every target of a cell has one, alike."""

    target: int
    files: CellFiles
    workers: range  # the pool's workers that serve this target
    writer: RecordWriter
    stats: RequestStats
    collector: Collector
    progress: Progress


class Copies:
    """Closed loop over several targets: a request's place in the gate frees once every target's
    copy has ended (answered, failed or dropped), so every target is sent the same requests at
    the same times, at the pace of the slowest. With one target: at once, as always."""

    def __init__(self, copies: int, release: Callable[[], None]) -> None:
        self.copies, self.release = copies, release
        self.left: dict[int, int] = {}
        self.lock = threading.Lock()

    def issued(self, index: int) -> None:
        with self.lock:
            self.left[index] = self.copies

    def ended(self, index: int) -> None:
        with self.lock:
            left = self.left.get(index)
            if left is None:
                return
            if left > 1:
                self.left[index] = left - 1
                return
            del self.left[index]
        self.release()
